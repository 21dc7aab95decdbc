"""``python -m mxref bench`` without NIXL: its flags, the summary arithmetic on fake rows (medians,
the fastest raw baseline, chunked vs single handle, the ceiling ratios, the goal marks), the table,
``python -m mxref.bench.raw``'s fastest-variant JSON, and the TCP loopback ceiling at a small size."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from mxref.__main__ import main as mxref_main
from mxref.bench import load as bench_load
from mxref.bench import raw as bench
from mxref.bench.load import BenchFlags
from mxref.bench.loopback import loopback_ceiling, loopback_gbps
from mxref.bench.report import median_interval, quantile_interval, summarize, table
from mxref.options import parse

MIB = 1 << 20


def _row(load_s: float, read_s: float, **phases: float) -> dict[str, Any]:
    return {"load_s": load_s, "read_s": read_s, "wall_s": load_s + 1.0, "phases": phases}


ROWS = {
    "this": [_row(0.30, 0.10, read=0.10), _row(0.50, 0.12, read=0.12), _row(0.40, 0.11, read=0.11, verify=0.02)],
    "this-single": [_row(0.30, 0.10), _row(0.35, 0.10), _row(0.60, 0.099)],
}
RAW = {"pump": [[1.0, 1.1], [0.8, 1.2], [0.9, 1.0]], "thread": [[1.3, 1.1], [1.2, 1.15], [0.7, 1.12]]}


def test_summary_medians_the_fastest_raw_variant_and_the_ratios() -> None:
    nbytes = 100 * 10**6  # 1 GB / s per 0.1 s: easy figures
    s = summarize(100, nbytes, ROWS, RAW, [2.0, 1.0, 4.0])
    this, single = s["variants"]["this"], s["variants"]["this-single"]
    assert (this["load_s"], this["read_s"], this["read_gbps"]) == (0.4, 0.11, pytest.approx(0.909, abs=1e-3))
    assert this["phases"] == {"read": 0.11, "verify": 0.0}  # a phase missing from a round counts 0
    assert single["read_s"] == 0.1 and s["rounds"] == 3
    assert s["chunked_over_single"] == pytest.approx(0.1 / 0.11, abs=1e-3)
    raw = s["raw"]
    assert raw["variants"]["pump"] == {"cold_gbps": 0.9, "warm_gbps": 1.1, "samples": RAW["pump"]}
    assert (raw["cold_fastest"], raw["cold_gbps"]) == ("thread", 1.2)  # the faster variant per measure
    assert (raw["warm_fastest"], raw["warm_gbps"]) == ("thread", 1.12)
    assert raw["read_over_raw_cold"] == pytest.approx((nbytes / 0.11 / 1e9) / 1.2, abs=1e-3)
    assert raw["read_over_raw_warm"] == pytest.approx((nbytes / 0.11 / 1e9) / 1.12, abs=1e-3)
    assert s["ceiling"] == {"gbps": 2.0, "samples": [2.0, 1.0, 4.0], "raw_over_ceiling": 0.56,
                            "read_over_ceiling": pytest.approx(0.909 / 2, abs=1e-3)}
    read_goal = s["goals"]["read_over_raw"]
    assert (read_goal["value"], read_goal["goal"], read_goal["met"]) == (pytest.approx(0.758, abs=1e-3), 0.95, False)
    # within each round: this round's READ against this round's cold READ of the fastest raw variant (thread)
    assert read_goal["rounds"] == [pytest.approx(x, abs=1e-3) for x in (1.0 / 1.3, (1 / 1.2) / 1.2, (1 / 1.1) / 0.7)]
    assert read_goal["settled"] is False and read_goal["ci"] is None  # 3 rounds: too few for a 95 % interval
    chunked = s["goals"]["chunked_over_single"]
    assert chunked["met"] is False and chunked["rounds"] == [1.0, pytest.approx(0.833, abs=1e-3), 0.9]
    assert chunked["paired"] == 0.9  # the median of the rounds' ratios judges the goal
    assert chunked["spread"] == [pytest.approx(0.833, abs=1e-3), 1.0] and chunked["settled"] is False


def test_goals_are_met_at_the_threshold_and_absent_without_their_terms() -> None:
    same = {"this": [_row(0.2, 0.1)], "this-single": [_row(0.2, 0.1)]}
    s = summarize(100, 100 * 10**6, same, {"pump": [[1.0, 1.0]]})
    assert s["goals"]["chunked_over_single"] == {"value": 1.0, "goal": 0.95, "met": True, "rounds": [1.0],
                                                 "spread": [1.0, 1.0], "paired": 1.0, "ci": None, "settled": False}
    assert s["goals"]["read_over_raw"]["met"] is True and "ceiling" not in s
    alone = summarize(100, 100 * 10**6, {"this": [_row(0.2, 0.1)]})
    assert alone["goals"]["read_over_raw"] == {"value": None, "goal": 0.95, "met": None}
    assert alone["goals"]["chunked_over_single"]["met"] is None
    assert "raw" not in alone and "chunked_over_single" not in alone


def test_the_read_goals_are_taken_on_the_transfer_alone_when_the_nohash_reader_ran() -> None:
    """The default reader hashes landed tensors inside its READ phase; ``this-nohash`` does not,
    so the goal terms use it, and the default's own ratios stay beside them."""
    rows = {"this": [_row(0.2, 0.125)], "this-single": [_row(0.2, 0.1)], "this-nohash": [_row(0.25, 0.104)]}
    s = summarize(100, 100 * 10**6, rows, {"pump": [[1.0, 1.0]]})
    assert s["transfer_variant"] == "this-nohash"
    assert s["chunked_over_single"] == pytest.approx(0.1 / 0.104, abs=1e-3)
    assert s["goals"]["chunked_over_single"]["met"] is True
    assert s["chunked_hashing_over_single"] == pytest.approx(0.8, abs=1e-3)
    assert s["raw"]["read_over_raw_cold"] == pytest.approx(0.962, abs=1e-3)
    assert s["raw"]["read_over_raw_hashing"] == pytest.approx(0.8, abs=1e-3)
    text = "\n".join(table(s))
    assert "mxref READ (this-nohash) / fastest raw READ (cold, pump)" in text
    assert "chunked READ (this, hashing as chunks land) / single" in text
    without = summarize(100, 100 * 10**6, {k: v for k, v in rows.items() if k != "this-nohash"})
    assert without["transfer_variant"] == "this" and without["chunked_over_single"] == pytest.approx(0.8, abs=1e-3)
    assert "chunked_hashing_over_single" not in without


