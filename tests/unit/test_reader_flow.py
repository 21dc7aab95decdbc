"""The reader's load flow (docs/contract.md#load-strategy) against fakes: no server, no NIXL, no sockets.

The metadata server (``MxClient``) and the source's WorkerService
(``fetch_tensor_manifest``) are replaced by a scripted ``World``. The NIXL
manager is the *real* ``NixlTransferManager`` whose ``create_agent`` installs a
``FakeAgent`` instead of a NIXL agent, so peer tracking, release, rollback and
the health carry-over run the production code. A source in the world serves the
deterministic bytes of ``SPEC`` (the same bytes the disk checkpoint holds) and
misbehaves as its ``behaviour`` says.
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import xxhash

import mxref.roles.reader as reader_mod
from mxref.errors import ManifestError, MetadataServerError, WorkerIdMismatch
from mxref.events import EventLog
from mxref.metrics import ReaderMetrics
from mxref.model import Arena, ModelSpec, Reference, generate, save_checkpoint
from mxref.roles.reader import Reader, ReaderOptions
from mxref.roles.selection import Target
from mxref.roles.source import identity_for
from mxref.transfer.chunked import ChunkPolicy
from mxref.transfer.manager import NixlTransferManager
from mxref.v1 import p2p_pb2

SPEC = ModelSpec(name="mxref/unit", tensors=3, tensor_bytes=2048, dtype="float16", seed=7)
SID = "0123456789abcdef"
REMOTE_BASE = 0x7F00_0000_0000  # fake source addresses; never dereferenced

# behaviours of a fake source
OK = "ok"
STALL = "stall"  # the READ stays PROC (a frozen source)
DISCONNECT = "disconnect"  # check_xfer_state raises, as NIXL 1.5.1 does for a dead peer
CORRUPT = "corrupt"  # DONE, but the bytes are not the published ones
NO_HANDSHAKE = "no_handshake"  # its metadata never arrives
LATE_HANDSHAKE = "late_handshake"  # never arrives within the budget, but the fetch reached it


def _source_bytes() -> list[bytes]:
    arena = generate(SPEC)
    data = [arena.raw(i).tobytes() for i in range(len(arena.specs))]
    arena.release()
    return data


SOURCE_BYTES = _source_bytes()
OTHER_SPEC = ModelSpec(name=SPEC.name, tensors=SPEC.tensors, tensor_bytes=SPEC.tensor_bytes, dtype=SPEC.dtype, seed=8)
OTHER_BYTES = [generate(OTHER_SPEC).raw(i).tobytes() for i in range(SPEC.tensors)]  # wrong bytes, same layout
OTHER_SUMS = [xxhash.xxh3_64_hexdigest(b) for b in OTHER_BYTES]
SOURCE_SUMS = generate(SPEC).checksums()
REFERENCE = Reference.from_spec(SPEC)  # the reader's own: what it was told the model is


@dataclass
class FakeSource:
    worker_id: str
    agent_name: str
    behaviour: str = OK
    worker_rank: int = 0
    accelerator: str = "cpu"  # what ListSources says
    metadata_accelerator: str | None = None  # what GetMetadata says (default: same)
    metadata: str = "found"  # found | not_found | rpc_error
    manifest: str = "ok"  # ok | refused | worker_mismatch
    mode: str = "p2p"  # p2p | central
    index: int = 0
    served: list[bytes] | None = None  # the bytes it holds (default: the reference's)
    manifest_sums: list[str] | None = None  # the checksums it publishes (default: the reference's)

    def ref(self) -> p2p_pb2.SourceInstanceRef:
        return p2p_pb2.SourceInstanceRef(mx_source_id=SID, worker_id=self.worker_id, model_name=SPEC.name,
                                         worker_rank=self.worker_rank, accelerator=self.accelerator,
                                         status=p2p_pb2.SOURCE_STATUS_READY)

    def descriptors(self) -> list[p2p_pb2.TensorDescriptor]:
        return [
            p2p_pb2.TensorDescriptor(name=s.name, addr=REMOTE_BASE + (self.index << 24) + i * 4096, size=s.nbytes,
                                     device_id=0, dtype=s.dtype, shape=list(s.shape),
                                     checksum=(SOURCE_SUMS if self.manifest_sums is None else self.manifest_sums)[i])
            for i, s in enumerate(SPEC.tensor_specs())
        ]

    @property
    def listener(self) -> tuple[str, int]:
        return "127.0.0.1", 20000 + self.index


@dataclass
class World:
    sources: list[FakeSource] = field(default_factory=list)
    list_error: bool = False
    managers: list[RecordingManager] = field(default_factory=list)
    metadata_calls: list[str] = field(default_factory=list)
    manifest_calls: list[str] = field(default_factory=list)

    def add(self, worker_id: str, **kw: Any) -> FakeSource:
        src = FakeSource(worker_id=worker_id, agent_name=f"agent-{worker_id}", index=len(self.sources), **kw)
        self.sources.append(src)
        return src

    def by_worker(self, worker_id: str) -> FakeSource:
        return next(s for s in self.sources if s.worker_id == worker_id)

    def by_agent(self, name: str) -> FakeSource:
        return next(s for s in self.sources if s.agent_name == name)

    def agent_calls(self) -> list[tuple[str, ...]]:
        return [c for m in self.managers for c in m.fake.calls]


class FakeClient:
    def __init__(self, world: World) -> None:
        self.world = world

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def list_sources(self, identity: Any = None, status_filter: Any = None, **kw: Any) -> list[p2p_pb2.SourceInstanceRef]:
        if self.world.list_error:
            raise MetadataServerError("ListSources failed: UNAVAILABLE", "ListSources", grpc.StatusCode.UNAVAILABLE)
        return [s.ref() for s in self.world.sources]

    def get_metadata(self, mx_source_id: str, worker_id: str) -> p2p_pb2.GetMetadataResponse:
        self.world.metadata_calls.append(worker_id)
        src = self.world.by_worker(worker_id)
        if src.metadata == "rpc_error":
            raise MetadataServerError("GetMetadata failed: UNAVAILABLE", "GetMetadata", grpc.StatusCode.UNAVAILABLE)
        if src.metadata == "not_found":
            return p2p_pb2.GetMetadataResponse(found=False)
        worker = p2p_pb2.WorkerMetadata(
            worker_rank=src.worker_rank, agent_name=src.agent_name,
            accelerator=src.accelerator if src.metadata_accelerator is None else src.metadata_accelerator,
            status=p2p_pb2.SOURCE_STATUS_READY,
        )
        if src.mode == "p2p":
            host, port = src.listener
            worker.metadata_endpoint = f"{host}:{port}"
            worker.worker_grpc_endpoint = f"127.0.0.1:{30000 + src.index}"
        else:
            worker.nixl_metadata = f"md:{src.agent_name}".encode()
            worker.tensor_source.tensors.extend(src.descriptors())
        return p2p_pb2.GetMetadataResponse(found=True, worker=worker, mx_source_id=mx_source_id, worker_id=worker_id)


def make_fetch_manifest(world: World):  # type: ignore[no-untyped-def]
    def fetch(endpoint: str, mx_source_id: str, worker_id: str, timeout_s: float = 5.0) -> p2p_pb2.GetTensorManifestResponse:
        world.manifest_calls.append(worker_id)
        src = world.by_worker(worker_id)
        if src.manifest == "refused":
            raise ManifestError(f"GetTensorManifest from {endpoint} refused: UNAVAILABLE: draining",
                                grpc.StatusCode.UNAVAILABLE)
        if src.manifest == "worker_mismatch":
            raise WorkerIdMismatch(f"GetTensorManifest from {endpoint} answered as worker 'other'",
                                   requested=worker_id, actual="other")
        host, port = src.listener
        return p2p_pb2.GetTensorManifestResponse(
            tensors=src.descriptors(), mx_source_id=mx_source_id, metadata_endpoint=f"{host}:{port}",
            agent_name=src.agent_name, worker_rank=src.worker_rank, accelerator=src.accelerator, worker_id=worker_id,
        )

    return fetch


class FakeAgent:
    """Enough of a NIXL 1.5.1 agent for the reader path; records every lifecycle call."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.calls: list[tuple[str, ...]] = []
        self.loaded: set[str] = set()
        self.handles: dict[int, tuple[str, np.ndarray, np.ndarray]] = {}
        self.dlists: dict[int, tuple[str, np.ndarray]] = {}  # prepared descriptor lists

    def get_agent_metadata(self) -> bytes:
        return f"md:{self.name}".encode()

    def register_memory(self, descs: np.ndarray, mem_type: str) -> object:
        self.calls.append(("register", self.name))
        return ("reg", self.name)

    def deregister_memory(self, reg: object) -> None:
        self.calls.append(("deregister", self.name))

    def fetch_remote_metadata(self, name: str, ip: str, port: int) -> None:
        self.calls.append(("fetch", name))
        if self.world.by_agent(name).behaviour not in (NO_HANDSHAKE, LATE_HANDSHAKE):
            self.loaded.add(name)

    def check_remote_metadata(self, name: str) -> bool:
        return name in self.loaded

    def add_remote_agent(self, blob: bytes) -> bytes:
        name = blob.decode().removeprefix("md:")
        self.calls.append(("add", name))
        self.loaded.add(name)
        return name.encode()

    def remove_remote_agent(self, name: str) -> None:
        self.calls.append(("remove", name))
        self.loaded.discard(name)

    def invalidate_local_metadata(self, ip: str, port: int) -> None:
        self.calls.append(("invalidate", f"{ip}:{port}"))

    def get_xfer_descs(self, descs: np.ndarray, mem_type: str) -> np.ndarray:
        return descs

    def initialize_xfer(self, op: str, local: np.ndarray, remote: np.ndarray, name: str) -> int:
        if name not in self.loaded:
            raise RuntimeError(f"nixlNotFoundError: remote agent {name!r} is not loaded")
        handle = len(self.handles) + 1
        self.handles[handle] = (name, local, remote)
        return handle

    def prep_xfer_dlist(self, name: str, descs: np.ndarray, mem_type: str) -> int:
        if name != "NIXL_INIT_AGENT" and name not in self.loaded:
            raise RuntimeError(f"nixlNotFoundError: remote agent {name!r} is not loaded")
        self.dlists[len(self.dlists) + 1] = (name, descs)
        return len(self.dlists)

    def make_prepped_xfer(self, op: str, local_side: int, local_idx: list[int], remote_side: int,
                          remote_idx: list[int]) -> int:
        name, remote = self.dlists[remote_side]
        if name not in self.loaded:
            raise RuntimeError(f"nixlNotFoundError: remote agent {name!r} is not loaded")
        handle = len(self.handles) + 1
        self.handles[handle] = (name, self.dlists[local_side][1][local_idx], remote[remote_idx])
        return handle

    def release_dlist_handle(self, handle: int) -> None:
        self.calls.append(("release_dlist", self.dlists[handle][0]))

    def transfer(self, handle: int) -> str:
        self.calls.append(("transfer", self.handles[handle][0]))
        return "PROC"

    def check_xfer_state(self, handle: int) -> str:
        name, local, remote = self.handles[handle]
        src = self.world.by_agent(name)
        if src.behaviour == STALL:
            return "PROC"
        if src.behaviour == DISCONNECT:
            raise RuntimeError("nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT")
        descs = src.descriptors()
        for (laddr, size, _), (raddr, _rsize, _) in zip(local.tolist(), remote.tolist()):
            i = next(i for i, d in enumerate(descs) if d.addr <= raddr < d.addr + d.size)  # a chunk may split a tensor
            offset = raddr - descs[i].addr
            data = (SOURCE_BYTES if src.served is None else src.served)[i][offset:offset + size]
            if src.behaviour == CORRUPT:
                data = bytes(len(data))
            ctypes.memmove(laddr, data, size)
        return "DONE"

    def release_xfer_handle(self, handle: int) -> None:
        self.calls.append(("release_xfer", self.handles[handle][0]))


