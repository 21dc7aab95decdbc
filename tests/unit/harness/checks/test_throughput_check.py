"""The ``throughput`` check (scenarios/incidents/mooncake3596_slower_after_recovery.yaml): a
load after a fault against the same run's baseline load. The planted regression is the thread's
own: a recovered load 5x slower than the baseline fails, naming both speeds."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from harness.checks import RunFacts, evaluate
from harness.checks.throughput import ThroughputParams
from harness.record.timeline import History

FACTS = RunFacts(roles={"base": "reader", "after": "reader", "src": "source"})


def run(after_gbps: float | None, after_t: float = 6.0, base_gbps: float = 0.12) -> History:
    rows: list[Any] = [
        (1.0, "info", "base", "transfer_done", {"index": 0, "bytes": 1 << 27, "seconds": 1.1, "gbps": base_gbps}),
        (3.0, "invoke", "nemesis", "inject", {"fault": "flap", "kind": "partition", "target": "after"}),
        (3.0, "ok", "nemesis", "inject", {"fault": "flap", "healable": True}),
        (4.0, "ok", "after", "start", {}),
    ]
    if after_gbps is not None:
        rows.append((after_t, "info", "after", "transfer_done", {"index": 0, "bytes": 1 << 27, "seconds": 1.1,
                                                                 "gbps": after_gbps}))
    return History.build(rows)


def judge(history: History, **params: Any) -> Any:
    p = ThroughputParams.model_validate({"reader": "after", "baseline": "base", "at_least": 0.5, **params})
    return evaluate(0, "throughput", p, history, FACTS)


def test_a_load_back_at_the_baselines_speed_passes() -> None:
    result = judge(run(0.12))
    assert result.valid is True and "1.00 x base's 0.12 GB/s" in result.summary


def test_five_times_slower_after_recovery_fails_naming_both_speeds() -> None:
    """The planted regression: Mooncake #3596's queue pairs never rebuilt, ~5x slower."""
    result = judge(run(0.024))
    assert result.valid is False
    assert result.summary.startswith("slower after recovery: after READ at 0.024 GB/s, 0.20 x base's 0.12 GB/s")
    assert result.details["ratio"] == 0.2


def test_a_recovery_that_takes_too_long_fails_and_a_missing_side_says_which() -> None:
    late = judge(run(0.12, after_t=30.0), **{"from": {"fault": "flap"}, "within": "15s"})
    assert late.valid is False and "27s after fault flap (within 15s)" in late.summary
    assert judge(run(0.12, after_t=10.0), **{"from": {"fault": "flap"}, "within": "15s"}).valid is True
    assert judge(run(None)).valid is False  # the recovered reader never completed a READ
    assert judge(run(0.12, base_gbps=0.0)).valid == "unknown"  # nothing to compare with


@pytest.mark.parametrize("bad", [0.0, 1.5])
def test_the_fraction_is_a_share_of_the_baseline(bad: float) -> None:
    with pytest.raises(ValidationError):
        ThroughputParams.model_validate({"reader": "after", "baseline": "base", "at_least": bad})