def test_a_goal_is_judged_on_the_median_of_its_rounds_with_a_distribution_free_interval() -> None:
    """Drift between rounds cancels within a round: one slow round of the single handle does not
    make the chunked READ look faster, and the interval's order statistics leave out the extremes."""
    single = [0.10] * 9
    single[4] = 0.30  # one round in which the machine stalled the single-handle READ
    chunked = [0.104] * 9
    rows = {"this": [_row(0.2, r) for r in chunked], "this-single": [_row(0.2, r) for r in single]}
    goal = summarize(100, 100 * 10**6, rows)["goals"]["chunked_over_single"]
    assert goal["paired"] == pytest.approx(0.962, abs=1e-3) and goal["met"] is True
    assert goal["ci"] == [pytest.approx(0.962, abs=1e-3), pytest.approx(0.962, abs=1e-3)] and goal["settled"] is True
    spread = [0.8, 0.9, 0.93, 0.95, 0.96, 0.97, 0.99, 1.0, 1.2]  # the interval's edges: 2nd and 8th of 9
    rows = {"this": [_row(0.2, 0.1 / r) for r in spread], "this-single": [_row(0.2, 0.1)] * 9}
    goal = summarize(100, 100 * 10**6, rows)["goals"]["chunked_over_single"]
    assert goal["paired"] == pytest.approx(0.96, abs=1e-3) and goal["ci"] == [0.9, 1.0] and goal["settled"] is False


@pytest.mark.parametrize(("n", "k"), [(5, None), (6, 1), (8, 1), (9, 2), (15, 4), (25, 8)])
def test_median_interval_takes_the_binomial_order_statistics(n: int, k: int | None) -> None:
    """k-th smallest and k-th largest of n: the largest k whose tail P(Binomial(n, 1/2) < k) stays
    within 2.5 % (published tables of the sign-test interval give these k)."""
    values = [float(i) for i in range(1, n + 1)]
    interval = median_interval(list(reversed(values)))
    assert interval == (None if k is None else (float(k), float(n + 1 - k)))
    if k is not None:
        assert sum(math.comb(n, j) for j in range(k)) / 2**n <= 0.025 < sum(math.comb(n, j) for j in range(k + 1)) / 2**n


def _binomial_below(n: int, q: float, k: int) -> float:
    """P(Binomial(n, q) < k), exactly (fractions of big integers would do too; n is small here)."""
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k))


