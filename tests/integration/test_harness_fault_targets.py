"""Faults whose target is gone, against real processes (the fake mxref): ``if_gone: skip``
records the fault as skipped and the run goes on, nothing healed; the default fails the step
naming the target and how and when it ended; a process never started is gone too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_harness_runner import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_fault_on_a_gone_target_is_skipped_or_fails_the_step_as_its_if_gone_says(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        """\
        budgets: {step: 10s, run: 40s, stop_grace: 2s, progress: 20s}
        processes:
          server: {role: server}
          source-1: {role: source}
          reader-1: {role: reader}
        steps:
          - start: server
          - start: source-1
          - await: {process: source-1, event: status_change, where: {status: READY}}
          - fault: {kind: kill, target: source-1, name: first}
          - await: {process: source-1, exit: true, code: any}
          - fault: {kind: pause, target: source-1, name: again, duration: 500ms, if_gone: skip}
          - fault: {kind: kill, target: reader-1, name: unborn, if_gone: skip}
          - fault: {kind: kill, target: source-1, name: last}
          - mark: never-reached
        """,
    )
    history = result.history
    exit_t = history.first(actor="source-1", f="process_exit")
    assert exit_t is not None
    ended = f"source-1 exited (rc -9, SIGKILL) at {exit_t.t:.3f}s"

    skipped = {e.get("fault"): e.get("skipped") for e in history.select(actor="nemesis", f="inject", type="info")}
    assert skipped == {"again": ended, "unborn": "reader-1 was never started"}
    step6 = history.first(actor="harness", f="step", type="ok", where={"step": "6"})
    assert step6 is not None and step6.get("skipped") == ended
    assert history.select(actor="nemesis", f="heal") == []  # nothing was injected, so nothing healed

    assert result.status == "step_failed" and result.failed_step == "8"
    assert result.reason == f"fault last (kill): {ended} (if_gone: fail)"
    assert re.fullmatch(r"source-1 exited \(rc -9, SIGKILL\) at \d+\.\d{3}s", ended)
    assert history.first(actor="harness", f="mark") is None
