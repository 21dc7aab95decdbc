"""A broken environment is not a verdict on NIXL.

A run whose environment could not play a role (the native server is not installed, NIXL does
not import, a launcher is missing) fails at its first start, long before any fault: its FAIL
says nothing about the release under test. ``environment_reason(run_dir)`` finds that case in a
run folder: the run did not pass, no fault was injected, and a process of the run exited saying
why in words that name the environment (``ENV_WORDS``: a module not installed or not found, a
shared library that does not load, a program that is not there), in its ``exit`` event or the
end of its log. ``cell_reason(run_dirs)`` is the reason when **every** run of a cell is so
(one good run means the environment works, and the failures are the release's), and the matrix
and the nightly show such a cell as ``environment broken: <reason>`` (``LABEL``), not FAIL, and
exit ``harness.commands.doctor.EXIT_ENV_BROKEN``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from harness.record.saved import VerdictDoc
from harness.record.timeline import History

__all__ = ["ENV_BROKEN", "ENV_WORDS", "INFRA_FILE", "LABEL", "cell_reason", "environment_reason", "text_reason"]

ENV_BROKEN = "env_broken"  # the cell verdict (matrix.json, nightly.json)
LABEL = "environment broken"
ENV_WORDS = re.compile(
    r"is not installed|No module named|ModuleNotFoundError|ImportError|cannot open shared object file"
    r"|undefined symbol|command not found|No such file or directory: '[^']*python|GLIBC_[0-9.]+' not found",
)
LOG_TAIL_BYTES = 8192
GOOD = ("pass", "skip", "xfail", "xpass")
INFRA_FILE = "infrastructure.json"  # written by a dispatcher whose cluster ended the run (harness.nightly.slurm)


def text_reason(text: str) -> str | None:
    """The line of ``text`` that names an environment problem (the last one), else None."""
    hits = [line.strip() for line in text.splitlines() if ENV_WORDS.search(line)]
    return hits[-1][:400] if hits else None


def _fault_injected(run_dir: Path) -> bool:
    """Whether the run invoked a fault (a damaged timeline: assumed so, never blaming the
    environment for what may be a verdict)."""
    try:
        return bool(History.from_jsonl(run_dir / "timeline.jsonl").fault_windows())
    except OSError:
        return False
    except ValueError:
        return True


def _infrastructure(run_dir: Path) -> str | None:
    """What the cluster that was to run this run said ended it (``INFRA_FILE``), else None."""
    try:
        reason = json.loads((run_dir / INFRA_FILE).read_text())["reason"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(reason)[:400] if reason else None


def environment_reason(run_dir: Path) -> str | None:
    """Why the run failed for its environment before any fault (see the module docstring), else None."""
    infra = _infrastructure(run_dir)
    if infra:
        return infra
    verdict = VerdictDoc.read_or_none(VerdictDoc.in_folder(run_dir))
    if verdict is None or verdict.verdict.lower() in GOOD:
        return None
    if _fault_injected(run_dir):
        return None
    procs = run_dir / "procs"
    for events in sorted(procs.glob("*.events.jsonl")) if procs.is_dir() else []:
        try:
            lines = events.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            if '"exit"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            why = text_reason(str(event.get("error") or "")) if isinstance(event, dict) else None
            if why:
                return f"{event.get('proc') or events.name.split('.')[0]}: {why}"
    for log in sorted(procs.glob("*.log")) if procs.is_dir() else []:
        try:
            with open(log, "rb") as fh:
                fh.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
                tail = fh.read().decode(errors="replace")
        except OSError:
            continue
        why = text_reason(tail)
        if why:
            return f"{log.stem}: {why}"
    return None


def cell_reason(run_dirs: Iterable[Path | str]) -> str | None:
    """The environment reason when every run of a cell has one (the first run's), else None."""
    reasons = [environment_reason(Path(d)) for d in run_dirs]
    if not reasons or any(r is None for r in reasons):
        return None
    return reasons[0]