@pytest.mark.parametrize("n", [100, 367, 368, 500, 1000])
def test_the_p99_interval_takes_the_binomial_order_statistics(n: int) -> None:
    """The k-th smallest bounds the 99th percentile from below when P(fewer than k below it) is
    within 2.5 %, the j-th from above when P(j or more below it) is; under 368 values not even
    the largest bounds it from above (0.99^367 > 2.5 %)."""
    values = [float(i) for i in range(1, n + 1)]
    interval = quantile_interval(list(reversed(values)), 0.99)
    if n < 368:
        assert interval is None
        return
    assert interval is not None
    k, j = int(interval[0]), int(interval[1])
    assert _binomial_below(n, 0.99, k) <= 0.025 < _binomial_below(n, 0.99, k + 1)
    assert 1 - _binomial_below(n, 0.99, j) <= 0.025 < 1 - _binomial_below(n, 0.99, j - 1)
    assert k < 0.99 * n <= j


def test_a_quantile_outside_zero_and_one_is_refused() -> None:
    with pytest.raises(ValueError, match="quantile 1 is not strictly between 0 and 1"):
        quantile_interval([1.0, 2.0], 1)
    assert quantile_interval([], 0.5) is None


def test_summary_refuses_empty_rows_and_no_bytes() -> None:
    with pytest.raises(ValueError, match="'this' has no rounds"):
        summarize(1, MIB, {"this": []})
    with pytest.raises(ValueError, match="nbytes"):
        summarize(0, 0, ROWS)


def test_the_table_shows_the_ratios_and_the_goal_marks() -> None:
    text = "\n".join(table(summarize(100, 100 * 10**6, ROWS, RAW, [2.0])))
    assert "this-single" in text and "TCP loopback ceiling (in-process, 127.0.0.1): 2.00 GB/s" in text
    assert "mxref READ (this) / fastest raw READ (cold, thread)" in text
    assert "chunked READ (this) / single-handle READ" in text
    assert ("(goal >= 0.95: MISSED by the median of 3 rounds' ratios, 0.90; rounds 0.83-1.00: too few rounds to "
            "settle, 6 at least)") in text
    settled = "\n".join(table(summarize(100, 100 * 10**6, {"this": [_row(0.2, 0.1)] * 6, "this-single": [_row(0.2, 0.1)] * 6})))
    assert "(goal >= 0.95: met by the median of 6 rounds' ratios, 1.00; 95% interval 1.00-1.00: settled)" in settled
    assert "fastest raw READ (warm) / ceiling" in text and "mxref READ / ceiling" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("thread ")]
    assert lines and "fastest cold+warm" in lines[0]


def test_bench_flags_defaults_and_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    parser = bench_load.build_parser()
    args = parser.parse_args([])
    assert args.mib == [64, 256] and args.rounds == 9 and args.single and args.ceiling and not args.raw
    assert args.raw_progress == ["pump", "thread"]
    assert parser.parse_args(["--mib", "64", "2048"]).mib == [64, 2048]
    for bad, message in ((["--mib", "2049"], "1..2048"), (["--mib", "0"], "1..2048"), (["--mib", "1.5"], "whole"),
                         (["--rounds", "0"], "must be >= 1"), (["--raw-progress", "busy"], "invalid choice")):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):  # python -m mxref bench takes the same flags
        mxref_main(["bench", "--mib", "4096"])
    assert "--mib" in capsys.readouterr().err


def test_reader_variants_chunked_single_and_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = bench_load.build_parser()
    variants = bench_load.reader_variants(parse(parser, [], BenchFlags), parser)
    assert list(variants) == ["this", "this-single", "this-nohash"]
    assert variants["this"][1] == () and variants["this-single"][1] == ("--read-chunk-mib", "0")
    assert variants["this-nohash"][1] == ("--no-hash-while-reading",)
    assert variants["this"][0] == variants["this-single"][0]
    assert (variants["this"][0] / "mxref" / "__main__.py").is_file(), "the variant runs this checkout"
    assert list(bench_load.reader_variants(parse(parser, ["--no-single"], BenchFlags), parser)) == ["this"]
    with pytest.raises(SystemExit):
        bench_load.reader_variants(parse(parser, ["--baseline", str(tmp_path)], BenchFlags), parser)
    assert "no mxref/__main__.py there" in capsys.readouterr().err
    named = bench_load.reader_variants(parse(parser, ["--variant", "c8w4=--read-chunk-mib 8 --read-window 4"], BenchFlags), parser)
    assert named["c8w4"][1] == ("--read-chunk-mib", "8", "--read-window", "4") and list(named)[-1] == "c8w4"
    for bad in ("nothing", "this=--x", "=--x"):
        with pytest.raises(SystemExit):
            bench_load.reader_variants(parse(parser, ["--variant", bad], BenchFlags), parser)
        assert "NAME=FLAGS" in capsys.readouterr().err


