"""Benchmark: how late an event-triggered fault fires, and what the monitor costs.

Runs a scenario of fake processes (``tests/fixtures/fakeproc.py``) whose faults wait for
events, with the monitor in each wake mode side by side (alternating runs, one process), and
prints per mode:

- **await → fault**: from a process's event (its own ``mono``, on the run clock) matched by an
  ``await`` step to the ``invoke`` of the fault step right after it (``nemesis inject``);
- **depart**: from the event a ``depart`` fault waits for (``ctx.wait_event``) to its kill
  (the inject's ``ok``);
- the monitor thread's CPU time per second of run, and how often it woke.

Figures, not asserts: run it by hand and compare the lines it prints::

    PYTHONPATH=$PWD python tests/bench/event_latency.py --runs 10 --cycles 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.runner import Runner
from harness.record.timeline import History
from harness.scenario import load_scenario

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fakeproc.py"


def scenario_text(cycles: int) -> str:
    steps = "".join(
        f"  - await: {{process: source-1, event: heartbeat, since: step}}\n"
        f"  - fault: {{kind: kill, target: source-1, signal: CONT, name: hb{i}}}\n"
        for i in range(cycles)
    )
    head = textwrap.dedent(
        f"""\
        name: bench_event_latency
        launcher: ["{{python}}", "{FAKE}"]
        budgets: {{step: 10s, run: 90s, stop_grace: 2s, progress: 30s}}
        model: {{tensors: 1, tensor_mib: 1}}
        processes:
          server: {{role: server}}
          source-1: {{role: source, options: {{heartbeat_interval: 130ms}}}}
          reader-1: {{role: reader, options: {{serve_after_load: true}}}}
        steps:
          - start: server
          - start: source-1
          - await: {{process: source-1, event: status_change, where: {{status: READY}}}}
        """
    )
    tail = (
        "  - start: reader-1\n"
        "  - fault: {kind: depart, target: reader-1, after: load_done, name: depart}\n"
        "  - await: {process: reader-1, exit: true, code: any}\n"
    )
    return head + steps + tail


@dataclass
class Figures:
    awaits: list[float] = field(default_factory=list)  # seconds
    departs: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # monitor CPU seconds per run second
    wakes: list[float] = field(default_factory=list)  # monitor wakes per run second


def latencies(history: History) -> tuple[list[float], list[float]]:
    """(await step's matched event -> next fault's invoke, depart's event -> its kill)."""
    awaits: list[float] = []
    matched: float | None = None
    for e in history:
        if e.actor == "harness" and e.f == "step" and e.type == "ok":
            matched = e.get("matched_t")
        elif e.actor == "nemesis" and e.f == "inject" and e.type == "invoke" and str(e.get("fault", "")).startswith("hb"):
            if matched is not None:
                awaits.append(e.t - float(matched))
            matched = None
    departs = [e.t - float(e.get("after_t")) for e in history.select(actor="nemesis", f="inject", type="ok", where={"fault": "depart"})]
    return awaits, departs


def one_run(out: Path, cycles: int, mode: str, figures: Figures) -> None:
    path = out / "bench_event_latency.yaml"
    path.write_text(scenario_text(cycles))
    runner = Runner(load_scenario(path), out_dir=out / "runs", install_signal_handlers=False)
    runner.watchers.wake = mode
    result = runner.run()
    if result.status != "completed":
        raise SystemExit(f"{mode}: the run did not complete: {result.status} {result.reason}")
    awaits, departs = latencies(result.history)
    figures.awaits += awaits
    figures.departs += departs
    seconds = max(result.seconds, 1e-9)
    figures.cpu.append(runner.watchers.monitor_cpu / seconds)
    figures.wakes.append(runner.watchers.monitor_wakes / seconds)


def describe(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"n={len(ms):3d}  p50 {statistics.median(ms):6.2f} ms  p95 {p95:6.2f} ms  max {ms[-1]:6.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=10, help="runs per mode (alternating)")
    parser.add_argument("--cycles", type=int, default=10, help="await -> fault cycles per run")
    parser.add_argument("--modes", default="poll,inotify", help="monitor wake modes to compare, in order")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    figures = {mode: Figures() for mode in modes}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mxchaos-bench-") as tmp:
        for i in range(args.runs):
            for mode in modes:
                one_run(Path(tmp), args.cycles, mode, figures[mode])
            print(f"run {i + 1}/{args.runs} done ({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)
    for mode in modes:
        f = figures[mode]
        print(f"[{mode}]")
        print(f"  await -> fault invoke : {describe(f.awaits)}")
        print(f"  depart event -> kill  : {describe(f.departs)}")
        if f.cpu:
            print(f"  monitor CPU           : {statistics.median(f.cpu) * 1000:6.2f} ms per run second (median of {len(f.cpu)} runs)")
            print(f"  monitor wakes         : {statistics.median(f.wakes):6.1f} per run second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
