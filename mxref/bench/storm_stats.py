"""The arithmetic of ``python -m mxref bench storm`` (``mxref.bench.storm``), apart from the runs.

A storm round: R readers told to load at the same instant (the bench's clock, ``go``), each
result line stamped by the bench when it arrives (``done``), never by the reader's own clock.
``storm_round`` turns one round's results into its figures: the aggregate (R x bytes over the
time from the go to the last verified load), the per-reader load times, READs per source (the
source each verified load names), attempts, fallbacks and stalls. A raw fan-out round (the
ceiling) has the same shape: the same bytes, each raw reader on its own source.

``summarize_cell`` judges one (readers, sources) cell on its rounds. Every figure is taken per
round and given as the median over the rounds with an interval for that median
(``mxref.bench.report.median_bounds``: distribution-free, two of the rounds' values; with 6 rounds
or more it covers with 95 %, with 2 to 5 it is the rounds' range and covers with less, its
coverage said beside it): the aggregate GB/s, the raw fan-out's, their ratio within each round
(both storms back to back, alternating who goes first), the round's p50 and p99 of its readers'
load times and their ratio, a frozen storm's p99. Each goal is a same-run ratio, judged by its
interval: MET when the interval lies wholly on the goal's side, MISSED when wholly on the other,
UNDECIDED when it straddles the goal or covers with under 95 % (too few rounds):

* aggregate >= 0.8 x the raw fan-out's (``aggregate_over_raw``): the per-round ratio;
* per-reader p99 <= 2 x p50 (``p99_over_p50``): the per-round ratio;
* the storm with one source frozen mid-storm within 2 x the healthy storm's p99
  (``frozen_over_healthy_p99``): the frozen rounds' median p99 over the healthy rounds'
  (not paired), each median's interval at 97.5 % so their quotient's covers with 95 % at least;
  a frozen round whose freeze never landed (over before it was due) is left out and counted;
* no source serves more than 1.5 x its fair share of READs (``spread``): the fair share of a
  round is ceil(R / S) (no assignment does better); judged on the worst round as seen;
* no fallback and no stall in a healthy storm (``healthy``): counts, zero or not.

The pooled load times of every round (``load``: p50, p99, max, with ``quantile_interval``'s
intervals where the values bound them) are kept beside the figures. Nothing here starts a process.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mxref.bench.report import median_bounds, quantile_interval

AGGREGATE_OVER_RAW_GOAL = 0.8
FAIR_SHARE_GOAL = 1.5
P99_OVER_P50_GOAL = 2.0
FROZEN_OVER_HEALTHY_P99_GOAL = 2.0
CONFIDENCE = 0.95
MET, MISSED, UNDECIDED = "MET", "MISSED", "UNDECIDED"
FAILED_OUTCOMES = ("transfer_retry", "transfer_fallback")
"""An attempt whose READ failed or stalled and was released (``mxref.roles.reader``)."""
STALL_WORDS = re.compile(r"stalled|timed out", re.IGNORECASE)
"""A failed attempt's error that says its READ was called a stall (mxref: ``READ stalled``; the
ModelExpress client: ``timed out``), not refused or broken."""


@dataclass(frozen=True)
class ReaderOutcome:
    """One reader's load in a round, as the bench saw it."""

    done_s: float  # bench clock (monotonic) when its result line arrived
    load_s: float  # the reader's whole load (ListSources to a verified load)
    source: str | None  # the source its verified load names; None when it did not load over RDMA
    path: str  # rdma | disk | none
    verified: bool
    nbytes: int
    attempts: tuple[str, ...] = ()  # each attempt's outcome, in order
    stalls: int = 0  # attempts whose READ was called a stall (the window deadline or the budget)


@dataclass
class StormRound:
    readers: int
    go_s: float
    outcomes: list[ReaderOutcome] = field(default_factory=list)


