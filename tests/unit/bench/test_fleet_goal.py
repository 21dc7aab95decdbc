"""The fleet bench's p99 goal: met by the estimate, settled only by an interval on one side."""

from __future__ import annotations

import math

from mxref.bench.fleet import goal_text, p99_goal, quantiles_ms


def test_too_few_listings_give_an_estimate_but_no_settled_verdict() -> None:
    stats = quantiles_ms([0.002] * 200 + [0.030] * 2)
    assert stats["p99_ci_ms"] is None and stats["n"] == 202
    goal = p99_goal(stats)
    assert goal["met"] is True and goal["settled"] is False
    assert goal_text("identity", goal) == "identity 2 ms (no interval under 368 listings, 202 here): met, not settled"


def test_an_interval_under_the_goal_settles_it_and_a_tail_over_it_does_not() -> None:
    quick = quantiles_ms([0.001 + i * 1e-6 for i in range(1000)])  # 1.000-1.999 ms
    goal = p99_goal(quick)
    assert goal["met"] is True and goal["settled"] is True and goal["ci_ms"][1] < 2.0
    tail = quantiles_ms([0.002] * 970 + [0.050] * 30)  # 3 % of the listings at 50 ms
    goal = p99_goal(tail)
    assert goal["p99_ms"] == 50.0 and goal["met"] is False and goal["settled"] is True
    assert goal_text("rank", goal).endswith(": MISSED, settled")
    edge = quantiles_ms([0.002] * 985 + [0.050] * 15)  # 1.5 %: over the p99, yet within its interval's reach
    goal = p99_goal(edge)
    assert goal["met"] is False and goal["settled"] is False and goal["ci_ms"] == [2.0, 50.0]


def test_no_listings_is_no_verdict() -> None:
    stats = quantiles_ms([])
    assert math.isnan(stats["p99_ms"])
    goal = p99_goal(stats)
    assert goal["met"] is None and goal_text("limit16", goal) == "limit16: no listings"
