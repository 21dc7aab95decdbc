"""``mxchaos replay RUN_DIR``: the scenario a run actually executed, as a standalone file.

A run folder holds the scenario as it was given (``scenario.json``, seed override applied)
and the timeline of what happened. The replay is that scenario with what the timeline
settled written in:

- **targets resolved**: a fault parameter written ``{source_of: reader-1}`` becomes the
  process (or host) the nemesis recorded hitting (``target`` / ``peer`` of the inject's
  ``ok`` entry; ``host`` / ``peer_host`` for the network kinds), so the rerun hits the same
  one whichever candidate the reader tries first;
- **fault times as they happened**: a fault placed after an ``await`` of an event (or after
  another fault), with ``sleep`` steps in between, gets one ``sleep`` of the delay measured
  from the awaited event's time (or the end of that fault's inject) to its inject (faults
  right after the event stay right after it); every
  fault step carries a comment with its measured time, its anchor and what was resolved;
- **the seed** of the run, and a header saying which run it came from.

A fault that was skipped (``if_gone: skip``) or failed is kept as written, with a comment
saying so. The text is validated before it is written (``harness.scenario.emit``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ScenarioInvalid
from harness.judge.verdict import RunResult
from harness.record.fault_windows import FaultWindow, target_text
from harness.record.timeline import Entry, History
from harness.reports.report import RunFolderError, load_run
from harness.scenario import AwaitEvent, AwaitStep, FaultStep, MarkStep, SleepStep, StepModel, iter_steps
from harness.scenario.emit import compact_data, scenario_text

__all__ = ["FaultRecord", "replay_text", "run_faults"]

# spec key -> what the inject's ok answer says it resolved to (a process, else a host)
RESOLVED: dict[str, Callable[[FaultWindow], str | None]] = {
    "target": lambda w: w.resolved or w.host,
    "peer": lambda w: w.peer or w.peer_host,
}


@dataclass
class FaultRecord:
    """What the timeline says about one fault step of the run."""

    step_id: str
    spec: dict[str, Any]
    window: FaultWindow | None = None  # None: the step never fired

    @property
    def invoked_t(self) -> float | None:
        return None if self.window is None else self.window.start

    @property
    def done_t(self) -> float | None:
        """When the inject ended (what a following sleep started after)."""
        return None if self.window is None else self.window.inject_t

    @property
    def resolved(self) -> dict[str, str]:
        """Spec key -> the name it resolved to (keys written ``{source_of: r}`` only)."""
        w = self.window
        if w is None or not w.injected:
            return {}
        found = {key: how(w) for key, how in RESOLVED.items() if isinstance(self.spec.get(key), dict)}
        return {key: name for key, name in found.items() if name is not None}


def _step_entries(history: History) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = {}
    for e in history:
        if e.actor == "harness" and e.f == "step":
            out.setdefault(str(e.get("step")), []).append(e)
    return out


def run_faults(result: RunResult) -> dict[str, FaultRecord]:
    """Step id -> what happened to that fault step in the run (matched to the fault windows
    by the step's spec, in order, so parallel branches pair up too)."""
    history = result.history
    windows = history.fault_windows()
    used: set[int] = set()
    out: dict[str, FaultRecord] = {}
    steps = _step_entries(history)
    for ref in iter_steps(result.scenario.steps):
        if not isinstance(ref.step, FaultStep):
            continue
        spec = ref.step.fault.model_dump(mode="json")
        rec = FaultRecord(ref.id, spec)
        out[ref.id] = rec
        began = next((e.index for e in steps.get(ref.id, ()) if e.type == "invoke"), None)
        if began is None:
            continue
        rec.window = next((w for w in windows if w.index > began and w.index not in used and w.spec == spec), None)
        if rec.window is not None:
            used.add(rec.window.index)
    return out


def _anchor_t(result: RunResult, step_id: str) -> float | None:
    """When the event an ``await`` step waited for happened (its ``matched_t``)."""
    for e in _step_entries(result.history).get(step_id, ()):
        if e.type == "ok" and e.get("matched_t") is not None:
            return float(e.get("matched_t"))
    return None


def _retimed_steps(result: RunResult, faults: dict[str, FaultRecord]) -> tuple[list[Any], dict[int, list[str]]]:
    """The top-level steps as data, targets resolved and the sleeps before faults set to the
    measured delays; comments per new step index."""
    steps: Sequence[StepModel] = result.scenario.steps
    data: list[Any] = []
    comments: dict[int, list[str]] = {}
    anchor: tuple[str, float] | None = None  # (what, t) of the last timed point in this sequence
    pending_sleeps: list[SleepStep] = []

    def flush_sleeps() -> None:
        for s in pending_sleeps:
            data.append(s.model_dump(mode="json", by_alias=True, exclude_defaults=True))
        pending_sleeps.clear()

    for i, item in enumerate(steps):
        sid = str(i + 1)
        dumped = item.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if isinstance(item, SleepStep):
            pending_sleeps.append(item)
            continue
        if isinstance(item, MarkStep):
            data.append(dumped)
            continue
        if isinstance(item, FaultStep):
            rec = faults.get(sid)
            notes: list[str] = []
            if rec is not None and rec.invoked_t is not None:
                for key, name in rec.resolved.items():
                    notes.append(f"{key} {target_text(rec.spec[key])} -> {name} (resolved when it fired)")
                    dumped["fault"][key] = name
                injected = rec.window is not None and rec.window.injected
                when = f"injected at t={rec.invoked_t:.3f}s" if injected else f"attempted at t={rec.invoked_t:.3f}s"
                if anchor is not None:
                    delay = max(0.0, rec.invoked_t - anchor[1])
                    when += f", {delay * 1000:.1f} ms after {anchor[0]}"
                    if pending_sleeps:  # the written sleeps become the delay measured
                        written = sum(s.sleep for s in pending_sleeps)
                        pending_sleeps.clear()
                        if delay >= 0.001:
                            data.append({"sleep": round(delay, 3)})
                            comments.setdefault(len(data) - 1, []).append(
                                f"measured: {delay:.3f}s from {anchor[0]} to the inject (written: {written:g}s)")
                flush_sleeps()
                anchor = (f"the end of fault step {sid}", rec.done_t if rec.done_t is not None else rec.invoked_t)
                notes.insert(0, when)
            else:
                flush_sleeps()
                anchor = None
            window = None if rec is None else rec.window
            if window is None or not window.injected:
                why = "never fired (the run ended before this step)"
                if window is not None and window.inject_t is not None:
                    why = f"did not inject in the run: {window.error or window.outcome}"
                notes.append(why)
            data.append(dumped)
            comments.setdefault(len(data) - 1, []).extend(notes)
            continue
        flush_sleeps()
        data.append(dumped)
        anchor = None
        if isinstance(item, AwaitStep) and isinstance(item.await_, AwaitEvent):
            t = _anchor_t(result, sid)
            if t is not None:
                anchor = (f"{item.await_.process} {item.await_.event} (t={t:.3f}s)", t)
    flush_sleeps()
    return data, comments


def _nested_faults(faults: dict[str, FaultRecord]) -> list[str]:
    """Fault steps inside parallel branches: their targets are resolved in place, timing noted."""
    return [sid for sid in faults if "." in sid]


def _resolve_nested(data: list[Any], faults: dict[str, FaultRecord]) -> None:
    def walk(items: list[Any], prefix: str) -> None:
        for i, item in enumerate(items):
            sid = f"{prefix}{i + 1}"
            if not isinstance(item, dict):
                continue
            if "fault" in item and sid in faults:
                for key, name in faults[sid].resolved.items():
                    item["fault"][key] = name
            if "parallel" in item:
                for b, branch in enumerate(item["parallel"]):
                    branch_list = branch if isinstance(branch, list) else [branch]
                    walk(branch_list, f"{sid}.{b + 1}.")
                    item["parallel"][b] = branch_list

    walk(data, "")


def replay_text(run_dir: str | Path, *, name: str | None = None, extra_header: Sequence[str] = ()) -> str:
    """The replay of the run ``run_dir`` names (``harness.record.results.resolve_run``) as YAML text.
    Raises ``RunFolderError`` / ``ScenarioInvalid`` for a folder ``load_run`` refuses."""
    result = load_run(run_dir)
    faults = run_faults(result)
    data = compact_data(result.scenario)
    steps, comments = _retimed_steps(result, faults)
    _resolve_nested(steps, faults)
    data["steps"] = steps
    data["seed"] = result.seed
    if name is not None:
        data["name"] = name
    first: tuple[str, ...] = ("name", "description", "references", "known_defect", "seed")
    ordered: dict[str, Any] = {k: data[k] for k in first if k in data}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    nested = _nested_faults(faults)
    header = [
        f"Replayed by `mxchaos replay` from run {result.run_id}",
        f"  folder:   {result.run_dir}",
        f"  scenario: {result.scenario.name}"
        + (f" ({result.scenario.path})" if result.scenario.path else "")
        + f", seed {result.seed}, verdict {result.verdict.upper()} ({result.status})",
        f"  started:  {result.started_at}",
        "Fault targets are the processes the faults hit; a sleep before a fault is the delay measured",
        "from the awaited event to the inject. Rerun it: mxchaos run THIS_FILE",
        *extra_header,
    ]
    if nested:
        header.append(f"Faults inside parallel branches ({', '.join(nested)}): targets resolved, timing as written.")
    return scenario_text(ordered, header=header, step_comments=comments, file=f"replay of {result.run_dir}")


def add_parser(sub: Any) -> None:
    """Register ``replay`` on ``mxchaos``'s sub-parsers."""
    p = sub.add_parser(
        "replay",
        help="write the scenario a run executed (targets resolved, fault times as measured, its seed) "
        "as a standalone scenario file",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, a scenario's folder of runs (its latest), or a scenario's name (its newest run)")
    p.add_argument("-o", "--out", metavar="FILE", help="write it here (default: standard output)")
    p.add_argument("--name", help="the replayed scenario's name (default: the run's)")
    p.set_defaults(fn=cmd_replay)


def cmd_replay(args: Any) -> int:
    """Exit 0: written; 2: not a run folder, or its scenario is not valid any more."""
    try:
        text = replay_text(args.run_dir, name=args.name)
    except ScenarioInvalid as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    except RunFolderError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
