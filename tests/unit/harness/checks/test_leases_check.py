"""The ``leased_reads`` check on hand-built timelines: a READ is judged against the lease grants the
sources recorded, never against the reader's word that its lease was valid."""

from __future__ import annotations

from typing import Any

import pytest

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.record.timeline import History

ROLES = RunFacts(roles={"source-1": "source", "source-2": "source", "reader-1": "reader", "reader-2": "reader"})
AGENTS: list[tuple[Any, ...]] = [
    (0.1, "info", "source-1", "agent_ready", {"agent_name": "src-1"}),
    (0.1, "info", "source-2", "agent_ready", {"agent_name": "src-2"}),
    (1.0, "info", "source-1", "lease_granted", {"lease_id": "L1", "lifetime_s": 4.0}),
]


def judge(rows: list[tuple[Any, ...]], readers: tuple[str, ...] = ("reader-1",)) -> checks.NamedResult:
    params = checks.REGISTRY["leased_reads"].params.model_validate({"readers": list(readers)})
    return evaluate(0, "leased_reads", params, History.build(AGENTS + rows), ROLES)


def read(t: float, lease_id: str | None, agent: str = "src-1", index: int = 0) -> tuple[Any, ...]:
    return (t, "info", "reader-1", "transfer_start", {"index": index, "agent_name": agent, "lease_id": lease_id})


def test_a_read_inside_a_live_lease_of_the_source_it_reads_passes() -> None:
    result = judge([read(1.5, "L1"), (2.0, "info", "reader-1", "transfer_done", {"index": 0}),
                    (2.1, "info", "source-1", "lease_returned", {"lease_id": "L1"})])
    assert result.valid is True and "1 READ(s)" in result.summary


@pytest.mark.parametrize(("rows", "why"), [
    ([read(1.5, None)], "posted without a lease"),
    ([read(1.5, "L9")], "lease L9 was never granted by a source"),
    ([read(1.5, "L1", agent="src-2")], "granted by source-1, but the READ is from agent 'src-2' (source-2)"),
    ([read(0.5, "L1")], "granted only at 1.000s"),
    ([(1.2, "info", "source-1", "lease_returned", {"lease_id": "L1"}), read(1.5, "L1")], "had ended at 1.200s"),
    ([read(5.5, "L1")], "had ended at 5.000s"),  # its lifetime ran out, noticed or not
    ([read(1.5, "L1"), (6.0, "info", "reader-1", "transfer_done", {"index": 0})],
     "it ended (transfer_done) at 6.000s, after lease L1 ended at 5.000s"),
])
def test_a_read_without_a_valid_lease_fails_naming_why(rows: list[tuple[Any, ...]], why: str) -> None:
    result = judge(rows)
    assert result.valid is False and why in result.summary


def test_a_read_killed_mid_flight_is_judged_by_its_post_alone() -> None:
    assert judge([read(1.5, "L1"), read(9.0, "L2", index=1),
                  (8.0, "info", "source-1", "lease_granted", {"lease_id": "L2", "lifetime_s": 4.0})]).valid is True


def test_no_read_at_all_is_nothing_to_judge() -> None:
    assert judge([], readers=("reader-1", "reader-2")).valid == "unknown"