class RecordingManager(NixlTransferManager):
    """The real manager over a FakeAgent; remembers what it was created with and whether it was shut down."""

    world: World  # set per test by the fixture

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.initial_error = kw.get("initial_error")
        self.fake = FakeAgent(self.world, self.agent_name)
        self.shut_down = False
        self.world.managers.append(self)

    def create_agent(self, listen_port: int, progress_thread: bool) -> None:
        self._agent = self.fake
        self._listen_port = listen_port
        self._metadata = self.fake.get_agent_metadata()
        self._atexit_registered = False  # no process-exit hook from unit tests

    def shutdown(self) -> None:
        self.fake.calls.append(("shutdown", self.agent_name))
        self.shut_down = True
        super().shutdown()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    w = World()
    manager_cls = type("WorldManager", (RecordingManager,), {"world": w})
    monkeypatch.setattr(reader_mod, "MxClient", lambda address, *a, **kw: FakeClient(w))
    monkeypatch.setattr(reader_mod, "fetch_tensor_manifest", make_fetch_manifest(w))
    monkeypatch.setattr(reader_mod, "NixlTransferManager", manager_cls)
    return w


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "ck.safetensors"
    arena = generate(SPEC)
    save_checkpoint(arena, path, SPEC)
    arena.release()
    return path


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.events_path = tmp_path / "reader.jsonl"
        self.metrics = ReaderMetrics()
        self.reader: Reader | None = None

    def make(self, **options: Any) -> Reader:
        opts: dict[str, Any] = dict(server="127.0.0.1:1", transfer_timeout_s=0.05, handshake_timeout_s=0.05,
                                    name="rd", selector="rendezvous_hash", prestart=False)
        opts.update(options)
        self.reader = Reader(ReaderOptions(**opts), REFERENCE, identity_for(SPEC.name, SPEC.dtype, revision=REFERENCE.digest),
                             EventLog(self.events_path, "rd", "reader"), self.metrics)
        return self.reader

    def load(self, **options: Any) -> reader_mod.LoadResult:
        return self.make(**options).load()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        records = [json.loads(line) for line in self.events_path.read_text().splitlines()]
        return [r for r in records if name is None or r["event"] == name]

    def outcomes(self) -> list[tuple[str, str]]:
        return [(e["worker_id"], e["outcome"]) for e in self.events("attempt_outcome")]

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def attempts(self, result: str) -> float:
        policy = self.reader.policy if self.reader else "rendezvous_hash"
        return self.sample("mx_p2p_source_attempts_total", policy=policy, result=result)


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def tried(h: Harness) -> list[str]:
    return [e["worker_id"] for e in h.events("attempt_start")]


