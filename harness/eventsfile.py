"""A process's events file (``--events PATH``: one JSON object a line, each written whole with its
newline by the process, ``mxref.events``), read as it stands while the process may still write.

``read(path)`` is the one reader for the harness's long-lived fleets (``harness.soak.fleet``) and the
integration tests' processes: a missing file is no events yet; a last line without its newline is a
line being written and is left for the next read; a whole line that is not a JSON object is
``EventsFileError`` naming the file and the line (a process writes none: the file is damaged or not
an events file). A leaf: it knows nothing of runs or scenarios.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Event", "EventsFileError", "read"]

Event = dict[str, Any]
MAX_BYTES = 256 << 20


class EventsFileError(ValueError):
    """A whole line of an events file that is not a JSON object."""


def read(path: Path, name: str | None = None, where: Callable[[Event], bool] | None = None) -> list[Event]:
    """The events written whole to ``path`` so far, in order; only those called ``name`` and for which
    ``where`` holds, when given."""
    try:
        with open(path, "rb") as src:
            data = src.read(MAX_BYTES)
    except FileNotFoundError:
        return []
    whole = data[: data.rfind(b"\n") + 1]  # after the last newline: a line being written
    out: list[Event] = []
    for number, raw in enumerate(whole.decode(errors="replace").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EventsFileError(f"{path}: line {number} is not JSON ({exc.msg}): {raw[:120]!r}") from None
        if not isinstance(event, dict):
            raise EventsFileError(f"{path}: line {number} is not a JSON object: {raw[:120]!r}")
        if (name is None or event.get("event") == name) and (where is None or where(event)):
            out.append(event)
    return out
