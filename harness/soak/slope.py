"""The soak's judgement: does a resource grow with the transfers, and by how much per 1,000?

A series is one process's one resource sampled at transfer counts. Its slope comes from a least
squares line, ``value = slope * transfers + intercept``, with an intercept per *segment* (each
resumed soak starts new processes, whose level starts afresh; the slope is shared), over the
points past each segment's warm-up (the first ``warmup`` transfers of a segment fill caches and
pools). The slope's 95 % confidence interval is ``slope +- t(0.975, n - p) * se`` (``p``: the
slope and one intercept per segment).

Each resource has a limit, per 1,000 transfers (``LIMITS``): what still counts as flat. The
verdict is ``grows`` when the whole interval lies above the limit (``lo > limit``), ``flat``
when it lies below it (``hi <= limit``), ``unsettled`` when it straddles it, too few points
are past the warm-up (``MIN_POINTS``) or they span too few transfers (``MIN_SPAN``: memory). ``detection`` replays the judgement on each prefix of a
series: the first transfer count at which it said ``grows``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["LIMITS", "MIN_POINTS", "MIN_SPAN", "Point", "Slope", "detection", "fit", "judge", "t_quantile_975"]

PER = 1000
"""Slopes are per this many transfers."""

LIMITS: dict[str, float] = {
    "fds": 1.0,  # open descriptors: one per 1,000 transfers would still run out in the field's 3 days
    "threads": 1.0,
    "tcp": 1.0,  # TCP sockets of the process (UCX's endpoints over TCP, its listeners, gRPC)
    "tcp_established": 1.0,
    "tcp_close_wait": 1.0,  # closed by the peer, never by the process: an endpoint nobody closes
    "rss_kib": 2048.0,  # resident memory: 2 MiB per 1,000 transfers (2 KiB a transfer)
    "nixl_handles_open": 1.0,  # the audit (mxref.audit), as the process's /metrics report it
    "nixl_dlists_open": 1.0,
    "nixl_registrations_open": 1.0,
    "nixl_remote_agents_open": 1.0,
}
"""Per resource, the growth per 1,000 transfers that still counts as flat."""

MIN_POINTS = 5
"""The fewest points past the warm-up a series needs to be judged (else ``unsettled``)."""

MIN_SPAN: dict[str, int] = {"rss_kib": 1000}
"""Per resource, the fewest transfers past the warm-up its points must span to be judged (else
``unsettled``): memory moves in steps (an allocator's arena, a pool), which a short span reads as
a slope; a count does not."""


@dataclass(frozen=True)
class Point:
    transfers: int
    value: float
    segment: int = 0


@dataclass(frozen=True)
class Slope:
    per_1000: float  # the estimate, per PER transfers
    lo: float  # its 95 % interval
    hi: float
    n: int  # points fitted

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


# t(0.975, df) for small df; past the table the Cornish-Fisher expansion below is within 1e-3
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042}


def t_quantile_975(df: int) -> float:
    """Student's t 97.5 % quantile with ``df`` degrees of freedom (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1 (got {df})")
    if df in _T975:
        return _T975[df]
    if df < 30:  # between table rows: the larger (safer) quantile of the row below
        return _T975[max(k for k in _T975 if k < df)]
    z = 1.959964
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def _past_warmup(points: Sequence[Point], warmup: int) -> list[Point]:
    starts: dict[int, int] = {}
    for p in points:
        starts[p.segment] = min(starts.get(p.segment, p.transfers), p.transfers)
    return [p for p in points if p.transfers >= starts[p.segment] + warmup]


def fit(points: Sequence[Point], warmup: int = 0) -> Slope | None:
    """The slope per 1,000 transfers with its 95 % interval, or None with too few points past the warm-up."""
    kept = _past_warmup(points, warmup)
    segments = sorted({p.segment for p in kept})
    # a segment with one point only sets its own intercept: it says nothing of the slope
    counts = {s: sum(1 for p in kept if p.segment == s) for s in segments}
    kept = [p for p in kept if counts[p.segment] > 1]
    segments = [s for s in segments if counts[s] > 1]
    n, k = len(kept), 1 + len(segments)
    if n < MIN_POINTS or n - k < 1:
        return None
    x = np.array([p.transfers for p in kept], dtype=float)
    if len(set(x.tolist())) < 2:
        return None
    y = np.array([p.value for p in kept], dtype=float)
    design = np.zeros((n, k))
    design[:, 0] = x
    for j, s in enumerate(segments, start=1):
        design[:, j] = [1.0 if p.segment == s else 0.0 for p in kept]
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    dof = n - k
    sigma2 = float(residual @ residual) / dof
    cov = sigma2 * np.linalg.pinv(design.T @ design)
    se = math.sqrt(max(float(cov[0, 0]), 0.0))
    slope = float(coef[0])
    half = t_quantile_975(dof) * se
    return Slope(per_1000=slope * PER, lo=(slope - half) * PER, hi=(slope + half) * PER, n=n)


def judge(points: Sequence[Point], resource: str, warmup: int = 0) -> tuple[str, Slope | None]:
    """``grows``, ``flat`` or ``unsettled`` (see the module) and the slope it rests on."""
    slope = fit(points, warmup)
    if slope is None:
        return "unsettled", None
    kept = _past_warmup(points, warmup)
    if max(p.transfers for p in kept) - min(p.transfers for p in kept) < MIN_SPAN.get(resource, 0):
        return "unsettled", slope
    limit = LIMITS.get(resource, 1.0)
    if slope.lo > limit:
        return "grows", slope
    if slope.hi <= limit:
        return "flat", slope
    return "unsettled", slope


def detection(points: Sequence[Point], resource: str, warmup: int = 0) -> int | None:
    """The first transfer count at which the judgement of the series so far said ``grows``; None if never."""
    ordered = sorted(points, key=lambda p: (p.segment, p.transfers))
    for i in range(MIN_POINTS, len(ordered) + 1):
        if judge(ordered[:i], resource, warmup)[0] == "grows":
            return ordered[i - 1].transfers
    return None