def loaded_arena(h: Harness) -> Arena:
    """The arena of the harness's last reader, which must have loaded."""
    assert h.reader is not None and h.reader.arena is not None
    return h.reader.arena


class FixedOrder:
    """A selector that tries the candidates in a given order of worker ids."""

    name = "fixed"

    def __init__(self, worker_ids: list[str]) -> None:
        self.worker_ids = worker_ids

    def order(self, candidates: Sequence[p2p_pb2.SourceInstanceRef], target: Target) -> list[p2p_pb2.SourceInstanceRef]:
        return sorted(candidates, key=lambda c: self.worker_ids.index(c.worker_id))


def order_for(h: Harness) -> list[str]:
    """The order the reader's selector put the eligible sources in (read from its event)."""
    order: list[str] = h.events("candidates")[0]["order"]
    return order


# ----------------------------------------------------------------------------- candidates


class TestCandidates:
    def test_a_good_source_loads_over_rdma_verified(self, world: World, h: Harness) -> None:
        world.add("w1")
        result = h.load()
        assert (result.ok, result.path, result.integrity) == (True, "rdma", "verified")
        assert result.source == "agent-w1" and result.worker_id == "w1" and result.mx_source_id == SID
        assert result.bytes == SPEC.total_bytes and result.tensors == SPEC.tensors
        assert h.outcomes() == [("w1", "success")]
        assert h.events("integrity")[-1]["ok"] is True
        assert h.events("load_done")[0]["path"] == "rdma"
        # the bytes really are the source's
        arena = loaded_arena(h)
        assert [arena.raw(i).tobytes() for i in range(len(arena.specs))] == SOURCE_BYTES

    def test_rank_and_accelerator_filters_run_before_the_selector_and_the_cap(self, world: World, h: Harness) -> None:
        for i in range(3):
            world.add(f"other-rank-{i}", worker_rank=1)
        for i in range(3):
            world.add(f"gpu-{i}", accelerator="cuda")
        world.add("good")
        world.add("unknown-accel", accelerator="")  # empty = unknown: accepted, checked again later
        reader = h.make()
        seen: list[list[str]] = []
        real_order = reader.selector.order

        def spy(cands, target):  # type: ignore[no-untyped-def]
            seen.append([c.worker_id for c in cands])
            return real_order(cands, target)

        reader.selector.order = spy  # type: ignore[method-assign]
        result = reader.load()
        assert seen == [["good", "unknown-accel"]]
        assert result.ok and result.path == "rdma"
        assert set(tried(h)) <= {"good", "unknown-accel"}
        ev = h.events("candidates")[0]
        assert (ev["listed"], ev["rank_matched"], ev["accelerator_matched"]) == (8, 5, 2)

    def test_a_compatible_source_listed_last_is_never_pushed_past_the_cap(self, world: World, h: Harness) -> None:
        for i in range(5):
            world.add(f"gpu-{i}", accelerator="cuda")
        world.add("good")
        result = h.load(selector="random", selector_seed=1)
        assert result.ok and result.worker_id == "good"
        assert tried(h) == ["good"]

    def test_at_most_three_candidates_are_tried(self, world: World, h: Harness, checkpoint: Path) -> None:
        for i in range(5):
            world.add(f"w{i}", metadata="not_found")
        result = h.load(checkpoint=checkpoint)
        assert len(world.metadata_calls) == 3
        assert tried(h) == order_for(h)[:3]
        assert [o for _, o in h.outcomes()] == ["metadata_miss"] * 3
        assert result.path == "disk" and result.ok

    def test_accelerator_mismatch_found_in_metadata_skips_without_an_attempt_metric(
        self, world: World, h: Harness
    ) -> None:
        world.add("liar", accelerator="", metadata_accelerator="cuda")
        result = h.load()
        assert h.outcomes() == [("liar", "skipped")]
        assert not world.managers, "no target was prepared for an incompatible source"
        assert h.attempts("skipped") == 0
        assert result.path == "none" and not result.ok


