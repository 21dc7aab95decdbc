"""The arithmetic and the table of ``python -m mxref bench`` (``mxref.bench.load``), apart from the runs.

``summarize`` turns one model size's measured rows into its summary: medians per reader variant,
the raw two-process NIXL READ per source-progress variant and the fastest of them (the honest
baseline), the in-process TCP loopback ceiling, and the goal terms as ratios:

* mxref READ >= 0.95 x the fastest raw READ (``read_over_raw``: both the first READ on a fresh
  connection, "cold"; the ratio to the warm raw READ is shown beside it);
* chunked READ >= 0.95 x single-handle READ (``chunked_over_single``: the default chunks vs
  ``this-single``, ``--read-chunk-mib 0``);
* raw / ceiling and mxref / ceiling: how much of this machine's TCP loopback they reach.

A goal term is judged on its rounds: the ratio taken within each interleaved round (``rounds``,
their ``spread``), where both sides ran back to back under the same load, so drift in the
machine's speed between rounds cancels. ``paired`` is their median and ``met`` says whether it
reaches the goal; ``ci`` is a distribution-free 95 % interval for that median (``median_interval``:
two order statistics of the rounds, none under 6 rounds), and the verdict is ``settled`` when the
whole interval falls on one side of the goal. The ratio of the medians (``value``) is kept beside
it. On a machine whose speed drifts (this one's GB/s moved by a factor of 1.5 within a session,
and one READ in ten of 256 MiB took 3x the others) an unsettled verdict is one more run's worth
of evidence, not a result: more ``--rounds`` narrow the interval.

Both READ terms are taken on the transfer alone: reader ``this-nohash`` where it ran (the
default reader hashes landed tensors between its polls, checksum work the others do after
their READ), else ``this``. ``read_phases`` sets that READ's phases beside the fastest cold
raw READ's, each a median over the rounds with its interval. The default's own ratios are kept beside them
(``read_over_raw_hashing``, ``chunked_hashing_over_single``).

``table`` renders a summary as lines of text. Nothing here starts a process.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

READ_OVER_RAW_GOAL = 0.95
CHUNKED_OVER_SINGLE_GOAL = 0.95
CHUNKED, SINGLE, NOHASH = "this", "this-single", "this-nohash"


def _med(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def quantile_interval(values: Sequence[float], q: float, confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the ``q`` quantile of what ``values``
    sample: two of their order statistics. Each value falls below that quantile with probability
    ``q`` whatever the distribution, so the count below it is Binomial(n, q): the k-th smallest
    value lies above the quantile only when fewer than k fall below it, and the j-th smallest
    lies below it only when j or more do. The interval takes the largest k and the smallest j
    whose chances stay within half of ``1 - confidence`` each. None when the values cannot bound
    it on one side (under 6 values for the median at 95 %; under 368 for the 99th percentile's
    upper end)."""
    if not 0 < q < 1:
        raise ValueError(f"quantile {q} is not strictly between 0 and 1")
    n, tail = len(values), (1 - confidence) / 2
    if n == 0:
        return None
    log_q, log_p = math.log(q), math.log1p(-q)
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_q + (n - i) * log_p)
           for i in range(n + 1)]  # P(Binomial(n, q) = i), in logs: n may be large
    below, k = 0.0, 0
    while k < n and below + pmf[k] <= tail:  # P(B < k + 1) still within the tail
        below += pmf[k]
        k += 1
    above, j = 0.0, n + 1
    while j > 1 and above + pmf[j - 1] <= tail:  # P(B >= j - 1) still within the tail
        above += pmf[j - 1]
        j -= 1
    if k == 0 or j > n:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[j - 1]


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the median (``quantile_interval``): the
    sign-test interval, the k-th smallest and k-th largest value. None under 6 values at 95 %."""
    return quantile_interval(values, 0.5, confidence)


def median_bounds(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """An interval for the median of what ``values`` sample, and its exact coverage: the k-th
    smallest and k-th largest value cover the median unless k or fewer values fall on one side of
    it, so with probability 1 - 2 P(Binomial(n, 1/2) < k), whatever the distribution. k is the
    largest that keeps ``confidence`` (``median_interval``'s interval, 6 values or more at 95 %);
    with too few values for that, the values' range, whose coverage 1 - 2 x 0.5^n falls short
    (50 % for 2 values, 94 % for 5): an interval still, but one that settles nothing at
    ``confidence``. None under 2 values."""
    n = len(values)
    if n < 2:
        return None

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / float(2**n)

    k = 1
    while k + 1 <= n + 1 - (k + 1) and coverage(k + 1) >= confidence:
        k += 1
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k], coverage(k)


def _goal(value: float | None, goal: float, rounds: Sequence[float] = ()) -> dict[str, Any]:
    """A goal term against ``goal``: judged on the median of the per-round ratios when there are
    rounds (the ratio of medians, ``value``, beside it), else on ``value``."""
    out: dict[str, Any] = {"value": None if value is None else round(value, 3), "goal": goal,
                           "met": None if value is None else value >= goal}
    if value is not None and rounds:
        paired = _med(rounds)
        ci = median_interval(rounds)
        out.update(rounds=[round(r, 3) for r in rounds], spread=[round(min(rounds), 3), round(max(rounds), 3)],
                   paired=round(paired, 3), met=paired >= goal,
                   ci=None if ci is None else [round(ci[0], 3), round(ci[1], 3)],
                   settled=ci is not None and (ci[0] >= goal or ci[1] < goal))
    return out


def _per_round(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """``num[i] / den[i]`` for the rounds both sides ran (round i of each: the same interleaved round)."""
    return [n / d for n, d in zip(num, den) if d > 0]


# the phases of one READ, mxref's (``ReadClock`` and the target's load phases) and the raw one's
# (``mxref.bench.raw``), in the order they happen; the counts and the window's idling after them
READ_PHASES = (("first_touch_s", "first touch of the target (allocate, fault in)"),
               ("agent_s", "agent creation"), ("register_s", "registration"),
               ("prep_s", "descriptor lists / handle prepared"), ("post_s", "posting (make + transfer)"),
               ("poll_s", "polling: inside check_xfer_state (the bytes move)"),
               ("landing_s", "checksums between polls"), ("nap_s", "asleep between polls (no bytes moving)"),
               ("release_s", "release (handles, lists)"),
               ("other_s", "the loop's own bookkeeping"), ("total_s", "the READ call in all"))
READ_COUNTS = (("polls", "check_xfer_state calls"), ("posts", "handles posted"), ("naps", "naps between polls"),
               ("chunk_wait_s", "a chunk's median wait, post to done"),
               ("post_lag_s", "window idle: completion to refill, summed"),
               ("underfull_s", "window idle: fewer than W in flight, summed"))


def _interval(values: Sequence[float]) -> dict[str, Any]:
    ci = median_interval(values)
    return {"median": round(_med(values), 6), "ci": None if ci is None else [round(ci[0], 6), round(ci[1], 6)],
            "n": len(values)}


def read_phases(mxref: Sequence[Mapping[str, float]], raw: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Per READ phase (``READ_PHASES``, ``READ_COUNTS``): mxref's and the raw READ's median over the
    rounds, each with its 95 % interval (``median_interval``), where that side has the phase."""
    out: dict[str, Any] = {}
    for key, label in (*READ_PHASES, *READ_COUNTS):
        row: dict[str, Any] = {"label": label}
        for side, samples in (("mxref", mxref), ("raw", raw)):
            values = [float(s[key]) for s in samples if key in s]
            if values:
                row[side] = _interval(values)
        if len(row) > 1:
            out[key] = row
    return out


def summarize(mib: float, nbytes: int, rows: Mapping[str, Sequence[Mapping[str, Any]]],
              raw: Mapping[str, Sequence[Sequence[float]]] | None = None,
              ceiling: Sequence[float] | None = None,
              raw_phases: Mapping[str, Sequence[Mapping[str, float]]] | None = None) -> dict[str, Any]:
    """One size's summary. ``rows``: per reader variant, one dict per round (``load_s``, ``read_s``,
    ``wall_s``, ``phases``, optionally ``read_phases``); ``raw``: per source progress, one
    ``[cold, warm]`` GB/s pair per round; ``ceiling``: loopback GB/s samples; ``raw_phases``: per
    source progress, the cold READ's phases of each round (``read_phases`` sets them beside mxref's)."""
    if nbytes <= 0:
        raise ValueError(f"nbytes ({nbytes}) must be > 0")
    summary: dict[str, Any] = {"mib": mib, "bytes": nbytes, "rounds": max((len(r) for r in rows.values()), default=0),
                               "variants": {}}
    for v, rs in rows.items():
        if not rs:
            raise ValueError(f"reader variant {v!r} has no rounds")
        load, read, wall = _med([r["load_s"] for r in rs]), _med([r["read_s"] for r in rs]), _med([r["wall_s"] for r in rs])
        names = sorted({p for r in rs for p in r.get("phases", {})})
        phases = {p: round(_med([r.get("phases", {}).get(p, 0.0) for r in rs]), 4) for p in names}
        summary["variants"][v] = {
            "load_s": round(load, 4), "read_s": round(read, 4), "read_gbps": round(nbytes / read / 1e9, 3),
            "ratio": round(load / read, 3), "wall_s": round(wall, 4), "phases": phases,
            "load_samples": [round(r["load_s"], 4) for r in rs], "read_samples": [round(r["read_s"], 4) for r in rs]}
        windows = [r["window"] for r in rs if r.get("window")]
        if windows:  # a chunked READ: medians of where its window idled
            summary["variants"][v]["window"] = {k: round(_med([w[k] for w in windows]), 6) for k in sorted(windows[0])}
    variants = summary["variants"]
    transfer = NOHASH if NOHASH in variants else CHUNKED  # the chunked READ without checksum work in it
    summary["transfer_variant"] = transfer
    this_gbps = nbytes / variants[transfer]["read_s"] / 1e9 if transfer in variants else None
    hashing_read_s = variants[CHUNKED]["read_s"] if transfer != CHUNKED and CHUNKED in variants else None
    if "baseline" in variants and CHUNKED in variants:
        summary["this_over_baseline_load"] = round(variants[CHUNKED]["load_s"] / variants["baseline"]["load_s"], 3)
    chunked_over_single = None
    chunked_rounds: list[float] = []
    read_rounds: list[float] = []
    if transfer in variants and SINGLE in variants:
        chunked_rounds = _per_round([r["read_s"] for r in rows[SINGLE]], [r["read_s"] for r in rows[transfer]])
        chunked_over_single = variants[SINGLE]["read_s"] / variants[transfer]["read_s"]  # GB/s ratio, same bytes
        summary["chunked_over_single"] = round(chunked_over_single, 3)
        if hashing_read_s is not None:
            summary["chunked_hashing_over_single"] = round(variants[SINGLE]["read_s"] / hashing_read_s, 3)
    read_over_raw = None
    raw_warm = None
    if raw and any(raw.values()):
        cold = {k: round(_med([p[0] for p in pairs]), 3) for k, pairs in raw.items() if pairs}
        warm = {k: round(_med([p[1] for p in pairs]), 3) for k, pairs in raw.items() if pairs}
        per = {k: {"cold_gbps": cold[k], "warm_gbps": warm[k], "samples": [[round(x, 3) for x in p] for p in raw[k]]}
               for k in cold}
        cold_best = max(cold, key=lambda k: cold[k])
        warm_best = max(warm, key=lambda k: warm[k])
        raw_cold, raw_warm = cold[cold_best], warm[warm_best]
        summary["raw"] = {"variants": per, "cold_gbps": raw_cold, "cold_fastest": cold_best,
                          "warm_gbps": raw_warm, "warm_fastest": warm_best}
        if this_gbps is not None:
            read_over_raw = this_gbps / raw_cold
            read_rounds = _per_round([nbytes / r["read_s"] / 1e9 for r in rows[transfer]],
                                     [p[0] for p in raw[cold_best]])
            summary["raw"].update(this_read_gbps=round(this_gbps, 3), read_over_raw_cold=round(read_over_raw, 3),
                                  read_over_raw_warm=round(this_gbps / raw_warm, 3))
            if hashing_read_s is not None:
                summary["raw"]["read_over_raw_hashing"] = round(nbytes / hashing_read_s / 1e9 / raw_cold, 3)
    if raw and any(raw.values()) and transfer in rows:
        mine = [r["read_phases"] for r in rows[transfer] if r.get("read_phases")]
        theirs = list((raw_phases or {}).get(summary["raw"]["cold_fastest"], []))
        if mine or theirs:
            summary["read_phases"] = {"mxref": transfer, "raw": summary["raw"]["cold_fastest"],
                                      "phases": read_phases(mine, theirs)}
    if ceiling:
        top = _med(ceiling)
        summary["ceiling"] = {"gbps": round(top, 3), "samples": [round(x, 3) for x in ceiling]}
        if raw_warm is not None:
            summary["ceiling"]["raw_over_ceiling"] = round(raw_warm / top, 3)
        if this_gbps is not None:
            summary["ceiling"]["read_over_ceiling"] = round(this_gbps / top, 3)
    summary["goals"] = {"read_over_raw": _goal(read_over_raw, READ_OVER_RAW_GOAL, read_rounds),
                        "chunked_over_single": _goal(chunked_over_single, CHUNKED_OVER_SINGLE_GOAL, chunked_rounds)}
    return summary


def _mark(goal: Mapping[str, Any]) -> str:
    verdict = "met" if goal["met"] else "MISSED"
    if "spread" not in goal:
        return f"(goal >= {goal['goal']:.2f}: {verdict})"
    rounds = len(goal["rounds"])
    judged = f"goal >= {goal['goal']:.2f}: {verdict} by the median of {rounds} rounds' ratios, {goal['paired']:.2f}"
    if goal["ci"] is None:
        low, high = goal["spread"]
        return f"({judged}; rounds {low:.2f}-{high:.2f}: too few rounds to settle, 6 at least)"
    low, high = goal["ci"]
    return f"({judged}; 95% interval {low:.2f}-{high:.2f}: {'settled' if goal['settled'] else 'not settled'})"


def table(summary: Mapping[str, Any]) -> list[str]:
    """The printed table of one size's summary."""
    out = [f"{summary['mib']:g} MiB, {summary['rounds']} interleaved rounds, medians:",
           f"{'reader':12s} {'load s':>7s} {'READ s':>7s} {'READ GB/s':>9s} {'load/READ':>9s} {'1.5xREAD+0.25':>13s} "
           f"{'proc wall':>9s}  phases"]
    for v, s in summary["variants"].items():
        out.append(f"{v:12s} {s['load_s']:7.3f} {s['read_s']:7.3f} {s['read_gbps']:9.2f} {s['ratio']:9.2f} "
                   f"{1.5 * s['read_s'] + 0.25:13.3f} {s['wall_s']:9.3f}  "
                   + " ".join(f"{p}={x:.3f}" for p, x in s["phases"].items() if x))
    idle = {v: s["window"] for v, s in summary["variants"].items() if s.get("window")}
    if idle:
        out.append(f"{'chunked':12s} {'chunks':>7s} {'1st post ms':>11s} {'post lag ms':>11s} {'not full ms':>11s}"
                   "   (where the window idled, medians)")
        for v, w in idle.items():
            out.append(f"{v:12s} {w['chunks']:7.0f} {w['first_post_s'] * 1e3:11.2f} {w['post_lag_s'] * 1e3:11.2f} "
                       f"{w['underfull_s'] * 1e3:11.2f}")
    raw = summary.get("raw")
    if raw:
        out.append(f"{'raw source':12s} {'cold GB/s':>9s} {'warm GB/s':>9s}   (two processes, one handle, tight-polling reader)")
        for k, s in raw["variants"].items():
            best = [w for w, f in (("cold", raw["cold_fastest"]), ("warm", raw["warm_fastest"])) if f == k]
            out.append((f"{k:12s} {s['cold_gbps']:9.2f} {s['warm_gbps']:9.2f}   "
                        + (f"fastest {'+'.join(best)}" if best else "")).rstrip())
    out.extend(phase_table(summary))
    ceiling = summary.get("ceiling")
    if ceiling:
        out.append(f"TCP loopback ceiling (in-process, 127.0.0.1): {ceiling['gbps']:.2f} GB/s")
    out.append("ratios:")
    goals = summary["goals"]
    ratios: list[tuple[str, float, str]] = []
    who = summary.get("transfer_variant", CHUNKED)
    if raw and "read_over_raw_cold" in raw:
        ratios.append((f"mxref READ ({who}) / fastest raw READ (cold, {raw['cold_fastest']})", raw["read_over_raw_cold"],
                       _mark(goals["read_over_raw"])))
        ratios.append((f"mxref READ ({who}) / fastest raw READ (warm, {raw['warm_fastest']})", raw["read_over_raw_warm"], ""))
        if "read_over_raw_hashing" in raw:
            ratios.append((f"mxref READ ({CHUNKED}, hashing as chunks land) / raw (cold)", raw["read_over_raw_hashing"], ""))
    if "chunked_over_single" in summary:
        ratios.append((f"chunked READ ({who}) / single-handle READ", summary["chunked_over_single"],
                       _mark(goals["chunked_over_single"])))
    if "chunked_hashing_over_single" in summary:
        ratios.append((f"chunked READ ({CHUNKED}, hashing as chunks land) / single", summary["chunked_hashing_over_single"], ""))
    if "this_over_baseline_load" in summary:
        ratios.append(("whole load, this / baseline", summary["this_over_baseline_load"], ""))
    if ceiling and "raw_over_ceiling" in ceiling:
        ratios.append(("fastest raw READ (warm) / ceiling", ceiling["raw_over_ceiling"], ""))
    if ceiling and "read_over_ceiling" in ceiling:
        ratios.append(("mxref READ / ceiling", ceiling["read_over_ceiling"], ""))
    width = max((len(label) for label, _, _ in ratios), default=0)
    out.extend(f"  {label:{width}s} {value:6.2f}  {mark}".rstrip() for label, value, mark in ratios)
    return out


def _cell(entry: Mapping[str, Any] | None, scale: float) -> str:
    if entry is None:
        return "-"
    text = f"{entry['median'] * scale:.2f}" if scale != 1 else f"{entry['median']:.0f}"
    if entry["ci"] is not None:
        low, high = entry["ci"]
        text += f" [{low * scale:.2f}-{high * scale:.2f}]" if scale != 1 else f" [{low:.0f}-{high:.0f}]"
    return text


def phase_table(summary: Mapping[str, Any]) -> list[str]:
    """The READ's phases, mxref beside the raw READ: medians over the rounds [95 % interval], ms."""
    section = summary.get("read_phases")
    if not section:
        return []
    out = [f"READ phases, ms (counts as is): mxref ({section['mxref']}) beside raw ({section['raw']}, cold); "
           "median [95% interval] over the rounds"]
    for key, row in section["phases"].items():
        scale = 1e3 if key.endswith("_s") else 1.0  # seconds shown as ms; counts as they are
        out.append(f"  {row['label']:50s} {_cell(row.get('mxref'), scale):>24s}  {_cell(row.get('raw'), scale):>24s}")
    return out