def reader_outcome(result: Mapping[str, Any], done_s: float) -> ReaderOutcome:
    """A ``ReaderOutcome`` from an mxref reader's ``result`` (``LoadResult``)."""
    return ReaderOutcome(done_s=done_s, load_s=float(result.get("seconds") or 0.0),
                         source=result.get("source") if result.get("path") == "rdma" else None,
                         path=str(result.get("path")), verified=result.get("integrity") == "verified" and bool(result.get("ok")),
                         nbytes=int(result.get("bytes") or 0),
                         attempts=tuple(str(a.get("outcome", "")) for a in result.get("attempts") or ()),
                         stalls=sum(1 for a in result.get("attempts") or () if STALL_WORDS.search(str(a.get("error") or ""))))


def storm_round(rnd: StormRound, nbytes: int) -> dict[str, Any]:
    """One round's figures. Only verified loads of the whole model count towards the aggregate."""
    if rnd.readers < 1 or nbytes <= 0:
        raise ValueError(f"a storm round needs readers >= 1 and bytes > 0 (got {rnd.readers}, {nbytes})")
    if len(rnd.outcomes) != rnd.readers:
        raise ValueError(f"{len(rnd.outcomes)} results for {rnd.readers} readers")
    good = [o for o in rnd.outcomes if o.verified and o.path == "rdma" and o.nbytes == nbytes]
    wall = max(o.done_s for o in rnd.outcomes) - rnd.go_s
    per_source = Counter(o.source for o in good if o.source)
    attempts = sum(max(1, len(o.attempts)) for o in rnd.outcomes)
    return {
        "readers": rnd.readers, "wall_s": round(wall, 4),
        "aggregate_gbps": round(len(good) * nbytes / wall / 1e9, 3) if wall > 0 else float("nan"),
        "verified": len(good), "bytes_verified": len(good) * nbytes,
        "load_s": [round(o.load_s, 4) for o in rnd.outcomes],
        "reads_per_source": dict(sorted(per_source.items())),
        "attempts": attempts,
        "fallbacks": sum(1 for o in rnd.outcomes if o.path != "rdma"),
        "failed_attempts": sum(1 for o in rnd.outcomes for a in o.attempts if a in FAILED_OUTCOMES),
        "stalls": sum(o.stalls for o in rnd.outcomes),
    }


def max_over_fair(reads_per_source: Mapping[str, int], sources: int, readers: int) -> float:
    """The busiest source's READs over the fair share ceil(readers / sources)."""
    if sources < 1 or readers < 1:
        raise ValueError(f"sources and readers must be >= 1 (got {sources}, {readers})")
    return max(reads_per_source.values(), default=0) / math.ceil(readers / sources)


def quantiles_s(values: Sequence[float]) -> dict[str, Any]:
    """p50, p99 and max of load times (s), with distribution-free 95 % intervals of p50 and p99
    (None where too few values bound one)."""
    if not values:
        return {"n": 0, "p50_s": None, "p99_s": None, "max_s": None, "p50_ci": None, "p99_ci": None}
    ordered = sorted(values)
    if len(ordered) == 1:
        q50 = q99 = ordered[0]
    else:
        q = statistics.quantiles(ordered, n=100, method="inclusive")
        q50, q99 = q[49], q[98]

    def ci(p: float) -> list[float] | None:
        got = quantile_interval(ordered, p)
        return None if got is None else [round(got[0], 4), round(got[1], 4)]

    return {"n": len(ordered), "p50_s": round(q50, 4), "p99_s": round(q99, 4), "max_s": round(ordered[-1], 4),
            "p50_ci": ci(0.5), "p99_ci": ci(0.99)}


