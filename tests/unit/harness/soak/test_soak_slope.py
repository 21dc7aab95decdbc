"""The soak's judgement (harness.soak.slope): a flat series is flat, a planted linear growth is
named with its rate and caught early, noise is told from growth only when the interval says so,
and a resumed soak's new level is not read as growth."""

from __future__ import annotations

import random

import pytest

from harness.soak.slope import LIMITS, MIN_POINTS, MIN_SPAN, Point, detection, fit, judge, t_quantile_975


def series(values: list[float], every: int = 20, segment: int = 0, start: int = 0) -> list[Point]:
    return [Point(start + i * every, v, segment) for i, v in enumerate(values)]


def test_a_constant_series_is_flat_with_a_zero_width_interval() -> None:
    verdict, slope = judge(series([17.0] * 30), "fds")
    assert verdict == "flat"
    assert slope is not None and slope.per_1000 == pytest.approx(0, abs=1e-6) and slope.lo == pytest.approx(0, abs=1e-6)
    assert slope.hi == pytest.approx(0, abs=1e-6) and slope.n == 30


def test_a_warm_up_ramp_is_left_out_of_the_fit() -> None:
    ramp = [90_000.0, 97_000.0, 101_000.0, 103_000.0, 104_000.0] + [104_000.0] * 60  # what a reader's RSS does in its first loads
    assert judge(series(ramp), "rss_kib", warmup=0)[0] != "flat"
    verdict, slope = judge(series(ramp), "rss_kib", warmup=100)
    assert verdict == "flat" and slope is not None and slope.per_1000 == pytest.approx(0, abs=1e-6)


def test_a_planted_leak_of_one_per_transfer_grows_at_1000_per_1000() -> None:
    points = series([5.0 + 20 * i for i in range(40)])  # one descriptor per transfer, sampled every 20
    verdict, slope = judge(points, "fds")
    assert verdict == "grows"
    assert slope is not None and slope.per_1000 == pytest.approx(1000) and slope.lo > LIMITS["fds"]
    # caught as soon as MIN_POINTS points are past the warm-up: 100 transfers of warm-up, then 5 samples
    assert detection(points, "fds", warmup=100) == 100 + (MIN_POINTS - 1) * 20


def test_a_noisy_flat_series_is_flat_and_its_interval_holds_zero() -> None:
    rng = random.Random(7)
    points = series([100_000 + rng.gauss(0, 300) for _ in range(200)])  # RSS jitter of +-300 KiB
    verdict, slope = judge(points, "rss_kib")
    assert verdict == "flat"
    assert slope is not None and slope.lo < 0 < slope.hi and slope.hi <= LIMITS["rss_kib"]


def test_a_noisy_growth_is_caught_with_an_interval_around_its_rate() -> None:
    rng = random.Random(11)
    points = series([50 + 0.5 * 20 * i + rng.gauss(0, 4) for i in range(100)])  # one per 2 transfers, +-4 noise
    verdict, slope = judge(points, "tcp")
    assert verdict == "grows"
    assert slope is not None and slope.per_1000 == pytest.approx(500, abs=10) and slope.hi - slope.lo < 50


def test_noise_too_large_to_tell_is_unsettled_not_flat() -> None:
    rng = random.Random(3)
    points = series([10 + rng.gauss(0, 3) for _ in range(8)])  # a few noisy points of a count
    verdict, slope = judge(points, "fds")
    assert verdict == "unsettled" and slope is not None and slope.lo <= LIMITS["fds"] < slope.hi


def test_too_few_points_are_unsettled_without_a_slope() -> None:
    assert judge(series([1.0] * (MIN_POINTS - 1)), "fds") == ("unsettled", None)
    assert judge(series([1.0] * 30), "fds", warmup=10_000) == ("unsettled", None)
    assert fit([]) is None


def test_a_resumed_segment_starting_at_another_level_is_not_growth() -> None:
    first = series([40.0] * 15)
    second = series([55.0] * 15, segment=1, start=300)  # new processes: another level, the same slope (none)
    naive = judge([Point(p.transfers, p.value) for p in first + second], "fds")
    assert naive[0] == "grows"  # one line through both would call the step a growth
    verdict, slope = judge(first + second, "fds")
    assert verdict == "flat" and slope is not None and slope.per_1000 == pytest.approx(0, abs=1e-6)


def test_growth_in_both_segments_is_one_slope() -> None:
    first = series([10.0 + 20 * i for i in range(10)])
    second = series([3.0 + 20 * i for i in range(10)], segment=1, start=200)
    verdict, slope = judge(first + second, "fds")
    assert verdict == "grows" and slope is not None and slope.per_1000 == pytest.approx(1000)


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (5, 2.571), (30, 2.042), (60, 2.000), (120, 1.980),
                                              (100_000, 1.960)])
def test_t_quantiles(df: int, expected: float) -> None:
    assert t_quantile_975(df) == pytest.approx(expected, abs=2e-3)


def test_t_quantile_refuses_no_degrees_of_freedom() -> None:
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


def test_memory_is_judged_only_over_a_long_enough_span() -> None:
    step = series([104_000.0] * 3 + [104_600.0] * 3)  # an allocator's step over 100 transfers: not a rate yet
    assert judge(step, "rss_kib")[0] == "unsettled"
    assert judge(step, "fds")[0] == "grows"  # a count has no such steps: its growth is judged at once
    longer = series([104_000.0 + 10 * i for i in range(MIN_SPAN["rss_kib"] // 20 + 1)])  # 0.5 MiB per 1,000
    assert judge(longer, "rss_kib")[0] == "flat"
