"""The arithmetic of ``python -m mxref bench storm`` (``mxref.bench.storm``), apart from the runs.

A storm round: R readers told to load at the same instant (the bench's clock, ``go``), each
result line stamped by the bench when it arrives (``done``), never by the reader's own clock.
``storm_round`` turns one round's results into its figures: the aggregate (R x bytes over the
time from the go to the last verified load), the per-reader load times, READs per source (the
source each verified load names), attempts, fallbacks and stalls. A raw fan-out round (the
ceiling) has the same shape: the same bytes, each raw reader on its own source.

``summarize_cell`` judges one (readers, sources) cell on its rounds, each goal a same-run ratio:

* aggregate >= 0.8 x the raw fan-out's (``aggregate_over_raw``): the ratio taken within each
  round (both storms back to back, alternating who goes first), judged on the median of the
  rounds with a distribution-free 95 % interval (``mxref.bench.report.median_interval``);
* no source serves more than 1.5 x its fair share of READs (``spread``): the fair share of a
  round is ceil(R / S) (no assignment does better); judged on the worst round;
* per-reader p99 <= 2 x p50 (``p99_over_p50``): the load times of every round pooled; the
  interval is the quotient of the two quantiles' intervals, the widest it can be;
* no fallback and no stall in a healthy storm (``healthy``): counts, zero or not;
* the storm with one source frozen mid-storm within 2 x the healthy storm's p99
  (``frozen_over_healthy_p99``), both pooled, the interval taken as for ``p99_over_p50``.

A verdict is ``met`` by the estimate and ``settled`` when its interval lies on one side of the
goal. Nothing here starts a process.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mxref.bench.report import median_interval, quantile_interval

AGGREGATE_OVER_RAW_GOAL = 0.8
FAIR_SHARE_GOAL = 1.5
P99_OVER_P50_GOAL = 2.0
FROZEN_OVER_HEALTHY_P99_GOAL = 2.0
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


def at_most(value: float | None, goal: float, ci: Sequence[float] | None = None) -> dict[str, Any]:
    """``value <= goal``: met by the estimate, settled when the interval lies on one side."""
    return {"value": None if value is None else round(value, 3), "goal": goal,
            "met": None if value is None else value <= goal,
            "ci": None if ci is None else [round(ci[0], 3), round(ci[1], 3)],
            "settled": ci is not None and (ci[1] <= goal or ci[0] > goal)}


def quotient(num: Mapping[str, Any], num_q: str, den: Mapping[str, Any], den_q: str) -> tuple[float | None, list[float] | None]:
    """``num[num_q] / den[den_q]`` (``quantiles_s`` results), with the widest interval the two
    quantiles' intervals allow (None when either has none)."""
    a, b = num[f"{num_q}_s"], den[f"{den_q}_s"]
    if a is None or not b:
        return None, None
    ca, cb = num[f"{num_q}_ci"], den[f"{den_q}_ci"]
    ci = [ca[0] / cb[1], ca[1] / cb[0]] if ca and cb and cb[0] > 0 else None
    return a / b, ci


def ratio_rounds(num: Sequence[float], den: Sequence[float], goal: float) -> dict[str, Any]:
    """``num[i] / den[i]`` per round (the same round's two storms) >= ``goal``, judged on the
    median with its 95 % interval (None under 6 rounds)."""
    rounds = [n / d for n, d in zip(num, den) if d > 0 and not math.isnan(n)]
    if not rounds:
        return {"value": None, "goal": goal, "met": None, "rounds": [], "ci": None, "settled": False}
    med = float(statistics.median(rounds))
    ci = median_interval(rounds)
    return {"value": round(med, 3), "goal": goal, "met": med >= goal, "rounds": [round(r, 3) for r in rounds],
            "ci": None if ci is None else [round(ci[0], 3), round(ci[1], 3)],
            "settled": ci is not None and (ci[0] >= goal or ci[1] < goal)}