def figure(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """One figure over the rounds: the median of its per-round values, the interval of that median
    and the interval's coverage (``median_bounds``: the rounds' range under 6 rounds, with its
    lower coverage), the rounds' values."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return {"median": None, "ci": None, "coverage": None, "n": 0, "rounds": []}
    bounds = median_bounds(values, confidence)
    return {"median": round(float(statistics.median(values)), 4),
            "ci": None if bounds is None else [round(bounds[0], 4), round(bounds[1], 4)],
            "coverage": None if bounds is None else round(bounds[2], 4), "n": len(values),
            "rounds": [round(v, 4) for v in values]}


def quotient(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    """The median of ``num``'s rounds over the median of ``den``'s (rounds not paired: a frozen
    storm's over the healthy ones'), with the widest interval the two medians' intervals allow.
    Each side's interval is taken at 1 - (1 - ``CONFIDENCE``) / 2, so the quotient's covers with
    at least ``CONFIDENCE`` (either side missing its median is the only way out, Bonferroni);
    its ``coverage`` is that bound, c_num + c_den - 1, at best."""
    side = 1 - (1 - CONFIDENCE) / 2
    a, b = figure(num, side), figure(den, side)
    if a["median"] is None or not b["median"]:
        return {"median": None, "ci": None, "coverage": None, "n": 0}
    ci = cov = None
    if a["ci"] is not None and b["ci"] is not None and b["ci"][0] > 0:
        ci = [round(a["ci"][0] / b["ci"][1], 4), round(a["ci"][1] / b["ci"][0], 4)]
        cov = round(max(0.0, a["coverage"] + b["coverage"] - 1), 4)
    return {"median": round(a["median"] / b["median"], 4), "ci": ci, "coverage": cov, "n": min(a["n"], b["n"]),
            "coverage_at_least": True}


def judged(fig: Mapping[str, Any], goal: float, at_least: bool) -> dict[str, Any]:
    """``fig`` (``figure``, ``quotient``) against ``goal`` (``>=`` when ``at_least``, else ``<=``):
    MET when its interval lies wholly on the goal's side, MISSED when wholly on the other,
    UNDECIDED when it straddles the goal or covers with less than ``CONFIDENCE`` (too few rounds).
    ``met`` says on which side the estimate alone lies."""
    value, ci, cov = fig["median"], fig["ci"], fig["coverage"]
    good: Any = (lambda x: x >= goal) if at_least else (lambda x: x <= goal)
    verdict = UNDECIDED
    if ci is not None and cov is not None and cov >= CONFIDENCE:
        if good(ci[0]) and good(ci[1]):
            verdict = MET
        elif not good(ci[0]) and not good(ci[1]):
            verdict = MISSED
    return {"value": None if value is None else round(value, 3), "goal": goal, "sense": ">=" if at_least else "<=",
            "met": None if value is None else bool(good(value)),
            "ci": None if ci is None else [round(ci[0], 3), round(ci[1], 3)], "coverage": cov, "n": fig["n"],
            "coverage_at_least": bool(fig.get("coverage_at_least")), "verdict": verdict, "settled": verdict != UNDECIDED}


def observed(value: Any, met: bool, goal: Any, sense: str) -> dict[str, Any]:
    """A goal on what every round showed (the worst round, counts): no estimate, no interval."""
    return {"value": value, "goal": goal, "sense": sense, "met": met, "ci": None, "coverage": None,
            "verdict": MET if met else MISSED, "settled": True}


def round_quantiles(load_s: Sequence[float]) -> tuple[float, float]:
    """One round's p50 and p99 of its readers' load times (with under 100 readers, the p99 lies
    between the slowest two)."""
    if len(load_s) == 1:
        return load_s[0], load_s[0]
    q = statistics.quantiles(load_s, n=100, method="inclusive")
    return q[49], q[98]


def summarize_cell(readers: int, sources: int, nbytes: int, storms: Sequence[Mapping[str, Any]],
                   raws: Sequence[Mapping[str, Any]], frozen: Sequence[Mapping[str, Any]] = (),
                   listings_s: Sequence[float] = ()) -> dict[str, Any]:
    """One (readers, sources) cell: its rounds (``storm_round`` dicts) summed up and judged."""
    if not storms:
        raise ValueError(f"cell {readers}x{sources}: no storm rounds")
    loads = quantiles_s([x for s in storms for x in s["load_s"]])
    aggregates = [s["aggregate_gbps"] for s in storms]
    per_round = [round_quantiles(s["load_s"]) for s in storms]
    figures: dict[str, Any] = {
        "aggregate_gbps": figure(aggregates), "p50_s": figure([p50 for p50, _ in per_round]),
        "p99_s": figure([p99 for _, p99 in per_round]),
        "p99_over_p50": figure([p99 / p50 for p50, p99 in per_round if p50 > 0])}
    out: dict[str, Any] = {
        "readers": readers, "sources": sources, "bytes": nbytes, "rounds": len(storms),
        "aggregate_gbps": round(float(statistics.median(aggregates)), 3), "aggregate_rounds": aggregates,
        "load": loads, "figures": figures,
        "reads_per_source": [s["reads_per_source"] for s in storms],
        "attempts": sum(s["attempts"] for s in storms), "fallbacks": sum(s["fallbacks"] for s in storms),
        "stalls": sum(s["stalls"] for s in storms),
        "failed_attempts": sum(s["failed_attempts"] for s in storms),
        "bytes_verified": sum(s["bytes_verified"] for s in storms),
        "list_sources": quantiles_ms(listings_s),
    }
    spreads = [max_over_fair(s["reads_per_source"], sources, readers) for s in storms]
    out["spread_rounds"] = [round(x, 3) for x in spreads]
    goals: dict[str, Any] = {"spread": observed(round(max(spreads), 3), max(spreads) <= FAIR_SHARE_GOAL,
                                                FAIR_SHARE_GOAL, "<=")}
    goals["p99_over_p50"] = judged(figures["p99_over_p50"], P99_OVER_P50_GOAL, at_least=False)
    healthy = out["fallbacks"] == 0 and out["stalls"] == 0 and out["attempts"] == readers * len(storms)
    goals["healthy"] = observed({"fallbacks": out["fallbacks"], "stalls": out["stalls"],
                                 "failed_attempts": out["failed_attempts"],
                                 "extra_attempts": out["attempts"] - readers * len(storms)}, healthy, 0, "==")
    if raws:
        out["raw_gbps"] = round(float(statistics.median(r["aggregate_gbps"] for r in raws)), 3)
        out["raw_rounds"] = [r["aggregate_gbps"] for r in raws]
        figures["raw_gbps"] = figure(out["raw_rounds"])
        # round i of each: the same interleaved round, back to back
        figures["storm_over_raw"] = figure([n / d for n, d in zip(aggregates, out["raw_rounds"]) if d > 0])
        goals["aggregate_over_raw"] = judged(figures["storm_over_raw"], AGGREGATE_OVER_RAW_GOAL, at_least=True)
    if frozen:
        landed = [s for s in frozen if s.get("freeze_landed", True)]  # a round over before its freeze was due: not frozen
        frozen_loads = quantiles_s([x for s in landed for x in s["load_s"]])
        out["frozen"] = {"rounds": len(landed), "not_landed": len(frozen) - len(landed), "load": frozen_loads,
                         "fallbacks": sum(s["fallbacks"] for s in landed), "stalls": sum(s["stalls"] for s in landed),
                         "failed_attempts": sum(s["failed_attempts"] for s in landed),
                         "attempts": sum(s["attempts"] for s in landed),
                         "verified": sum(s["verified"] for s in landed)}
        if landed:
            frozen_p99 = [round_quantiles(s["load_s"])[1] for s in landed]
            figures["frozen_p99_s"] = figure(frozen_p99)
            figures["frozen_over_healthy_p99"] = quotient(frozen_p99, [p99 for _, p99 in per_round])
            goals["frozen_over_healthy_p99"] = judged(figures["frozen_over_healthy_p99"],
                                                      FROZEN_OVER_HEALTHY_P99_GOAL, at_least=False)
    out["goals"] = goals
    return out


def quantiles_ms(values: Sequence[float]) -> dict[str, Any]:
    """ListSources latencies (s) as p50/p99/max in ms with the p99's 95 % interval."""
    q = quantiles_s(values)
    ms = {k: None if q[k] is None else round(q[k] * 1000, 3) for k in ("p50_s", "p99_s", "max_s")}
    ci = q["p99_ci"]
    return {"n": q["n"], "p50_ms": ms["p50_s"], "p99_ms": ms["p99_s"], "max_ms": ms["max_s"],
            "p99_ci_ms": None if ci is None else [round(ci[0] * 1000, 3), round(ci[1] * 1000, 3)]}


def interval_text(fig: Mapping[str, Any] | None, digits: int = 2) -> str:
    """``median [low-high]``; a ``*`` after an interval that covers with under ``CONFIDENCE``."""
    if fig is None or fig.get("median") is None:
        return "-"
    text = f"{fig['median']:.{digits}f}"
    if fig.get("ci") is not None:
        low, high = fig["ci"]
        text += f" [{low:.{digits}f}-{high:.{digits}f}]" + ("*" if (fig["coverage"] or 0) < CONFIDENCE else "")
    return text


def mark(goal: Mapping[str, Any]) -> str:
    """A goal's line: value, interval and its coverage, the goal, the verdict."""
    if goal["met"] is None:
        return "n/a"
    head = f"{goal['value']}"
    if goal.get("ci") is not None:
        at_least = ">=" if goal.get("coverage_at_least") else ""
        head += f" [{goal['ci'][0]}-{goal['ci'][1]}, {at_least}{100 * goal['coverage']:.1f}%]"
    elif goal.get("n") is not None:
        head += f" [no interval from {goal['n']} round(s)]"
    why = ""
    if goal["verdict"] == UNDECIDED:
        why = (" (too few rounds for a 95% interval)" if goal.get("coverage") is None or goal["coverage"] < CONFIDENCE
               else " (the interval straddles the goal)")
    return f"{head} {goal['sense']} {goal['goal']}: {goal['verdict']}{why}"


def table(cells: Sequence[Mapping[str, Any]], subject: str = "mxref") -> list[str]:
    """The storm table: one line per cell (each figure the median over the rounds [its interval],
    ``*``: an interval of under 95 % coverage), then each cell's goals."""
    cols = (("GB/s", "aggregate_gbps", 2, 18), ("raw GB/s", "raw_gbps", 2, 18), ("storm/raw", "storm_over_raw", 2, 18),
            ("p50 s", "p50_s", 3, 21), ("p99 s", "p99_s", 3, 21), ("p99/p50", "p99_over_p50", 2, 18),
            ("frozen p99 s", "frozen_p99_s", 3, 21), ("frozen/healthy p99", "frozen_over_healthy_p99", 2, 18))
    out = [f"{'subject':13s} {'R':>3s} {'S':>2s} " + " ".join(f"{name:>{w}s}" for name, _, _, w in cols)
           + f" {'READs/source':>16s} {'att':>4s} {'fail':>4s} {'stall':>5s} {'fb':>3s} {'List p99 ms':>11s}"]
    for c in cells:
        figs = c.get("figures", {})
        spread = "/".join(str(sum(r.get(k, 0) for r in c["reads_per_source"]))
                          for k in sorted({k for r in c["reads_per_source"] for k in r}))
        list_p99 = c["list_sources"]["p99_ms"]
        out.append(f"{c.get('subject', subject):13s} {c['readers']:3d} {c['sources']:2d} "
                   + " ".join(f"{interval_text(figs.get(key), digits):>{w}s}" for _, key, digits, w in cols)
                   + f" {spread:>16s} {c['attempts']:4d} {c.get('failed_attempts', 0):4d} {c['stalls']:5d} "
                   f"{c['fallbacks']:3d} {list_p99 if list_p99 is not None else float('nan'):11}")
    out.append("  (median over the rounds [95% interval of that median]; *: the rounds' range, under 6 rounds, "
               "covering with less than 95%)")
    for c in cells:
        for name, g in c["goals"].items():
            out.append(f"  {c.get('subject', subject)} {c['readers']}x{c['sources']} {name}: {mark(g)}")
    return out
