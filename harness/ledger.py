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
import os
import secrets
from pathlib import Path
from typing import Any

__all__ = ["entries", "ledger_dir", "new_run_id", "read_entry", "recorded_toxiproxy_api", "remove_entry", "write_entry"]


def ledger_dir() -> Path:
    """Where live runs are registered (one JSON file each, removed when a run ends)."""
    base = os.environ.get("MXCHAOS_STATE_DIR") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"mxchaos-{os.getuid()}"
    )
    return Path(base) / "runs"


def new_run_id(scenario: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{scenario}-{stamp}-{secrets.token_hex(3)}"


def write_entry(run_id: str, info: dict[str, Any]) -> None:
    """Register (or update) a live run; written whole to a temporary name, then renamed, so a
    reader never sees half an entry. Best effort: a run without a ledger is still swept by the
    ``MXCHAOS_RUN_ID`` its processes carry."""
    with contextlib.suppress(OSError):
        folder = ledger_dir()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{run_id}.json.{os.getpid()}"
        tmp.write_text(json.dumps(info))
        os.replace(tmp, folder / f"{run_id}.json")


def remove_entry(run_id: str) -> None:
    with contextlib.suppress(OSError):
        (ledger_dir() / f"{run_id}.json").unlink()


def read_entry(run_id: str) -> dict[str, Any] | None:
    try:
        info = json.loads((ledger_dir() / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def entries() -> dict[str, dict[str, Any]]:
    """Every registered run: run id -> its entry (unreadable entries are skipped)."""
    out: dict[str, dict[str, Any]] = {}
    folder = ledger_dir()
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        info = read_entry(path.stem)
        if info is not None:
            out[path.stem] = info
    return out


def recorded_toxiproxy_api(run_id: str) -> str | None:
    """The toxiproxy API URL a run recorded in its ledger entry (None: none, or no entry)."""
    info = read_entry(run_id) or {}
    record = info.get("toxiproxy")
    url = record.get("api") if isinstance(record, dict) else None
    return url if isinstance(url, str) else None
