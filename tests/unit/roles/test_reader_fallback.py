"""The reader's fallback to the checkpoint, its metrics funnel and the metadata-server RPC deadline,
against fakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.reader_world import (
    DISCONNECT,
    SOURCE_BYTES,
    SPEC,
    STALL,
    FakeClient,
    FixedOrder,
    Harness,
    World,
    loaded_arena,
)

import mxref.roles.reader as reader_mod
from mxref.model import ModelSpec, generate, save_checkpoint
from mxref.roles.reader import ReaderOptions

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
        from mxref.__main__ import parse_argv
        from mxref.options import ReaderFlags

        for argv, want in ((["--rpc-timeout", "3s"], 3.0), (["--rpc-timeout", "500ms"], 0.5),
                           ([], config.DEFAULT_RPC_TIMEOUT_S)):
            args = parse_argv(["reader", *argv])
            assert isinstance(args, ReaderFlags) and args.rpc_timeout == want
        with pytest.raises(SystemExit):
            parse_argv(["reader", "--rpc-timeout", "0"])
