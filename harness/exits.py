"""The exit codes of every ``mxchaos`` command, in one place (``EXIT_CODES`` is also the epilog of
``mxchaos --help``)."""

from __future__ import annotations

import signal

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_CODES", "EXIT_ENV_BROKEN", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_INVALID",
           "EXIT_OK"]

EXIT_ENV_BROKEN = 4  # a place the run needs cannot play its role: nothing was started
EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a program SIGPIPE ended

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "every scenario passed, or was XFAIL / XPASS (a known defect) or SKIP (a capability is missing); "
    "validate, list: every file is valid",
    EXIT_FAILED: "a check failed or was unknown, a step failed, a run hung or errored, a scenario was FLAKY "
    "(--repeat: passed in some runs only) or NOT EXERCISED (a fault's witness showed it had no effect); "
    "cleanup: a process survived",
    EXIT_INVALID: "invalid input: a scenario file, a path, a run folder, an option",
    EXIT_ENV_BROKEN: "environment broken (run --inventory, matrix, nightly, doctor): a place the run needs cannot play its role "
    "(NIXL or the native extension does not import, a host does not answer); nothing was started, or every run of "
    "a cell failed before its first step for that reason (see mxchaos doctor)",
    EXIT_INTERRUPTED: "interrupted (SIGINT / SIGTERM), after healing every fault and tearing down",
    EXIT_BROKEN_PIPE: "standard output was closed early (e.g. piped into head); nothing more is printed",
}
