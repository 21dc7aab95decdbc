"""The reader holds its load to the content reference, and guards its memory from a late write,
against fakes."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import xxhash
from fixtures.reader_world import (
    CORRUPT,
    NO_HANDSHAKE,
    OTHER_BYTES,
    OTHER_SPEC,
    OTHER_SUMS,
    REFERENCE,
    SOURCE_BYTES,
    SOURCE_SUMS,
    SPEC,
    STALL,
    Harness,
    World,
    loaded_arena,
    order_for_selector,
)

from mxref.model import generate, save_checkpoint
from mxref.roles.reader import Reader

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
