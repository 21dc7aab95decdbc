"""Conditions on scraped Prometheus samples: ``metric``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from harness.checks import CheckParams, CheckResult, RunFacts, register
from harness.record.timeline import History
from harness.scrape import Comparison, compare, sample_value
from harness.spec import Name


# ``name`` is the display-name key of every check, so the metric's name is ``metric``.
class MetricCheckParams(CheckParams):
    """``metric`` (exact sample name, e.g. ``mxref_loads_total``) summed over the samples
    whose labels include ``labels``, compared with ``value`` by ``op``, in the ``when``
    scrape(s) of ``process``: ``last`` (its final scrape), ``any`` or ``all``. A missing
    series counts as ``default`` (none: the condition is not met)."""

    process: Name
    metric: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    op: Comparison = "=="
    value: float
    when: Literal["last", "any", "all"] = "last"
    default: float | None = None

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "process", self.process, None

    def label(self, kind: str) -> str:
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        return self.name or f"{self.process}: {self.metric}{{{labels}}} {self.op} {self.value:g}"



@register("metric", MetricCheckParams)
def metric(p: MetricCheckParams, h: History, run: RunFacts) -> CheckResult:
    """Evaluate the comparison on the chosen scrape(s)."""
    scrapes = h.scrapes(p.process)
    if not scrapes:
        return CheckResult("unknown", f"no successful scrape of {p.process}")
    values: list[tuple[float, float | None]] = []
    for entry in scrapes:
        value = sample_value(entry.get("samples", ()), p.metric, p.labels)
        values.append((entry.t, p.default if value is None else value))
    chosen = values[-1:] if p.when == "last" else values
    results = [(t, v, v is not None and compare(p.op, v, p.value)) for t, v in chosen]
    details = {"scrapes": len(scrapes), "values": [[round(t, 6), v] for t, v, _ in results][-50:]}
    want = f"{p.metric} {p.op} {p.value:g}"
    if p.when == "any":
        hit = next(((t, v) for t, v, ok in results if ok), None)
        if hit:
            return CheckResult(True, f"{p.process}: {want} at {hit[0]:.3f}s (value {hit[1]:g})", details, ((hit[0], want),))
        last = results[-1][1]
        return CheckResult(False, f"{p.process}: {want} in no scrape (last value {last})", details)
    bad = [(t, v) for t, v, ok in results if not ok]
    if bad:
        t, v = bad[0]
        shown = "absent" if v is None else f"{v:g}"
        return CheckResult(False, f"{p.process}: {want} failed at {t:.3f}s (value {shown})", details, ((t, want),))
    t, v, _ = results[-1]
    return CheckResult(True, f"{p.process}: {want} (value {v:g} at {t:.3f}s)", details)
