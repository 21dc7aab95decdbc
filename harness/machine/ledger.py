"""The ledger of live runs: one JSON file per run that has not finished tearing down.

A run writes its entry (run id, harness pid and start time, run folder, and what it created
that a sweep must find: its network, its toxiproxy API) before it creates anything, rewrites it
as it gains such things, and removes it at the end of its teardown. ``mxchaos cleanup`` and the
faults' sweeps read it to tell a dead run's leftovers from a live run's. This module is a leaf:
it knows nothing of runners, faults or scenarios.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
from pathlib import Path
from typing import Any

from harness.machine import statedir

__all__ = ["entries", "ledger_dir", "new_run_id", "read_entry", "recorded_toxiproxy_api", "remove_entry", "write_entry"]


def ledger_dir(*, create: bool = True) -> Path:
    """Where live runs are registered (one JSON file each, removed when a run ends): ``runs/`` of
    the state directory, checked (``harness.machine.statedir``; StateDirError when it is not ours)."""
    folder = statedir.subdir("runs", create=create)
    return folder if folder is not None else statedir.base() / "runs"


def new_run_id(scenario: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{scenario}-{stamp}-{secrets.token_hex(3)}"


def write_entry(run_id: str, info: dict[str, Any]) -> None:
    """Register (or update) a live run; written whole to a fresh file (``O_EXCL|O_NOFOLLOW``),
    then renamed, so a reader never sees half an entry. A state directory that is not ours is a
    StateDirError; other failures are let go: a run without a ledger is still swept by the
    ``MXCHAOS_RUN_ID`` its processes carry."""
    folder = ledger_dir()
    with contextlib.suppress(OSError):
        statedir.replace(folder / f"{_name(run_id)}.json", json.dumps(info).encode())


def remove_entry(run_id: str) -> None:
    """Drop a run's entry (nothing when there is none, or no state directory of ours)."""
    with contextlib.suppress(OSError, ValueError, statedir.StateDirError):
        (ledger_dir(create=False) / f"{_name(run_id)}.json").unlink()


def read_entry(run_id: str) -> dict[str, Any] | None:
    """A run's entry, only if it is a regular file we own holding a JSON object (a symlink, a
    file someone else made or a damaged one is no entry)."""
    try:
        info = json.loads(statedir.read_owned(ledger_dir(create=False) / f"{_name(run_id)}.json"))
    except (OSError, ValueError, statedir.StateDirError):
        return None
    return info if isinstance(info, dict) else None


def entries() -> dict[str, dict[str, Any]]:
    """Every registered run: run id -> its entry (entries that are not ours or unreadable are
    skipped). StateDirError when the state directory is not ours."""
    out: dict[str, dict[str, Any]] = {}
    folder = ledger_dir(create=False)
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        info = read_entry(path.stem)
        if info is not None:
            out[path.stem] = info
    return out


def _name(run_id: str) -> str:
    """A run id as a file name: one path component, never a way out of the ledger."""
    if not run_id or "/" in run_id or run_id in (".", "..") or "\0" in run_id:
        raise ValueError(f"not a run id: {run_id!r}")
    return run_id


def recorded_toxiproxy_api(run_id: str) -> str | None:
    """The toxiproxy API URL a run recorded in its ledger entry (None: none, or no entry)."""
    info = read_entry(run_id) or {}
    record = info.get("toxiproxy")
    url = record.get("api") if isinstance(record, dict) else None
    return url if isinstance(url, str) else None
