"""The reader's candidates (docs/contract.md#load-strategy) against fakes: which sources it tries,
in what order, and what a metadata miss does."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.reader_world import (
    SID,
    SOURCE_BYTES,
    SPEC,
    Harness,
    World,
    loaded_arena,
    order_for,
    order_for_selector,
    tried,
)

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


