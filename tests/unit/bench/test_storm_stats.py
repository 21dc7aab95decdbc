"""The storm bench's arithmetic (``mxref.bench.storm_stats``) on hand-made rounds: what counts
towards the aggregate, the spread against the fair share, and each goal's verdict and interval."""

from __future__ import annotations

from typing import Any

import pytest

from mxref.bench.report import median_bounds
from mxref.bench.storm_stats import (
    MET,
    MISSED,
    UNDECIDED,
    ReaderOutcome,
    StormRound,
    figure,
    judged,
    max_over_fair,
    quantiles_s,
    quotient,
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


def test_the_median_interval_of_few_rounds_is_their_range_with_its_lower_coverage() -> None:
    assert median_bounds([1.0]) is None
    assert median_bounds([2.0, 1.0]) == (1.0, 2.0, 0.5)  # each value below the median with chance 1/2
    assert median_bounds([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0, 0.9375)
    low, high, cov = median_bounds([float(i) for i in range(1, 21)]) or (0, 0, 0)
    assert (low, high) == (6.0, 15.0) and cov >= 0.95  # 20 values: the 6th smallest and largest, 95.9 %


def test_a_goal_is_decided_only_by_an_interval_of_95_percent_on_one_side() -> None:
    six = figure([0.9, 0.8, 1.0, 0.85, 0.9, 0.95])
    assert six["median"] == 0.9 and six["ci"] == [0.8, 1.0] and six["coverage"] == 0.9688
    assert judged(six, 0.75, at_least=True)["verdict"] == MET
    assert judged(six, 1.05, at_least=True)["verdict"] == MISSED
    straddles = judged(six, 0.85, at_least=True)
    assert straddles["verdict"] == UNDECIDED and straddles["met"] is True  # the estimate alone is on the good side
    two = judged(figure([0.5, 0.6]), 0.8, at_least=True)
    assert two["ci"] == [0.5, 0.6] and two["coverage"] == 0.5 and two["verdict"] == UNDECIDED  # all below, but 50 %
    assert judged(figure([1.0]), 0.8, at_least=True)["ci"] is None
    assert judged(figure([3.0] * 7), 2.0, at_least=False)["verdict"] == MISSED


def test_a_quotient_of_medians_takes_the_widest_interval_at_95_percent_at_least() -> None:
    got = quotient([2.0, 3.0, 2.5, 2.2, 2.8, 2.4, 2.6], [1.0, 1.5, 1.2, 1.1, 1.4, 1.3, 1.25])
    assert got["median"] == round(2.5 / 1.25, 4)
    assert got["ci"] == [round(2.0 / 1.5, 4), 3.0]  # each side's range: 7 values cover with 98.4 %
    assert got["coverage"] == round(2 * (1 - 2 / 2**7) - 1, 4) and got["coverage"] >= 0.95
    assert quotient([], [1.0])["median"] is None


def _round(go: float, loads: list[float], sources: list[str], stalls: int = 0) -> dict[str, Any]:
    outcomes = [ReaderOutcome(done_s=go + x, load_s=x, source=s, path="rdma", verified=True, nbytes=64 * MIB,
                              attempts=("transfer_retry",) * stalls + ("success",), stalls=stalls)
                for x, s in zip(loads, sources)]
    return storm_round(StormRound(readers=len(loads), go_s=go, outcomes=outcomes), 64 * MIB)


def test_a_cell_judges_every_goal() -> None:
    storms = [_round(0.0, [1.0, 1.1, 1.2, 1.3 + k / 100], ["a", "b", "a", "b"]) for k in range(6)]
    raws = [_round(0.0, [0.5, 0.5, 0.5, 0.5], ["ra", "rb", "ra", "rb"]) for _ in range(6)]
    frozen = [_round(0.0, [1.0, 2.9, 1.2, 3.0], ["a", "b", "b", "b"], stalls=0)]
    cell = summarize_cell(4, 2, 64 * MIB, storms, raws, frozen, listings_s=[0.001] * 10)
    goals, figs = cell["goals"], cell["figures"]
    assert goals["spread"]["value"] == 1.0 and goals["spread"]["verdict"] == MET
    ratio = goals["aggregate_over_raw"]  # the same bytes, 1.3 s and up vs 0.5 s: 0.38 x the fan-out or less
    assert ratio["value"] == pytest.approx(0.5 / 1.325, abs=0.003) and ratio["verdict"] == MISSED
    assert ratio["ci"] == pytest.approx([0.5 / 1.35, 0.5 / 1.3], abs=0.002) and ratio["coverage"] >= 0.95
    assert goals["healthy"]["verdict"] == MET
    assert goals["p99_over_p50"]["verdict"] == MET and goals["p99_over_p50"]["ci"] is not None
    for key in ("aggregate_gbps", "raw_gbps", "storm_over_raw", "p50_s", "p99_s", "p99_over_p50"):
        assert figs[key]["n"] == 6 and figs[key]["ci"] is not None and figs[key]["coverage"] >= 0.95, key
    # one frozen round: its figure has no interval, and its goal cannot be decided
    frozen_goal = goals["frozen_over_healthy_p99"]
    assert frozen_goal["met"] is False and frozen_goal["ci"] is None and frozen_goal["verdict"] == UNDECIDED
    assert cell["list_sources"]["p50_ms"] == 1.0
    assert cell["bytes_verified"] == 6 * 4 * 64 * MIB
    lines = table([cell])
    assert lines[1].split()[:3] == ["mxref", "4", "2"] and "MISSED" in "\n".join(lines)


def test_every_figure_of_two_rounds_has_an_interval_that_decides_nothing() -> None:
    storms = [_round(0.0, [1.0, 1.2], ["a", "b"]), _round(0.0, [1.1, 1.4], ["a", "b"])]
    raws = [_round(0.0, [0.5, 0.5], ["ra", "rb"])] * 2
    frozen = [_round(0.0, [1.0, 5.0], ["a", "a"]), _round(0.0, [1.0, 6.0], ["a", "a"])]
    cell = summarize_cell(2, 2, 64 * MIB, storms, raws, frozen)
    for key, fig in cell["figures"].items():
        assert fig["ci"] is not None and fig["coverage"] < 0.95, key
    for name in ("aggregate_over_raw", "p99_over_p50", "frozen_over_healthy_p99"):
        assert cell["goals"][name]["verdict"] == UNDECIDED, name
    assert "*" in table([cell])[1]


def test_a_frozen_round_whose_freeze_never_landed_is_left_out() -> None:
    storms = [_round(0.0, [1.0, 1.0], ["a", "b"])]
    landed, missed = _round(0.0, [1.0, 3.0], ["a", "a"]), _round(0.0, [1.0, 1.0], ["a", "b"])
    cell = summarize_cell(2, 2, 64 * MIB, storms, [], [{**landed, "freeze_landed": True},
                                                      {**missed, "freeze_landed": False}])
    assert cell["frozen"]["rounds"] == 1 and cell["frozen"]["not_landed"] == 1
    assert cell["figures"]["frozen_p99_s"]["rounds"] == [round(1.0 + 0.99 * 2.0, 4)]  # the round's p99 of 1 s and 3 s


def test_a_stall_or_a_second_attempt_fails_the_healthy_goal() -> None:
    stalled = [_round(0.0, [1.0, 1.0], ["a", "b"], stalls=1)]
    assert summarize_cell(2, 2, 64 * MIB, stalled, [])["goals"]["healthy"]["verdict"] == MISSED
    crowded = [_round(0.0, [1.0, 1.0, 1.0, 1.0], ["a", "a", "a", "b"])]
    spread = summarize_cell(4, 2, 64 * MIB, crowded, [])["goals"]["spread"]
    assert spread["value"] == 1.5 and spread["verdict"] == MET  # 3 on one source: 1.5 x ceil(4/2), the bound itself
    worse = [_round(0.0, [1.0] * 4, ["a"] * 4)]
    assert summarize_cell(4, 2, 64 * MIB, worse, [])["goals"]["spread"]["verdict"] == MISSED


def test_an_arm_s_cpu_is_taken_per_round_and_sources_over_readers_within_each() -> None:
    from mxref.bench.storm import cpu_figures

    rounds: list[dict[str, Any]] = [{"cpu_s": {"readers": 2.0, "sources": 0.2}}, {"cpu_s": {"readers": 1.0, "sources": 0.3}},
              {"cpu_s": {"readers": 0.0, "sources": 0.1}}, {"wall_s": 1.0}]
    fig = cpu_figures(rounds)
    assert fig["readers_s"]["rounds"] == [2.0, 1.0, 0.0]
    assert fig["sources_s"]["median"] == 0.2
    assert fig["sources_over_readers"]["rounds"] == [0.1, 0.3]  # a round whose readers used nothing has no ratio


def test_baseline_sources_needs_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    from mxref.bench import storm

    with pytest.raises(SystemExit):
        storm.main(["--baseline-sources"])
    assert "--baseline-sources needs --baseline PATH" in capsys.readouterr().err
