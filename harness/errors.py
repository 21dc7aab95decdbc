"""Exceptions the harness raises, as one tree.

::

    HarnessError
     ├── ScenarioInvalid      a scenario file failed validation (before anything started); exit code 2
     ├── HostError            a host could not spawn / exec / signal
     ├── FaultError           a fault could not be injected (recorded; the run goes on to heal and report)
     ├── StepFailed           a step missed its deadline or could not act; ends the steps, not the run
     └── RunInterrupted       SIGINT / SIGTERM of the harness; faults are healed, processes stopped

Checks never raise to users: a check that raises becomes verdict "unknown".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FaultError",
    "HarnessError",
    "HostError",
    "Issue",
    "RunInterrupted",
    "ScenarioInvalid",
    "StepFailed",
]


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""


@dataclass(frozen=True)
class Issue:
    """One validation problem: where (line, key path), what rule, which value."""

    path: str  # key path, e.g. ``steps[3].fault.kind``
    message: str
    line: int | None = None
    value: Any = None
    show_value: bool = False

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        key = f" {self.path}:" if self.path else ""
        got = f" (got {_short_repr(self.value)})" if self.show_value else ""
        return f"{where}:{key} {self.message}{got}"


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ScenarioInvalid(HarnessError):
    """A scenario file is not valid; carries every issue found, each with file, line and key path."""

    def __init__(self, file: str | os.PathLike[str], issues: list[Issue]) -> None:
        self.file = str(file)
        self.issues = list(issues)
        super().__init__(self.render())

    def render(self) -> str:
        count = len(self.issues)
        head = f"{self.file}: invalid scenario ({count} problem{'s' if count != 1 else ''})"
        return "\n".join([head] + ["  " + issue.render(self.file) for issue in self.issues])


class HostError(HarnessError):
    """A host operation (spawn, exec, signal) failed."""


class FaultError(HarnessError):
    """A fault could not be injected or healed. ``witness``: what a failed inject measured of
    its own effect (a ``Witness``'s JSON), recorded with the failure, so a fault that failed
    because it landed nowhere (a drain whose target never began it) is judged by it too."""

    def __init__(self, message: str, witness: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.witness = witness


class StepFailed(HarnessError):
    """A step could not complete (deadline passed, process missing, fault failed)."""

    def __init__(self, step: str, reason: str) -> None:
        self.step = step
        self.reason = reason
        super().__init__(f"step {step}: {reason}")


class RunInterrupted(HarnessError):
    """The harness got SIGINT or SIGTERM; the runner heals and tears down before re-raising."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by signal {signum}")
