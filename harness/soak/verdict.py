"""The soak's summary from its record: per process and resource a verdict and a slope per 1,000
transfers with its interval (``harness.soak.slope``), where it was first seen growing, the audit's
cross-check, and the soak's verdict.

The audit is the process's own word (its ``/metrics``). The harness checks it against what it
counted itself: a reader makes at least one READ handle and one registration per verified load, so
its audit's made counters must grow by at least the loads the harness saw it report (per segment).
A reader whose audit does not is ``untrusted``: its ``nixl_*`` series are judged ``unknown``.

The soak's verdict: ``error`` (a process died or did not answer: ``error`` is set), ``grows`` (a
resource grows; the soak exits 1), ``failed_loads`` (a load failed: no verified load over NIXL),
``flat`` (every series flat), ``unsettled`` (none grows, some could not be told from flat).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from harness.soak.record import Sample
from harness.soak.slope import LIMITS, Point, detection, judge

__all__ = ["audit_crosscheck", "series_of", "summarize"]

NIXL_ROLES = ("reader", "source")


def series_of(samples: Sequence[Sample]) -> dict[str, dict[str, list[Point]]]:
    """process -> resource -> its points, in record order."""
    out: dict[str, dict[str, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        for resource, value in s.values.items():
            if resource.startswith("nixl_") and s.role not in NIXL_ROLES:
                continue
            out[s.process][resource].append(Point(s.transfers, value, s.segment))
    return {p: dict(r) for p, r in out.items()}


def audit_crosscheck(samples: Sequence[Sample]) -> dict[str, dict[str, Any]]:
    """Per reader: the loads the harness counted and the audit's made handles and registrations
    over the same samples (per segment, summed); ``trusted`` when each made count kept up."""
    spans: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for s in samples:
        if s.role == "reader":
            spans[(s.process, s.segment)].append(s)
    out: dict[str, dict[str, Any]] = {}
    for (process, _segment), group in sorted(spans.items()):
        first, last = group[0], group[-1]
        row = out.setdefault(process, {"loads": 0, "handles_made": 0.0, "registrations_made": 0.0})
        row["loads"] += last.loads - first.loads
        row["handles_made"] += last.made.get("handles", 0.0) - first.made.get("handles", 0.0)
        row["registrations_made"] += last.made.get("registrations", 0.0) - first.made.get("registrations", 0.0)
    for row in out.values():
        row["trusted"] = row["handles_made"] >= row["loads"] and row["registrations_made"] >= row["loads"]
    return out


def summarize(samples: Sequence[Sample], warmup: int, *, error: str | None = None,
              elapsed_s: float | None = None) -> dict[str, Any]:
    """The summary (``soak-result.json``) of a record."""
    transfers = max((s.transfers for s in samples), default=0)
    failed = max((s.failed for s in samples), default=0)
    seconds = elapsed_s if elapsed_s is not None else max((s.elapsed_s for s in samples), default=0.0)
    audit = audit_crosscheck(samples)
    series: dict[str, dict[str, Any]] = {}
    growths: list[dict[str, Any]] = []
    verdicts: set[str] = set()
    for process, resources in series_of(samples).items():
        series[process] = {}
        for resource, points in resources.items():
            untrusted = resource.startswith("nixl_") and process in audit and not audit[process]["trusted"]
            verdict, slope = judge(points, resource, warmup)
            if untrusted:
                verdict = "unknown"
            row: dict[str, Any] = {"verdict": verdict, "limit_per_1000": LIMITS.get(resource, 1.0),
                                   "slope": slope.as_dict() if slope else None,
                                   "first": points[0].value, "last": points[-1].value, "points": len(points)}
            if verdict == "grows":
                row["detected_at"] = detection(points, resource, warmup)
                growths.append({"process": process, "resource": resource, **row})
            series[process][resource] = row
            verdicts.add(verdict)
    if error:
        verdict = "error"
    elif growths:
        verdict = "grows"
    elif failed:
        verdict = "failed_loads"
    elif verdicts <= {"flat"} and verdicts:
        verdict = "flat"
    else:
        verdict = "unsettled"
    return {
        "verdict": verdict, "error": error, "transfers": transfers, "failed_loads": failed,
        "seconds": round(seconds, 1), "transfers_per_s": round(transfers / seconds, 2) if seconds > 0 else None,
        "segments": len({s.segment for s in samples}), "warmup_transfers": warmup,
        "growths": growths, "audit_crosscheck": audit, "series": series,
    }


def growth_text(g: dict[str, Any]) -> str:
    s = g["slope"]
    return (f"{g['process']} {g['resource']} grows {s['per_1000']:+.1f} per 1000 transfers "
            f"(95% interval {s['lo']:+.1f}..{s['hi']:+.1f}; flat is <= {g['limit_per_1000']:g}), "
            f"first seen at {g.get('detected_at')} transfers")