def summarize_cell(readers: int, sources: int, nbytes: int, storms: Sequence[Mapping[str, Any]],
                   raws: Sequence[Mapping[str, Any]], frozen: Sequence[Mapping[str, Any]] = (),
                   listings_s: Sequence[float] = ()) -> dict[str, Any]:
    """One (readers, sources) cell: its rounds (``storm_round`` dicts) summed up and judged."""
    if not storms:
        raise ValueError(f"cell {readers}x{sources}: no storm rounds")
    loads = quantiles_s([x for s in storms for x in s["load_s"]])
    aggregates = [s["aggregate_gbps"] for s in storms]
    out: dict[str, Any] = {
        "readers": readers, "sources": sources, "bytes": nbytes, "rounds": len(storms),
        "aggregate_gbps": round(float(statistics.median(aggregates)), 3), "aggregate_rounds": aggregates,
        "load": loads,
        "reads_per_source": [s["reads_per_source"] for s in storms],
        "attempts": sum(s["attempts"] for s in storms), "fallbacks": sum(s["fallbacks"] for s in storms),
        "stalls": sum(s["stalls"] for s in storms),
        "failed_attempts": sum(s["failed_attempts"] for s in storms),
        "bytes_verified": sum(s["bytes_verified"] for s in storms),
        "list_sources": quantiles_ms(listings_s),
    }
    spreads = [max_over_fair(s["reads_per_source"], sources, readers) for s in storms]
    out["spread_rounds"] = [round(x, 3) for x in spreads]
    goals: dict[str, Any] = {"spread": at_most(max(spreads), FAIR_SHARE_GOAL)}
    ratio, ci = quotient(loads, "p99", loads, "p50")
    goals["p99_over_p50"] = at_most(ratio, P99_OVER_P50_GOAL, ci)
    healthy = out["fallbacks"] == 0 and out["stalls"] == 0 and out["attempts"] == readers * len(storms)
    goals["healthy"] = {"value": {"fallbacks": out["fallbacks"], "stalls": out["stalls"],
                                  "failed_attempts": out["failed_attempts"],
                                  "extra_attempts": out["attempts"] - readers * len(storms)},
                        "goal": 0, "met": healthy, "ci": None, "settled": True}
    if raws:
        out["raw_gbps"] = round(float(statistics.median(r["aggregate_gbps"] for r in raws)), 3)
        out["raw_rounds"] = [r["aggregate_gbps"] for r in raws]
        goals["aggregate_over_raw"] = ratio_rounds(aggregates, out["raw_rounds"], AGGREGATE_OVER_RAW_GOAL)
    if frozen:
        frozen_loads = quantiles_s([x for s in frozen for x in s["load_s"]])
        out["frozen"] = {"rounds": len(frozen), "load": frozen_loads,
                         "fallbacks": sum(s["fallbacks"] for s in frozen), "stalls": sum(s["stalls"] for s in frozen),
                         "failed_attempts": sum(s["failed_attempts"] for s in frozen),
                         "attempts": sum(s["attempts"] for s in frozen),
                         "verified": sum(s["verified"] for s in frozen)}
        ratio, ci = quotient(frozen_loads, "p99", loads, "p99")
        goals["frozen_over_healthy_p99"] = at_most(ratio, FROZEN_OVER_HEALTHY_P99_GOAL, ci)
    out["goals"] = goals
    return out


def quantiles_ms(values: Sequence[float]) -> dict[str, Any]:
    """ListSources latencies (s) as p50/p99/max in ms with the p99's 95 % interval."""
    q = quantiles_s(values)
    ms = {k: None if q[k] is None else round(q[k] * 1000, 3) for k in ("p50_s", "p99_s", "max_s")}
    ci = q["p99_ci"]
    return {"n": q["n"], "p50_ms": ms["p50_s"], "p99_ms": ms["p99_s"], "max_ms": ms["max_s"],
            "p99_ci_ms": None if ci is None else [round(ci[0] * 1000, 3), round(ci[1] * 1000, 3)]}


def mark(goal: Mapping[str, Any]) -> str:
    if goal["met"] is None:
        return "n/a"
    return ("met" if goal["met"] else "MISSED") + ("" if goal["settled"] else " (not settled)")


def table(cells: Sequence[Mapping[str, Any]], subject: str = "mxref") -> list[str]:
    """The storm table: one line per cell, then each cell's goals."""
    out = [f"{'subject':13s} {'R':>3s} {'S':>2s} {'GB/s':>6s} {'raw':>6s} {'ratio':>6s} {'p50 s':>6s} {'p99 s':>6s} "
           f"{'max s':>6s} {'READs/source':>16s} {'att':>4s} {'fail':>4s} {'stall':>5s} {'fb':>3s} {'List p99 ms':>11s} "
           f"{'frozen p99':>10s}"]
    for c in cells:
        ratio = c["goals"].get("aggregate_over_raw", {}).get("value")
        spread = "/".join(str(sum(r.get(k, 0) for r in c["reads_per_source"]))
                          for k in sorted({k for r in c["reads_per_source"] for k in r}))
        frozen = c.get("frozen", {}).get("load", {}).get("p99_s")
        out.append(f"{c.get('subject', subject):13s} {c['readers']:3d} {c['sources']:2d} {c['aggregate_gbps']:6.2f} "
                   f"{c.get('raw_gbps', float('nan')):6.2f} {ratio if ratio is not None else float('nan'):6.2f} "
                   f"{c['load']['p50_s']:6.3f} {c['load']['p99_s']:6.3f} {c['load']['max_s']:6.3f} {spread:>16s} "
                   f"{c['attempts']:4d} {c.get('failed_attempts', 0):4d} {c['stalls']:5d} {c['fallbacks']:3d} "
                   f"{c['list_sources']['p99_ms'] if c['list_sources']['p99_ms'] is not None else float('nan'):11} "
                   f"{frozen if frozen is not None else '-':>10}")
    for c in cells:
        goals = "; ".join(f"{name} {g['value']} ({mark(g)})" for name, g in c["goals"].items())
        out.append(f"  {c.get('subject', subject)} {c['readers']}x{c['sources']}: {goals}")
    return out
