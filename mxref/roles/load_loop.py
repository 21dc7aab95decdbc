"""A reader that stays up and loads again on request (``mxref reader --load-loop``): the long-lived
reader of a soak (``mxchaos soak``).

Each line ``load`` on standard input is one load (``Reader.load``: list, metadata, a fresh target,
handshake, READ, verify, release), its result printed as one JSON line (``{"result": ...}``, with
``n``: the loads so far) and then given back (``Reader.drop_load``: its agent shut down, its memory
released), and the next load's READ target is made at once (``Reader.prepare_next``: fresh memory
and a fresh agent, as a fresh reader makes them during its start-up), so the next load starts as
the first did. Then, that target made, it says ``{"idle": {"n": ...}}`` and reads its next line:
from then until the next ``load`` it holds exactly what a fresh reader holds before its first load,
so a sample taken after ``idle`` (the soak's) never catches it half way through giving a load back
or making the next target. Standard input closed, ``quit``, or the process asked to stop: it
closes and exits. A planted leak (``--debug-leak``, ``mxref.debug_hooks.PlantedLeak``)
leaks once per load, after it, with the load's agent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import IO, Any

from mxref.debug_hooks import PlantedLeak
from mxref.roles.reader import Reader


def _answer(out: IO[str], record: dict[str, Any]) -> None:
    """One JSON line in one write: ``print`` writes the text and its newline apart, and a log
    line of another thread (NIXL's, on the same standard output) landing between them made the
    answer unreadable (``{"ready": ...}2026-... NIXL INFO ...``)."""
    out.write(json.dumps(record) + "\n")
    out.flush()


def load_loop(reader: Reader, lines: Iterable[str], out: IO[str], stop: threading.Event,
              settle_s: float = 0.0, leak: PlantedLeak | None = None) -> int:
    """Load once per ``load`` line until the lines end, ``quit`` or ``stop``; returns the loads made."""
    n = 0
    _answer(out, {"ready": {"loop": True, "idle": True}})
    for line in lines:
        command = line.strip()
        if stop.is_set() or command == "quit":
            break
        if command != "load":
            _answer(out, {"error": f"unknown command {command!r}: 'load' or 'quit'"})
            continue
        result = reader.load()
        n += 1
        if result.ok:
            reader.settle(settle_s, stop)
        if leak is not None:
            leak.leak(reader.manager.agent if reader.manager is not None else None)
        record = json.loads(result.to_json())
        record["n"] = n
        _answer(out, record)
        reader.drop_load()
        reader.prepare_next()
        reader.await_prepared()
        _answer(out, {"idle": {"n": n}})
    return n
