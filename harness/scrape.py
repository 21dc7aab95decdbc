"""Prometheus scrapes: a real HTTP GET of ``/metrics``, parsed with prometheus-client's parser.

Samples are stored on the timeline as ``[name, {labels}, value]`` triples (entry
``f="scrape"``). Conditions select samples by exact sample name (``mxref_loads_total``,
``mx_p2p_transfer_seconds_count``) and a label subset, and sum what matches.
"""

from __future__ import annotations

import math
import operator
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["COMPARATORS", "Comparison", "compare", "parse_samples", "sample_value", "scrape"]

Comparison = Literal["==", "!=", "<", "<=", ">", ">="]
COMPARATORS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

Sample = list[Any]  # [name, labels, value]


def parse_samples(text: str) -> list[Sample]:
    out: list[Sample] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            out.append([sample.name, dict(sample.labels), value if math.isfinite(value) else str(value)])
    return out


def scrape(url: str, timeout: float) -> list[Sample]:
    """GET ``url`` with a deadline and parse it; raises OSError / ValueError on failure."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read().decode("utf-8", errors="replace")
    return parse_samples(body)


def sample_value(samples: Iterable[Sequence[Any]], name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """Sum of the samples named ``name`` whose labels include ``labels``; None when none match."""
    total: float | None = None
    wanted = {k: str(v) for k, v in (labels or {}).items()}
    for sample_name, sample_labels, value in samples:
        if sample_name != name or not isinstance(value, int | float):
            continue
        if all(sample_labels.get(k) == v for k, v in wanted.items()):
            total = (total or 0.0) + float(value)
    return total


def compare(op: str, actual: float, expected: float) -> bool:
    return COMPARATORS[op](actual, expected)
