"""Source selectors: order only, deterministic where promised."""

from __future__ import annotations

import logging

import pytest

from mxref.roles.selection import RandomSelector, RendezvousHashSelector, Target, get_selector
from mxref.v1 import p2p_pb2

TARGET = Target(model_name="mxref/unit", worker_id="reader-1", worker_rank=0)


def refs(n: int, sid: str = "0123456789abcdef") -> list[p2p_pb2.SourceInstanceRef]:
    return [p2p_pb2.SourceInstanceRef(mx_source_id=sid, worker_id=f"w{i:02d}", worker_rank=0) for i in range(n)]


def ids(ordered: list[p2p_pb2.SourceInstanceRef]) -> list[str]:
    return [r.worker_id for r in ordered]


class TestRandom:
    def test_the_same_seed_gives_the_same_order(self) -> None:
        cands = refs(10)
        a = [ids(RandomSelector(42).order(cands, TARGET)) for _ in range(3)]
        b = [ids(RandomSelector(42).order(cands, TARGET)) for _ in range(3)]
        assert a == b

    def test_seeds_differ_and_every_candidate_is_kept(self) -> None:
        cands = refs(10)
        orders = {tuple(ids(RandomSelector(seed).order(cands, TARGET))) for seed in range(5)}
        assert len(orders) > 1
        assert all(sorted(o) == ids(cands) for o in orders)

    def test_the_input_is_not_mutated(self) -> None:
        cands = refs(6)
        before = ids(cands)
        RandomSelector(1).order(cands, TARGET)
        assert ids(cands) == before

    def test_empty(self) -> None:
        assert RandomSelector(0).order([], TARGET) == []


class TestRendezvousHash:
    def test_deterministic_across_instances_and_input_orders(self) -> None:
        cands = refs(12)
        first = ids(RendezvousHashSelector().order(cands, TARGET))
        assert ids(RendezvousHashSelector(seed=99).order(list(reversed(cands)), TARGET)) == first
        assert sorted(first) == ids(cands)

    def test_removing_a_candidate_keeps_the_others_in_order(self) -> None:
        cands = refs(12)
        full = ids(RendezvousHashSelector().order(cands, TARGET))
        for gone in (full[0], full[5], full[-1]):
            rest = [c for c in cands if c.worker_id != gone]
            assert ids(RendezvousHashSelector().order(rest, TARGET)) == [w for w in full if w != gone]

    def test_different_readers_spread_their_first_choice(self) -> None:
        cands = refs(8)
        firsts = {
            ids(RendezvousHashSelector().order(cands, Target("mxref/unit", f"reader-{i}", 0)))[0] for i in range(40)
        }
        assert len(firsts) > 2

    def test_the_score_depends_on_the_source_id(self) -> None:
        a = refs(8, sid="aaaaaaaaaaaaaaaa")
        b = refs(8, sid="bbbbbbbbbbbbbbbb")
        assert ids(RendezvousHashSelector().order(a, TARGET)) != ids(RendezvousHashSelector().order(b, TARGET))


class TestGetSelector:
    @pytest.mark.parametrize("name, cls", [("random", RandomSelector), (None, RandomSelector), ("", RandomSelector),
                                           ("rendezvous_hash", RendezvousHashSelector)])
    def test_known_names(self, name: str | None, cls: type, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.WARNING, logger="mxref.roles.selection"):
            assert isinstance(get_selector(name), cls)
        assert not caplog.records

    def test_unknown_name_is_random_with_a_warning(self, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.WARNING, logger="mxref.roles.selection"):
            sel = get_selector("least_loaded", seed=3)
        assert isinstance(sel, RandomSelector) and sel.name == "random"
        assert any("least_loaded" in r.getMessage() for r in caplog.records)
        assert ids(sel.order(refs(6), TARGET)) == ids(RandomSelector(3).order(refs(6), TARGET))

    def test_the_seed_reaches_the_random_selector(self) -> None:
        assert ids(get_selector("random", 7).order(refs(9), TARGET)) == ids(RandomSelector(7).order(refs(9), TARGET))


class TestOrdinal:
    def test_readers_of_a_fleet_start_on_different_sources(self) -> None:
        import random

        cands = refs(4)
        for trial in range(5):
            shuffled = list(cands)
            random.Random(trial).shuffle(shuffled)  # each reader got the listing in its own order
            firsts = [ids(get_selector("ordinal", k).order(shuffled, TARGET))[0] for k in range(8)]
            assert sorted(firsts) == sorted(["w00", "w01", "w02", "w03"] * 2)

    def test_the_rest_follow_in_rotation_and_none_is_lost(self) -> None:
        assert ids(get_selector("ordinal", 6).order(refs(4), TARGET)) == ["w02", "w03", "w00", "w01"]
        assert ids(get_selector("ordinal", None).order(refs(3), TARGET)) == ["w00", "w01", "w02"]
        assert get_selector("ordinal", 3).order([], TARGET) == []

    def test_it_is_listed_by_name(self) -> None:
        assert get_selector("ordinal", 1).name == "ordinal"
