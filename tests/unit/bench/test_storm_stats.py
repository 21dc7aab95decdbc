"""The storm bench's arithmetic (``mxref.bench.storm_stats``) on hand-made rounds: what counts
towards the aggregate, the spread against the fair share, and each goal's verdict and interval."""

from __future__ import annotations

from typing import Any

import pytest

from mxref.bench.storm_stats import (
    ReaderOutcome,
    StormRound,
    at_most,
    max_over_fair,
    quantiles_s,
    quotient,
    ratio_rounds,
    reader_outcome,
    storm_round,
    summarize_cell,
    table,
)

MIB = 1 << 20


def ok(done: float, load: float, source: str, attempts: tuple[str, ...] = ("success",)) -> ReaderOutcome:
    return ReaderOutcome(done_s=done, load_s=load, source=source, path="rdma", verified=True, nbytes=64 * MIB,
                         attempts=attempts)


def test_a_round_counts_verified_whole_loads_only_and_times_from_the_go() -> None:
    rnd = StormRound(readers=3, go_s=10.0, outcomes=[
        ok(10.5, 0.5, "s-a"), ok(11.0, 1.0, "s-b", ("transfer_retry", "success")),
        ReaderOutcome(done_s=12.0, load_s=2.0, source=None, path="disk", verified=True, nbytes=64 * MIB,
                      attempts=("transfer_fallback",)),
    ])
    got = storm_round(rnd, 64 * MIB)
    assert got["wall_s"] == 2.0  # the last result, not the last verified one
    assert got["verified"] == 2 and got["bytes_verified"] == 128 * MIB
    assert got["aggregate_gbps"] == round(2 * 64 * MIB / 2.0 / 1e9, 3)
    assert got["reads_per_source"] == {"s-a": 1, "s-b": 1}
    assert got["attempts"] == 4 and got["fallbacks"] == 1 and got["failed_attempts"] == 2 and got["stalls"] == 0


def test_a_round_refuses_a_missing_result() -> None:
    with pytest.raises(ValueError, match="1 results for 2 readers"):
        storm_round(StormRound(readers=2, go_s=0.0, outcomes=[ok(1.0, 1.0, "s")]), MIB)


def test_a_reader_result_becomes_an_outcome() -> None:
    result = {"ok": True, "path": "rdma", "source": "source-0-ab", "integrity": "verified", "bytes": 5,
              "seconds": 0.25, "attempts": [{"outcome": "transfer_retry"}, {"outcome": "success"}]}
    o = reader_outcome(result, 3.0)
    assert (o.source, o.verified, o.load_s, o.attempts) == ("source-0-ab", True, 0.25, ("transfer_retry", "success"))
    assert reader_outcome({**result, "integrity": "failed"}, 3.0).verified is False
    assert reader_outcome({**result, "path": "disk"}, 3.0).source is None
    assert o.stalls == 0
    stalled = {**result, "attempts": [{"outcome": "transfer_retry", "error": "TransferStalled: READ stalled: no chunk"},
                                      {"outcome": "transfer_retry", "error": "nixlBackendError: NIXL_ERR_BACKEND"},
                                      {"outcome": "success"}]}
    assert reader_outcome(stalled, 3.0).stalls == 1  # a refused or broken READ is a failed attempt, not a stall


@pytest.mark.parametrize(("reads", "sources", "readers", "expected"), [
    ({"a": 4, "b": 4}, 2, 8, 1.0),
    ({"a": 6, "b": 2}, 2, 8, 1.5),
    ({"a": 2, "b": 1, "c": 1}, 4, 4, 2.0),  # ceil(4/4) = 1: two on one source is twice the fair share
    ({"a": 1}, 4, 1, 1.0),  # one reader cannot do better than one source
    ({"a": 3, "b": 2}, 2, 5, 1.0),  # ceil(5/2) = 3
])
def test_the_fair_share_is_what_an_assignment_can_reach(reads: dict[str, int], sources: int, readers: int,
                                                         expected: float) -> None:
    assert max_over_fair(reads, sources, readers) == expected


def test_quantiles_have_intervals_only_when_the_values_bound_them() -> None:
    few = quantiles_s([1.0, 2.0, 3.0])
    assert few["p50_s"] == 2.0 and few["p50_ci"] is None and few["p99_ci"] is None
    many = quantiles_s([float(i) for i in range(1, 401)])
    assert many["p50_ci"] is not None and many["p50_ci"][0] < many["p50_s"] < many["p50_ci"][1]
    assert many["p99_ci"] is not None and many["p99_ci"][0] <= many["p99_s"] <= many["p99_ci"][1]
    assert quantiles_s([])["p50_s"] is None


