"""How busy this machine is: the load a timing verdict was reached under.

``load_sample()`` reads the load averages, the CPU count and, where the kernel keeps it
(``/proc/pressure/cpu``, PSI), the share of the last 10 s in which some runnable task waited
for a CPU. The runner records one sample when a run starts (its ``run`` entry) and one when its
teardown begins (the ``teardown`` entry), so a page can say, beside a timing check that failed,
that the machine was 7x oversubscribed when it ran.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["load_sample", "load_text", "oversubscribed", "run_load"]

PSI_CPU = Path("/proc/pressure/cpu")


def _cpu_pressure() -> float | None:
    """``some avg10`` of CPU pressure (percent of the last 10 s with a runnable task waiting)."""
    try:
        first = PSI_CPU.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(part.split("=", 1) for part in first.split()[1:] if "=" in part)
    try:
        return float(fields["avg10"])
    except (KeyError, ValueError):
        return None


def load_sample() -> dict[str, Any]:
    """``{load1, load5, load15, cpus, per_cpu, cpu_pressure}`` (``per_cpu``: load1 / cpus;
    ``cpu_pressure``: None where the kernel keeps no PSI)."""
    try:
        load1, load5, load15 = os.getloadavg()
    except OSError:
        load1 = load5 = load15 = float("nan")
    cpus = os.cpu_count() or 1
    return {"load1": round(load1, 2), "load5": round(load5, 2), "load15": round(load15, 2), "cpus": cpus,
            "per_cpu": round(load1 / cpus, 2), "cpu_pressure": _cpu_pressure()}


def load_text(sample: Any) -> str:
    """``load 3.9 on 2 CPUs (1.95 per CPU; CPU pressure 41%)`` of a sample, '' when it is none."""
    if not isinstance(sample, dict) or not isinstance(sample.get("load1"), int | float):
        return ""
    text = f"load {sample['load1']:g} on {sample.get('cpus')} CPUs ({sample.get('per_cpu', 0):g} per CPU"
    pressure = sample.get("cpu_pressure")
    return text + (f"; CPU pressure {pressure:g}%)" if isinstance(pressure, int | float) else ")")


def run_load(history: Any) -> str:
    """The machine's load when a run started and when its teardown began, as one line ('' when
    the run recorded none): from the ``run`` and ``teardown`` entries of its history."""
    start = history.first(actor="harness", f="run", type="invoke")
    end = history.first(actor="harness", f="teardown")
    parts = [f"{when} {text}" for when, entry in (("at start", start), ("at teardown", end))
             if entry is not None and (text := load_text(entry.get("load")))]
    return "; ".join(parts)


def oversubscribed(history: Any) -> bool:
    """Whether more tasks wanted a CPU than the machine has, at the start or the teardown."""
    for f, kwargs in (("run", {"type": "invoke"}), ("teardown", {})):
        entry = history.first(actor="harness", f=f, **kwargs)
        sample = entry.get("load") if entry is not None else None
        if isinstance(sample, dict) and isinstance(sample.get("per_cpu"), int | float) and sample["per_cpu"] > 1:
            return True
    return False