def test_the_reader_takes_its_chunk_window(capsys: pytest.CaptureFixture[str]) -> None:
    from mxref.__main__ import parse_argv
    from mxref.options import ReaderFlags

    args = parse_argv(["reader", "--read-chunk-mib", "8", "--read-window", "4"])
    assert isinstance(args, ReaderFlags) and (args.read_chunk_mib, args.read_window) == (8.0, 4)
    defaults = parse_argv(["reader"])
    assert isinstance(defaults, ReaderFlags) and defaults.read_window == 2
    with pytest.raises(SystemExit):
        parse_argv(["reader", "--read-window", "0"])
    assert "chunks in flight must be 1..64" in capsys.readouterr().err


def test_raw_summary_reports_the_faster_variant_and_each_median() -> None:
    s = bench.raw_summary(64 * MIB, {"pump": [1.0, 1.2, 1.1], "thread": [1.5, 0.9, 1.4]})
    assert (s["progress"], s["median_gbps"], s["gbps"]) == ("thread", 1.4, [1.5, 0.9, 1.4])
    assert s["variants"] == {"pump": {"median_gbps": 1.1, "gbps": [1.0, 1.2, 1.1]},
                             "thread": {"median_gbps": 1.4, "gbps": [1.5, 0.9, 1.4]}}
    with pytest.raises(ValueError, match="no raw READ samples"):
        bench.raw_summary(1, {"pump": []})


def test_raw_read_refuses_an_unknown_progress_before_starting_anything() -> None:
    with pytest.raises(ValueError, match="'spin'"):
        bench.raw_read(MIB, 1, progress="spin")
    with pytest.raises(SystemExit):
        bench.main(["--repeat", "0"])


def test_loopback_ceiling_at_a_small_size() -> None:
    rate = loopback_gbps(8 * MIB, timeout_s=20)
    assert math.isfinite(rate) and rate > 0
    top = loopback_ceiling(2 * MIB, repeat=3, timeout_s=20)
    assert isinstance(top["samples"], list) and len(top["samples"]) == 3
    assert top["gbps"] == sorted(top["samples"])[1]
    odd = loopback_gbps(3 * MIB + 17, timeout_s=20, buffer_bytes=MIB)  # not a multiple of the buffer
    assert odd > 0
    with pytest.raises(ValueError):
        loopback_gbps(0)
    with pytest.raises(ValueError):
        loopback_ceiling(MIB, repeat=0)


def test_the_read_phases_set_mxref_beside_the_raw_read_with_intervals() -> None:
    from mxref.bench.report import read_phases

    mine = [{"post_s": 0.001 * i, "poll_s": 0.1, "polls": 100 + i, "landing_s": 0.01} for i in range(1, 8)]
    theirs = [{"post_s": 0.0002, "poll_s": 0.09 + 0.001 * i, "polls": 1000} for i in range(7)]
    phases = read_phases(mine, theirs)
    assert phases["post_s"]["mxref"] == {"median": 0.004, "ci": [0.001, 0.007], "n": 7}  # 7 rounds: the extremes
    assert phases["poll_s"]["raw"]["median"] == pytest.approx(0.093)
    assert "raw" not in phases["landing_s"] and "first_touch_s" not in phases  # a phase neither side has: no row
    rows = {"this": [dict(_row(0.3, 0.1), read_phases=m) for m in mine]}
    raw = {"thread": [[1.0, 1.1]] * 7, "pump": [[0.5, 0.6]] * 7}
    s = summarize(100, 100 * 10**6, rows, raw, raw_phases={"thread": theirs, "pump": [{"poll_s": 9.0}] * 7})
    assert s["read_phases"]["raw"] == "thread"  # the phases of the raw READ the goal is judged against
    assert s["read_phases"]["phases"]["poll_s"]["raw"]["median"] == pytest.approx(0.093)
    lines = table(s)
    assert any(line.startswith("READ phases") for line in lines)
    assert any("posting" in line and "4.00 [1.00-7.00]" in line and "0.20 [0.20-0.20]" in line for line in lines)
