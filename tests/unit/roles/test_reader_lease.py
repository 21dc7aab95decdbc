"""A reader with ``lease`` (``mxref.roles.lease``) against fakes: each attempt takes a lease of its
own, its manifest is the one checked and read from, the READ names it, it is given back however the
attempt ends, and no READ is posted without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures.reader_world import NO_HANDSHAKE, STALL, Harness, World, make_fetch_manifest, order_for_selector

from mxref.roles.lease import Lease, LeaseHolder, LeaseRefused
from mxref.roles.reader import Reader
from mxref.v1 import p2p_pb2


class Grants:
    """The sources' side of the leases: who was granted what, what came back; per worker, a refusal."""

    def __init__(self, world: World) -> None:
        self.manifest = make_fetch_manifest(world)
        self.granted: list[tuple[str, str]] = []  # (worker id, lease id)
        self.released: list[str] = []
        self.refuse: dict[str, grpc.StatusCode] = {}
        self.release_error: LeaseRefused | None = None
        self.tamper: dict[str, str] = {}  # worker id -> checksum its lease's manifest claims for every tensor

    def prepare(self, endpoint: str, mx_source_id: str, worker_id: str, timeout_s: float) -> Lease:
        if worker_id in self.refuse:
            code = self.refuse[worker_id]
            raise LeaseRefused(f"PrepareTensorRead at {endpoint}: {code.name}: draining", code)
        manifest: p2p_pb2.GetTensorManifestResponse = self.manifest(endpoint, mx_source_id, worker_id, timeout_s)
        for t in manifest.tensors:
            t.checksum = self.tamper.get(worker_id, t.checksum)
        lease = Lease(f"L{len(self.granted) + 1}", endpoint, mx_source_id, worker_id, manifest)
        self.granted.append((worker_id, lease.lease_id))
        return lease

    def release(self, lease: Lease, timeout_s: float) -> None:
        if self.release_error is not None:
            raise self.release_error
        self.released.append(lease.lease_id)


def two_sources(world: World, h: Harness, grants: Grants) -> tuple[Reader, str, str]:
    """Sources a and b, and a leased reader: (the reader, the worker it tries first, the second)."""
    world.add("a")
    world.add("b")
    reader = leased(h, grants)
    first, second = order_for_selector(reader, world)
    return reader, first, second


@pytest.fixture
def grants(world: World) -> Grants:
    return Grants(world)


def leased(h: Harness, grants: Grants, **options: Any) -> Reader:
    reader = h.make(lease=True, **options)
    reader.leases = LeaseHolder(reader.events, 1.0, prepare=grants.prepare, release=grants.release)
    return reader


def test_a_leased_read_names_its_lease_and_gives_it_back(world: World, h: Harness, grants: Grants) -> None:
    world.add("a")
    result = leased(h, grants).load()
    assert result.ok and result.path == "rdma"
    assert grants.granted == [("a", "L1")] and grants.released == ["L1"]
    assert world.manifest_calls == ["a"]  # the lease's manifest, once: no GetTensorManifest besides
    names = [e["event"] for e in h.events() if e["event"] in ("lease_acquired", "transfer_start", "lease_released")]
    assert names == ["lease_acquired", "transfer_start", "lease_released"]
    assert h.events("transfer_start")[0]["lease_id"] == "L1"
    assert h.events("lease_released")[0] == {**h.events("lease_released")[0], "ok": True, "lease_id": "L1"}


def test_the_leases_manifest_is_the_one_checked(world: World, h: Harness, grants: Grants) -> None:
    world.add("a")
    grants.tamper["a"] = "0" * 16
    result = leased(h, grants).load()
    assert not result.ok and h.outcomes() == [("a", "reference_mismatch")]
    assert h.events("transfer_start") == [] and grants.released == ["L1"]


def test_a_refused_lease_means_no_read_and_the_next_candidate_takes_its_own(world: World, h: Harness,
                                                                           grants: Grants) -> None:
    reader, first, second = two_sources(world, h, grants)
    grants.refuse[first] = grpc.StatusCode.UNAVAILABLE
    assert reader.load().worker_id == second
    assert h.outcomes() == [(first, "lease_refused"), (second, "success")]
    refused = h.events("lease_refused")[0]
    assert (refused["worker_id"], refused["code"]) == (first, "UNAVAILABLE")
    assert [e["lease_id"] for e in h.events("transfer_start")] == ["L1"] and grants.granted == [(second, "L1")]
    assert h.attempts("lease_refused") == 1


def test_a_retry_after_a_failed_read_takes_a_fresh_lease(world: World, h: Harness, grants: Grants) -> None:
    reader, first, second = two_sources(world, h, grants)
    world.by_worker(first).behaviour = STALL
    assert reader.load().worker_id == second
    assert grants.granted == [(first, "L1"), (second, "L2")]
    assert grants.released == ["L1", "L2"]  # the stalled attempt's lease too, before the retry
    assert [e["lease_id"] for e in h.events("transfer_start")] == ["L1", "L2"]
    order = [(e["event"], e.get("lease_id")) for e in h.events() if e["event"].startswith("lease_")]
    assert order == [("lease_acquired", "L1"), ("lease_released", "L1"), ("lease_acquired", "L2"),
                     ("lease_released", "L2")]


def test_a_central_source_grants_no_lease_so_it_is_never_read(world: World, h: Harness, grants: Grants,
                                                              checkpoint: Path) -> None:
    world.add("a", mode="central")
    result = leased(h, grants, checkpoint=checkpoint).load()
    assert result.ok and result.path == "disk"
    assert h.outcomes() == [("a", "lease_refused")] and h.events("transfer_start") == []
    assert "central mode" in h.events("lease_refused")[0]["error"]


def test_a_release_the_source_refuses_is_reported_and_the_load_stands(world: World, h: Harness,
                                                                      grants: Grants) -> None:
    world.add("a")
    grants.release_error = LeaseRefused("ReleaseTensorRead: NOT_FOUND: expired", grpc.StatusCode.NOT_FOUND)
    assert leased(h, grants).load().ok
    released = h.events("lease_released")[0]
    assert released["ok"] is False and "NOT_FOUND" in released["error"]


def test_without_a_lease_held_no_read_is_posted(h: Harness) -> None:
    holder = LeaseHolder(h.make().events, 1.0)
    with pytest.raises(LeaseRefused, match="no READ is posted without one"):
        holder.lease_for_read()
    holder.release(0)  # nothing held: nothing to give back, nothing said
    assert h.events("lease_released") == []


def test_the_option_makes_the_holder(h: Harness) -> None:
    assert h.make().leases is None
    reader = h.make(lease=True)
    assert reader.leases is not None and reader.leases.timeout_s == reader.options.manifest_timeout_s


def test_a_retry_after_a_failure_before_the_read_takes_and_checks_a_fresh_lease(world: World, h: Harness,
                                                                               grants: Grants) -> None:
    reader, first, second = two_sources(world, h, grants)
    world.by_worker(first).behaviour = NO_HANDSHAKE
    grants.tamper[second] = "0" * 16  # the retry's lease comes with a manifest of its own: it is checked
    result = reader.load()
    assert not result.ok and h.outcomes() == [(first, "transfer_retry"), (second, "reference_mismatch")]
    assert grants.granted == [(first, "L1"), (second, "L2")] and grants.released == ["L1", "L2"]
    assert h.events("transfer_start") == []  # neither attempt reached a READ
