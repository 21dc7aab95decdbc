"""``run_scenario``: one run of a scenario, start to written folder, the way every command runs one.

``mxchaos run``, the pytest items, ``mxchaos nightly`` (through its binding) and ``mxchaos
explore`` all run a scenario with it: the runner (``harness.engine.runner.Runner``: processes,
faults, timeline, checks, teardown) into ``out_dir``, then the run folder written
(``harness.reports.report.write_run_folder``: verdict, JUnit, the page), unless the caller writes it
itself (``write=False``: the night writes and trims each run after its binding returns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.judge.verdict import RunResult
from harness.record.timeline import Entry

if TYPE_CHECKING:
    from harness.hosts.inventory import Inventory
    from harness.scenario import Scenario

__all__ = ["run_scenario"]


def run_scenario(scenario: Scenario, out_dir: str | Path, *, observers: Sequence[Callable[[Entry], None]] = (),
                 inventory: Inventory | None = None, write: bool = True) -> RunResult:
    """Run ``scenario`` once into ``out_dir`` (see the module); its result."""
    from harness.engine.runner import Runner  # heavy: imported when a run starts, not when a parser is built
    from harness.reports.report import write_run_folder

    result = Runner(scenario, out_dir=out_dir, observers=observers, inventory=inventory).run()
    if write:
        write_run_folder(result)
    return result