# ----------------------------------------------------------------------------- metadata misses


class TestMetadataMiss:
    @pytest.mark.parametrize(
        "kind, failure_counted",
        [
            (dict(metadata="not_found"), False),
            (dict(metadata="rpc_error"), True),
            (dict(manifest="refused"), True),
            (dict(manifest="worker_mismatch"), True),
        ],
        ids=["not_found", "rpc_error", "manifest_refused", "worker_id_mismatch"],
    )
    def test_a_miss_costs_a_candidate_and_the_next_one_loads(
        self, world: World, h: Harness, kind: dict[str, str], failure_counted: bool
    ) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        first = order_for_selector(reader, world)[0]
        for k, v in kind.items():
            setattr(world.by_worker(first), k, v)
        result = reader.load()
        second = next(s.worker_id for s in world.sources if s.worker_id != first)
        assert h.outcomes() == [(first, "metadata_miss"), (second, "success")]
        assert result.ok and result.worker_id == second
        assert h.attempts("metadata_miss") == 1 and h.attempts("success") == 1
        failures = h.sample("mx_p2p_metadata_lookup_failures_total", policy=reader.policy)
        assert failures == (1 if failure_counted else 0)
        assert len(world.managers) == 1, "a metadata miss prepares no target"

    def test_a_worker_id_mismatch_never_transfers_from_the_reused_endpoint(self, world: World, h: Harness) -> None:
        world.add("only", manifest="worker_mismatch")
        result = h.load()
        assert not result.ok and result.path == "none"
        assert world.managers == []
        assert "WorkerIdMismatch" in (result.attempts[0].error or "")


def order_for_selector(reader: Reader, world: World) -> list[str]:
    from mxref.roles.selection import Target

    target = Target(reader.identity.model_name, reader.worker_id, reader.options.worker_rank)
    return [r.worker_id for r in reader.selector.order([s.ref() for s in world.sources], target)]


# ----------------------------------------------------------------------------- transfer failures