def test_at_most_is_settled_only_when_the_interval_is_on_one_side() -> None:
    assert at_most(1.2, 2.0, [1.1, 1.9]) == {"value": 1.2, "goal": 2.0, "met": True, "ci": [1.1, 1.9], "settled": True}
    assert at_most(1.2, 2.0, [1.1, 2.5])["settled"] is False
    assert at_most(2.4, 2.0, [2.1, 2.5]) | {} == {"value": 2.4, "goal": 2.0, "met": False, "ci": [2.1, 2.5],
                                                  "settled": True}
    assert at_most(None, 2.0)["met"] is None


def test_a_quotient_of_quantiles_takes_the_widest_interval() -> None:
    num = {"p99_s": 2.0, "p99_ci": [1.5, 3.0]}
    den = {"p50_s": 1.0, "p50_ci": [0.5, 1.5]}
    value, ci = quotient(num, "p99", den, "p50")
    assert value == 2.0 and ci == [1.0, 6.0]
    assert quotient({"p99_s": None, "p99_ci": None}, "p99", den, "p50") == (None, None)


def test_ratio_rounds_is_judged_on_the_paired_median() -> None:
    got = ratio_rounds([0.9, 0.8, 1.0, 0.85, 0.9, 0.95], [1.0] * 6, 0.8)
    assert got["value"] == 0.9 and got["met"] is True and got["ci"] == [0.8, 1.0] and got["settled"] is True
    short = ratio_rounds([0.5, 0.6], [1.0, 1.0], 0.8)
    assert short["met"] is False and short["ci"] is None and short["settled"] is False
    assert ratio_rounds([], [], 0.8)["met"] is None


def _round(go: float, loads: list[float], sources: list[str], stalls: int = 0) -> dict[str, Any]:
    outcomes = [ReaderOutcome(done_s=go + x, load_s=x, source=s, path="rdma", verified=True, nbytes=64 * MIB,
                              attempts=("transfer_retry",) * stalls + ("success",), stalls=stalls)
                for x, s in zip(loads, sources)]
    return storm_round(StormRound(readers=len(loads), go_s=go, outcomes=outcomes), 64 * MIB)


def test_a_cell_judges_every_goal() -> None:
    storms = [_round(0.0, [1.0, 1.1, 1.2, 1.3], ["a", "b", "a", "b"]) for _ in range(3)]
    raws = [_round(0.0, [0.5, 0.5, 0.5, 0.5], ["ra", "rb", "ra", "rb"]) for _ in range(3)]
    frozen = [_round(0.0, [1.0, 2.9, 1.2, 3.0], ["a", "b", "b", "b"], stalls=0)]
    cell = summarize_cell(4, 2, 64 * MIB, storms, raws, frozen, listings_s=[0.001] * 10)
    goals = cell["goals"]
    assert goals["spread"]["value"] == 1.0 and goals["spread"]["met"] is True
    assert goals["aggregate_over_raw"]["value"] == pytest.approx(0.5 / 1.3, abs=0.002)  # the same bytes, 1.3 s vs 0.5 s
    assert goals["aggregate_over_raw"]["met"] is False  # 0.38 x the fan-out
    assert goals["healthy"]["met"] is True
    assert goals["p99_over_p50"]["met"] is True
    assert goals["frozen_over_healthy_p99"]["value"] == round(cell["frozen"]["load"]["p99_s"] / cell["load"]["p99_s"], 3)
    assert goals["frozen_over_healthy_p99"]["met"] is False  # 3.0 s against 1.3 s
    assert cell["list_sources"]["p50_ms"] == 1.0
    assert cell["bytes_verified"] == 3 * 4 * 64 * MIB
    lines = table([cell])
    assert lines[1].split()[:3] == ["mxref", "4", "2"] and "MISSED" in lines[2]


def test_a_stall_or_a_second_attempt_fails_the_healthy_goal() -> None:
    stalled = [_round(0.0, [1.0, 1.0], ["a", "b"], stalls=1)]
    assert summarize_cell(2, 2, 64 * MIB, stalled, [])["goals"]["healthy"]["met"] is False
    crowded = [_round(0.0, [1.0, 1.0, 1.0, 1.0], ["a", "a", "a", "b"])]
    spread = summarize_cell(4, 2, 64 * MIB, crowded, [])["goals"]["spread"]
    assert spread["value"] == 1.5 and spread["met"] is True  # 3 on one source: 1.5 x ceil(4/2), the bound itself
    worse = [_round(0.0, [1.0] * 4, ["a"] * 4)]
    assert summarize_cell(4, 2, 64 * MIB, worse, [])["goals"]["spread"]["met"] is False
