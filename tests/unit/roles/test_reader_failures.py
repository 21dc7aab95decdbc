"""The reader's load flow (docs/contract.md#load-strategy) against fakes: a failed transfer, the
release of its source and the health carried to the next load."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fixtures.reader_world import (
    CORRUPT,
    DISCONNECT,
    LATE_HANDSHAKE,
    NO_HANDSHAKE,
    SPEC,
    STALL,
    Harness,
    World,
    order_for_selector,
)

from mxref.roles.reader import ReaderOptions
from mxref.transfer.chunked import ChunkPolicy
from mxref.transfer.read_target import ReadTarget

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
        assert ChunkPolicy().stall_s == pytest.approx(2 * 16 * (1 << 20) / 25e6 + 0.5)

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

    def test_the_first_attempt_starts_once_its_prestarted_target_is_ready(self, world: World, h: Harness) -> None:
        """Made since the load began, the first target may still be allocating when the listing is
        back: the reader waits for it before attempt_start, so an attempt's clock (and a fault the
        harness lands on attempt_start) counts only the source's share."""
        world.add("a")
        reader = h.make(prestart=True)
        made = reader._new_target

        def slow(ahead: bool = False) -> ReadTarget:
            time.sleep(0.2)
            return made(ahead)

        reader._new_target = slow  # type: ignore[method-assign]
        assert reader.load().ok
        names = [(e["event"], e.get("phase"), e.get("index")) for e in h.events()]
        waited = names.index(("load_phase", "wait_target", None))
        assert names.index(("load_phase", "list", None)) < waited < names.index(("attempt_start", None, 0))
        before = [e for e in h.events("load_phase") if e["phase"] == "wait_target" and e["index"] is None]
        assert len(before) == 1 and before[0]["seconds"] >= 0.1
        # told once: the first attempt takes it ready and does not tell a second, empty wait
        assert not [e for e in h.events("load_phase") if e["phase"] == "wait_target" and e["index"] == 0]

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