class TestTransferFailures:
    @pytest.mark.parametrize("behaviour", [STALL, DISCONNECT])
    def test_retry_on_a_non_last_candidate_then_success(self, world: World, h: Harness, behaviour: str) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        first, second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = behaviour
        result = reader.load()
        assert h.outcomes() == [(first, "transfer_retry"), (second, "success")]
        assert result.ok and result.worker_id == second
        assert h.attempts("transfer_retry") == 1 and h.attempts("success") == 1
        assert h.attempts("transfer_fallback") == 0
        if behaviour == STALL:
            ev = h.events("transfer_timeout")[0]
            assert ev["budget_s"] == 0.05 and 0.05 <= ev["seconds"] < 1.0
        else:
            assert "REMOTE_DISCONNECT" in h.events("transfer_error")[0]["error"]

    def test_by_default_a_stall_is_seen_at_the_window_deadline_well_before_the_budget(self, world: World,
                                                                                      h: Harness) -> None:
        world.add("a")
        world.add("b")
        policy = ChunkPolicy(floor_bps=1e9, slack_s=0.05)  # first window ~0.05 s (a 6 KiB model), budget 30 s
        reader = h.make(transfer_timeout_s=30.0, chunks=policy)
        first, second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = STALL
        assert reader.load().worker_id == second
        ev = h.events("transfer_timeout")[0]
        first_window = policy.first_deadline(SPEC.tensors * SPEC.tensor_bytes)
        assert first_window < policy.stall_s
        assert ev["stalled"] is True and first_window <= ev["seconds"] < 10.0
        started = h.events("transfer_start")[0]
        assert (started["stall_s"], started["first_stall_s"]) == (round(policy.stall_s, 3), round(first_window, 3))
        assert any(c[0] == "release_dlist" for c in world.managers[0].fake.calls)

    def test_with_chunking_off_one_handle_waits_for_the_budget(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make(transfer_timeout_s=0.3, chunks=None)  # the seed's single READ handle
        first, second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = STALL
        assert reader.load().worker_id == second
        ev = h.events("transfer_timeout")[0]
        assert ev["stalled"] is False and ev["seconds"] >= 0.3
        assert h.events("transfer_start")[0]["chunk_bytes"] is None
        assert not any(c[0] == "release_dlist" for m in world.managers for c in m.fake.calls)

    def test_the_default_reader_reads_in_chunks(self) -> None:
        assert ReaderOptions(server="x:1").chunks == ChunkPolicy()
        assert ChunkPolicy().stall_s == pytest.approx(2 * 16 * (1 << 20) / 100e6 + 0.5)

    def test_the_prestarted_target_is_what_the_first_read_uses(self, world: World, h: Harness) -> None:
        world.add("a")
        result = h.load(prestart=True)
        assert result.ok and len(world.managers) == 1
        phases = {e["phase"]: e for e in h.events("load_phase")}
        assert {"list", "metadata", "wait_target", "allocate", "agent", "register", "handshake", "read", "release",
                "verify"} <= set(phases)
        assert phases["agent"]["overlapped"] is True and phases["read"]["overlapped"] is False
        done = h.events("load_done")[0]
        assert "agent" not in done["phases"] and done["phases"]["read"] == pytest.approx(phases["read"]["seconds"])

    def test_a_prestarted_target_nobody_reads_into_is_shut_down(self, world: World, h: Harness,
                                                                 checkpoint: Path) -> None:
        result = h.load(prestart=True, checkpoint=checkpoint)  # no source at all: disk
        assert result.path == "disk"
        assert len(world.managers) == 1 and world.managers[0].shut_down

    def test_after_a_metadata_miss_the_next_candidate_reads_into_the_prestarted_target(self, world: World,
                                                                                        h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make(prestart=True)
        first, second = order_for_selector(reader, world)
        world.by_worker(first).metadata = "not_found"
        result = reader.load()
        assert result.ok and result.worker_id == second
        assert len(world.managers) == 1, "never read into, so the head start is still fresh"
        assert h.events("target_region")[0]["index"] == 1

    def test_after_a_stall_the_next_attempt_gets_a_fresh_agent_and_memory(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make(prestart=True)
        first, _ = order_for_selector(reader, world)
        world.by_worker(first).behaviour = STALL
        assert reader.load().ok
        regions = h.events("target_region")
        assert [r["fresh"] for r in regions] == [True, True] and regions[0]["addr"] != regions[1]["addr"]
        assert len({m.agent_name for m in world.managers}) == 2 and world.managers[0].shut_down
        # the quiet READ got the second target prepared beside its deadline, not after it
        assert [e["index"] for e in h.events("target_prestart")] == [1]
        second = {e["phase"]: e for e in h.events("load_phase") if e["index"] == 1}
        assert second["agent"]["overlapped"] is True and "wait_target" in second
        # made before the stall, it still carries the stall: healthy again only once its READ succeeded
        assert [e["healthy"] for e in h.events("health")] == [False, True]

    def test_the_last_candidate_prepares_no_next_target(self, world: World, h: Harness, checkpoint: Path) -> None:
        world.add("a", behaviour=STALL)
        result = h.load(prestart=True, checkpoint=checkpoint)
        assert result.path == "disk" and not h.events("target_prestart")

    def test_fallback_label_on_the_last_candidate(self, world: World, h: Harness, checkpoint: Path) -> None:
        world.add("a", behaviour=DISCONNECT)
        world.add("b", behaviour=STALL)
        result = h.load(checkpoint=checkpoint)
        assert [o for _, o in h.outcomes()] == ["transfer_retry", "transfer_fallback"]
        assert h.attempts("transfer_retry") == 1 and h.attempts("transfer_fallback") == 1
        assert result.ok and result.path == "disk" and result.integrity == "verified"
        assert h.events("fallback")[0]["reason"] == "no source succeeded"

    def test_the_third_of_many_candidates_is_the_last(self, world: World, h: Harness) -> None:
        for i in range(5):
            world.add(f"w{i}", behaviour=DISCONNECT)
        h.load()
        assert [o for _, o in h.outcomes()] == ["transfer_retry", "transfer_retry", "transfer_fallback"]

    def test_each_candidate_gets_a_fresh_manager_and_the_failed_one_is_shut_down(
        self, world: World, h: Harness
    ) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        first, _second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = DISCONNECT
        reader.load()
        m1, m2 = world.managers
        assert m1.shut_down and m1._agent is None, "rollback shuts the failed manager down"
        assert not m2.shut_down and reader.manager is m2
        assert m1.agent_name != m2.agent_name, "a retry uses a new agent name"
        assert ("deregister", m1.agent_name) in m1.fake.calls
        assert reader.arena is not None and reader.arena.nbytes > 0
        reader.close()
        assert m2.shut_down and reader.manager is None

    def test_integrity_failure_moves_to_the_next_candidate(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        first, second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = CORRUPT
        result = reader.load()
        assert h.outcomes() == [(first, "integrity_mismatch"), (second, "success")]
        assert "IntegrityError" in (result.attempts[0].error or "")
        assert h.sample("mxref_reference_mismatches_total", stage="read") == 1
        assert [e["ok"] for e in h.events("integrity")] == [False, True]
        assert result.ok and result.integrity == "verified"
        assert world.managers[0].shut_down


# ----------------------------------------------------------------------------- release


class TestRelease:
    def test_released_after_success(self, world: World, h: Harness) -> None:
        world.add("a")
        h.load()
        calls = world.managers[0].fake.calls
        assert ("remove", "agent-a") in calls
        assert ("invalidate", "127.0.0.1:20000") in calls, "the source is told to drop our record"
        assert calls.index(("remove", "agent-a")) > calls.index(("release_xfer", "agent-a"))
        assert world.managers[0]._remote_agents == {}
        assert any(e["agent_name"] == "agent-a" for e in h.events("peer_disconnected"))

    def test_released_after_a_failed_transfer_before_rollback(self, world: World, h: Harness) -> None:
        world.add("a", behaviour=DISCONNECT)
        h.load()
        calls = world.managers[0].fake.calls
        assert ("remove", "agent-a") in calls
        assert calls.index(("remove", "agent-a")) < calls.index(("shutdown", world.managers[0].agent_name))

    @pytest.mark.parametrize("behaviour", [NO_HANDSHAKE, LATE_HANDSHAKE])
    def test_released_after_a_half_done_handshake(self, world: World, h: Harness, behaviour: str) -> None:
        """The name is claimed before the dial: metadata that lands after the timeout is still released."""
        world.add("a", behaviour=behaviour)
        result = h.load()
        calls = world.managers[0].fake.calls
        assert ("fetch", "agent-a") in calls
        assert ("remove", "agent-a") in calls
        assert ("transfer", "agent-a") not in calls
        assert h.events("handshake")[0]["ok"] is False
        assert h.outcomes() == [("a", "transfer_fallback")]
        assert "HandshakeTimeout" in (result.attempts[0].error or "")

    def test_released_in_centralized_mode(self, world: World, h: Harness) -> None:
        world.add("a", mode="central")
        result = h.load()
        assert result.ok and result.path == "rdma"
        calls = world.managers[0].fake.calls
        assert ("add", "agent-a") in calls and ("remove", "agent-a") in calls
        assert not [c for c in calls if c[0] == "invalidate"], "a blob-loaded peer has no listener to tell"
        assert world.manifest_calls == []

    def test_skip_release_leaves_the_source_connected(self, world: World, h: Harness) -> None:
        world.add("a")
        result = h.load(skip_release=True)
        assert result.ok
        calls = world.managers[0].fake.calls
        assert ("remove", "agent-a") not in calls
        assert not [c for c in calls if c[0] == "invalidate"]
        assert world.managers[0]._remote_agents == {"agent-a": ("127.0.0.1", 20000)}


# ----------------------------------------------------------------------------- health carry-over


class TestHealthCarryOver:
    def test_a_timeout_carries_to_the_next_manager_and_a_success_clears_it(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        first, _second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = STALL
        result = reader.load()
        m1, m2 = world.managers
        assert m1.initial_error is None
        assert m2.initial_error is not None and "timed out" in m2.initial_error
        assert result.ok
        assert m2.data_plane_error is None and m2.is_healthy()

    def test_the_error_survives_a_metadata_miss_in_between(self, world: World, h: Harness) -> None:
        for w in ("a", "b", "c"):
            world.add(w)
        reader = h.make()
        first, second, _third = order_for_selector(reader, world)
        world.by_worker(first).behaviour = DISCONNECT
        world.by_worker(second).metadata = "not_found"
        reader.load()
        _m1, m3 = world.managers
        assert "REMOTE_DISCONNECT" in (m3.initial_error or "")
        assert m3.is_healthy()

    def test_a_failed_handshake_keeps_the_earlier_error(self, world: World, h: Harness) -> None:
        for w in ("a", "b", "c"):
            world.add(w)
        reader = h.make()
        first, second, _third = order_for_selector(reader, world)
        world.by_worker(first).behaviour = STALL
        world.by_worker(second).behaviour = NO_HANDSHAKE
        reader.load()
        _m1, m2, m3 = world.managers
        assert "timed out" in (m2.initial_error or "")
        assert m3.initial_error == m2.initial_error, "a handshake proves nothing about the data plane"


# ----------------------------------------------------------------------------- fallback


class TestFallback:
    def test_no_candidates_falls_back_to_disk(self, world: World, h: Harness, checkpoint: Path) -> None:
        result = h.load(checkpoint=checkpoint)
        assert (result.ok, result.path, result.integrity) == (True, "disk", "verified")
        assert result.source == str(checkpoint) and result.attempts == []
        assert h.events("fallback")[0]["reason"] == "no source available"
        assert h.sample("mxref_fallbacks_total", reason="no_source_available") == 1
        assert h.sample("mxref_loads_total", path="disk", integrity="verified") == 1
        arena = loaded_arena(h)
        assert [arena.raw(i).tobytes() for i in range(len(arena.specs))] == SOURCE_BYTES

    def test_listing_failure_falls_back(self, world: World, h: Harness, checkpoint: Path) -> None:
        world.add("a")
        world.list_error = True
        result = h.load(checkpoint=checkpoint)
        assert result.ok and result.path == "disk"
        assert h.sample("mx_p2p_list_sources_total", policy="rendezvous_hash", result="error") == 1
        assert "UNAVAILABLE" in h.events("candidates")[0]["error"]

    def test_no_checkpoint_configured(self, world: World, h: Harness) -> None:
        result = h.load()
        assert not result.ok and result.path == "none"
        assert "no checkpoint" in (result.error or "")
        assert h.events("load_failed")[0]["error"] == result.error

    def test_missing_checkpoint(self, world: World, h: Harness, tmp_path: Path) -> None:
        missing = tmp_path / "nope.safetensors"
        result = h.load(checkpoint=missing)
        assert not result.ok and result.path == "none"
        assert str(missing) in (result.error or "") and "no source available" in (result.error or "")

    def test_garbage_checkpoint(self, world: World, h: Harness, tmp_path: Path) -> None:
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a safetensors header at all")
        result = h.load(checkpoint=bad)
        assert not result.ok and result.path == "none"
        assert str(bad) in (result.error or "")

    def test_checkpoint_with_flipped_bytes_fails_integrity(self, world: World, h: Harness, tmp_path: Path) -> None:
        path = tmp_path / "flipped.safetensors"
        arena = generate(SPEC)
        save_checkpoint(arena, path, SPEC)
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF  # the last byte belongs to the last tensor's data
        path.write_bytes(bytes(raw))
        result = h.load(checkpoint=path)
        assert not result.ok and result.integrity == "failed"
        assert "differ from the reference" in (result.error or "")

    def test_checkpoint_of_another_model(self, world: World, h: Harness, tmp_path: Path) -> None:
        other = ModelSpec(name="mxref/unit", tensors=2, tensor_bytes=2048, dtype="float16", seed=7)
        path = tmp_path / "other.safetensors"
        save_checkpoint(generate(other), path, other)
        result = h.load(checkpoint=path)
        assert not result.ok
        assert "different model" in (result.error or "")

    def test_all_sources_failing_then_a_good_checkpoint(self, world: World, h: Harness, checkpoint: Path) -> None:
        world.add("a", behaviour=STALL)
        result = h.load(checkpoint=checkpoint)
        assert result.ok and result.path == "disk"
        assert h.sample("mxref_fallbacks_total", reason="no_source_succeeded") == 1
        assert world.managers[0].shut_down


# ----------------------------------------------------------------------------- metrics funnel


class TestMetricsFunnel:
    def test_candidate_stages_and_attempt_results(self, world: World, h: Harness) -> None:
        world.add("rank1", worker_rank=1)
        world.add("gpu", accelerator="cuda")
        world.add("miss", metadata="not_found")
        world.add("bad", behaviour=DISCONNECT)
        world.add("good")
        reader = h.make()
        reader.selector = FixedOrder(["miss", "bad", "good"])
        result = reader.load()
        p = reader.policy
        for stage, n in (("listed", 5), ("rank_matched", 4), ("accelerator_matched", 3)):
            assert h.sample("mx_p2p_candidates_count", policy=p, stage=stage) == 1
            assert h.sample("mx_p2p_candidates_sum", policy=p, stage=stage) == n
        assert h.outcomes() == [("miss", "metadata_miss"), ("bad", "transfer_retry"), ("good", "success")]
        for r, n in (("metadata_miss", 1), ("transfer_retry", 1), ("transfer_fallback", 0), ("success", 1)):
            assert h.attempts(r) == n, r
        assert result.ok
        assert h.sample("mx_p2p_source_selections_total", policy=p) == 2  # transfers started
        assert h.sample("mx_p2p_transfer_seconds_count", policy=p, outcome="success") == 1
        assert h.sample("mxref_loads_total", path="rdma", integrity="verified") == 1
        assert h.sample("mxref_loaded_bytes_total", path="rdma") == SPEC.total_bytes


# ----------------------------------------------------------------------------- metadata-server RPC deadline


class TestRpcDeadline:
    def test_the_reader_gives_its_metadata_client_the_rpc_deadline(
        self, world: World, h: Harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen: list[tuple[Any, ...]] = []

        def client(address: str, *args: Any, **kwargs: Any) -> FakeClient:
            seen.append((address, *args, *kwargs.values()))
            return FakeClient(world)

        monkeypatch.setattr(reader_mod, "MxClient", client)
        world.add("good")
        assert h.load(rpc_timeout_s=3.0).ok
        assert seen == [("127.0.0.1:1", 3.0)]

    def test_the_default_deadline_is_the_configured_one(self) -> None:
        from mxref import config

        assert ReaderOptions(server="x:1").rpc_timeout_s == config.DEFAULT_RPC_TIMEOUT_S

    def test_the_cli_flag_takes_a_duration_and_defaults_to_the_configured_deadline(self) -> None:
        from mxref import config
        from mxref.__main__ import build_parser

        parser = build_parser()
        assert parser.parse_args(["reader", "--rpc-timeout", "3s"]).rpc_timeout == 3.0
        assert parser.parse_args(["reader", "--rpc-timeout", "500ms"]).rpc_timeout == 0.5
        assert parser.parse_args(["reader"]).rpc_timeout == config.DEFAULT_RPC_TIMEOUT_S
        with pytest.raises(SystemExit):
            parser.parse_args(["reader", "--rpc-timeout", "0"])


# ----------------------------------------------------------------------------- the content reference


class TestReference:
    """The reader checks everything against its own reference, never against what a source or
    a checkpoint says about itself."""

    def test_a_manifest_that_disagrees_is_skipped_and_never_read(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        liar, honest = order_for_selector(reader, world)
        # wrong bytes under the same identity, and an honest manifest of them
        world.by_worker(liar).served, world.by_worker(liar).manifest_sums = OTHER_BYTES, OTHER_SUMS
        result = reader.load()
        assert h.outcomes() == [(liar, "reference_mismatch"), (honest, "success")]
        error = result.attempts[0].error or ""
        assert "manifest disagrees with the reference" in error and REFERENCE.digest in error
        assert f"{SPEC.tensors} of {SPEC.tensors} tensors" in error
        # never read from: no manager, no handshake, no READ for it
        assert ("fetch", world.by_worker(liar).agent_name) not in world.agent_calls()
        assert [e["index"] for e in h.events("transfer_start")] == [1]
        assert len(world.managers) == 1
        assert h.sample("mxref_reference_mismatches_total", stage="manifest") == 1
        assert h.attempts("reference_mismatch") == 1
        assert (result.ok, result.worker_id, result.integrity) == (True, honest, "verified")

    def test_one_differing_checksum_is_enough_to_skip(self, world: World, h: Harness) -> None:
        sums = list(SOURCE_SUMS)
        sums[1] = OTHER_SUMS[1]
        world.add("a", manifest_sums=sums)
        result = h.load()
        assert h.outcomes() == [("a", "reference_mismatch")]
        assert "['model.layers.1.weight']" in (result.attempts[0].error or "")
        assert not result.ok and result.integrity == "unverified"

    def test_a_lying_manifest_is_read_then_refused_on_the_bytes(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        liar, honest = order_for_selector(reader, world)
        world.by_worker(liar).served = OTHER_BYTES  # publishes the reference's checksums, holds other bytes
        result = reader.load()
        assert h.outcomes() == [(liar, "integrity_mismatch"), (honest, "success")]
        assert h.sample("mxref_reference_mismatches_total", stage="read") == 1
        assert [e["ok"] for e in h.events("integrity")] == [False, True]
        assert result.ok and result.integrity == "verified"
        arena = loaded_arena(h)
        assert [arena.raw(i).tobytes() for i in range(len(arena.specs))] == SOURCE_BYTES

    def test_wrong_bytes_from_the_only_source_are_never_verified(self, world: World, h: Harness) -> None:
        world.add("a", served=OTHER_BYTES)
        result = h.load()
        assert h.outcomes() == [("a", "integrity_mismatch")]
        assert not result.ok and result.integrity != "verified" and result.path == "none"
        assert not h.events("load_done") and not h.events("memory_digest")

    def test_an_empty_checksum_claims_nothing_and_the_bytes_decide(self, world: World, h: Harness) -> None:
        world.add("a", manifest_sums=[""] * SPEC.tensors)
        world.add("b", manifest_sums=[""] * SPEC.tensors)
        reader = h.make()
        liar, honest = order_for_selector(reader, world)
        world.by_worker(liar).served = OTHER_BYTES
        result = reader.load()
        assert h.outcomes() == [(liar, "integrity_mismatch"), (honest, "success")]
        assert result.ok and result.worker_id == honest and result.integrity == "verified"

    def test_the_fallback_checks_the_reference_not_what_the_checkpoint_records(
        self, world: World, h: Harness, tmp_path: Path
    ) -> None:
        path = tmp_path / "other.safetensors"
        save_checkpoint(generate(OTHER_SPEC), path, OTHER_SPEC)  # consistent with itself, not our model
        result = h.load(checkpoint=path)
        assert not result.ok and result.integrity == "failed"
        assert "differ from the reference" in (result.error or "")
        assert h.sample("mxref_reference_mismatches_total", stage="disk") == 1
        assert not h.events("load_done") and not h.events("memory_digest")

    def test_a_checkpoint_recording_the_reference_over_other_bytes_fails(
        self, world: World, h: Harness, tmp_path: Path
    ) -> None:
        path = tmp_path / "tampered.safetensors"
        save_checkpoint(generate(OTHER_SPEC), path, SPEC, reference=REFERENCE)
        result = h.load(checkpoint=path)
        assert not result.ok and result.integrity == "failed"
        assert f"{SPEC.tensors} of {SPEC.tensors} tensors differ from the reference" in (result.error or "")

    def test_memory_digest_after_a_load_is_what_the_memory_holds(self, world: World, h: Harness) -> None:
        world.add("a")
        reader = h.make()
        assert reader.load().ok
        (loaded,) = h.events("memory_digest")
        want = {s.name: xxhash.xxh3_64_hexdigest(b) for s, b in zip(SPEC.tensor_specs(), SOURCE_BYTES)}
        assert loaded["when"] == "loaded" and loaded["checksums"] == want
        assert loaded["digest"] == REFERENCE.digest
        # it re-hashes: a byte changed in memory shows in the next report
        loaded_arena(h).raw(2)[0] ^= 0xFF
        assert reader.settle(0.01, threading.Event(), always=True) is not None
        settled = h.events("memory_digest")[-1]
        assert settled["when"] == "settled" and settled["digest"] != REFERENCE.digest
        assert [n for n in want if settled["checksums"][n] != want[n]] == ["model.layers.2.weight"]

    def test_settle_is_disabled_by_zero_and_cut_short_by_stop(self, world: World, h: Harness) -> None:
        world.add("a")
        reader = h.make()
        reader.load()
        stop = threading.Event()
        assert reader.settle(0, stop, always=True) is None
        stop.set()
        assert reader.settle(5.0, stop, always=True) is None
        assert [e["when"] for e in h.events("memory_digest")] == ["loaded"]
        assert reader.report_memory("exit") is not None

    def test_a_load_whose_reads_all_completed_does_not_settle_unless_asked(self, world: World, h: Harness) -> None:
        world.add("a")
        reader = h.make()
        assert reader.load().ok and reader.released_mid_read is False
        assert reader.settle(5.0, threading.Event()) is None  # no late writer to wait for
        assert not [e for e in h.events("load_phase") if e["phase"] == "settle"]
        assert reader.settle(0.01, threading.Event(), always=True) is not None
        assert [e["when"] for e in h.events("memory_digest")] == ["loaded", "settled"]

    def test_the_disk_path_reports_its_memory_too(self, world: World, h: Harness, checkpoint: Path) -> None:
        result = h.load(checkpoint=checkpoint)
        assert result.path == "disk" and result.integrity == "verified"
        (loaded,) = h.events("memory_digest")
        assert loaded["when"] == "loaded" and loaded["digest"] == REFERENCE.digest


# ----------------------------------------------------------------------------- late-write guard


def late_replies(world: World, stalled: str) -> int:
    """What a resumed stalled source does (docs/nixl-facts.md#late-writes-after-a-released-stall): it answers every GET it was sent,
    writing its bytes (here: another seed's, so they show) into the local ranges of the READ
    that stalled, released or not. Returns how many ranges it wrote."""
    written = 0
    for manager in world.managers:
        for name, local, _remote in manager.fake.handles.values():
            if name != world.by_worker(stalled).agent_name:
                continue
            for i, (laddr, size, _) in enumerate(local.tolist()):
                ctypes.memmove(laddr, OTHER_BYTES[i], size)
                written += 1
    return written


class TestLateWriteGuard:
    def _stall_then_load(self, world: World, h: Harness, **options: Any) -> tuple[Reader, str]:
        world.add("a")
        world.add("b")
        reader = h.make(**options)
        first, second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = STALL
        result = reader.load()
        assert result.ok and result.worker_id == second and result.integrity == "verified"
        return reader, first

    def test_after_a_stall_the_next_attempt_reads_into_fresh_memory_and_the_stalled_region_is_parked(
        self, world: World, h: Harness
    ) -> None:
        reader, _first = self._stall_then_load(world, h)
        regions = h.events("target_region")
        assert [(r["index"], r["fresh"], r["parked"]) for r in regions] == [(0, True, 0), (1, True, 1)]
        assert regions[0]["addr"] != regions[1]["addr"]
        assert regions[0]["agent_name"] != regions[1]["agent_name"]  # a fresh agent
        (parked,) = h.events("region_parked")
        assert (parked["index"], parked["addr"], parked["bytes"]) == (0, regions[0]["addr"], regions[0]["bytes"])
        # the stalled attempt's agent was shut down before the next one was created
        assert world.managers[0].shut_down and not world.managers[1].shut_down
        assert reader.manager is world.managers[1]

    def test_late_replies_of_the_stalled_source_do_not_touch_the_verified_load(self, world: World, h: Harness) -> None:
        reader, first = self._stall_then_load(world, h)
        assert reader.released_mid_read is True  # so it settles without being asked
        assert late_replies(world, first) == SPEC.tensors
        held = reader.settle(0.01, threading.Event())
        assert held is not None and held.digest == REFERENCE.digest
        reader.close()

    def test_without_the_guard_the_late_replies_overwrite_the_verified_load(self, world: World, h: Harness) -> None:
        """The simulated unguarded reader: the test above can fail."""
        reader, first = self._stall_then_load(world, h, unguarded_retry=True)
        regions = h.events("target_region")
        assert [(r["index"], r["fresh"]) for r in regions] == [(0, True), (1, False)]
        assert regions[0]["addr"] == regions[1]["addr"] and not h.events("region_parked")
        assert len(world.managers) == 1 and not world.managers[0].shut_down
        late_replies(world, first)
        held = reader.settle(0.01, threading.Event())
        assert held is not None and held.digest != REFERENCE.digest
        reader.close()

    def test_a_failure_before_any_read_was_posted_releases_the_memory(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        first, _second = order_for_selector(reader, world)
        world.by_worker(first).behaviour = NO_HANDSHAKE
        assert reader.load().ok
        assert [o for _, o in h.outcomes()] == ["transfer_retry", "success"]
        assert not h.events("region_parked") and reader.released_mid_read is False
        assert [r["parked"] for r in h.events("target_region")] == [0, 0]

    def test_a_completed_read_with_wrong_bytes_is_not_parked(self, world: World, h: Harness) -> None:
        world.add("a")
        world.add("b")
        reader = h.make()
        world.by_worker(order_for_selector(reader, world)[0]).behaviour = CORRUPT
        assert reader.load().ok
        assert [o for _, o in h.outcomes()] == ["integrity_mismatch", "success"]
        assert not h.events("region_parked") and reader.released_mid_read is False  # answered in full: no late writer

    def test_parked_memory_is_held_until_close(self, world: World, h: Harness) -> None:
        reader, _first = self._stall_then_load(world, h)
        parked = list(reader._parked)
        assert len(parked) == 1 and parked[0].buffer.nbytes > 0
        reader.close()
        assert reader._parked == [] and parked[0].buffer.nbytes == 0

    def test_the_settle_window_drives_the_agents_progress(self, world: World, h: Harness) -> None:
        world.add("a")
        reader = h.make()
        assert reader.load().ok
        assert reader.manager is not None and reader.manager._pump is None
        assert reader.settle(0.01, threading.Event(), always=True) is not None
        assert reader.manager._pump is not None and reader.manager._pump.is_alive()
        reader.close()
