"""The step interpreter: one handler per step kind (start, stop, restart, sleep, mark, fault,
heal, parallel, await), each bounded by the run clock, each step recorded on the timeline as
invoked, then ok, failed or indeterminate. The runner builds it and calls ``run`` with the
scenario's steps; it knows the run's parts only through what it is handed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from pydantic import BaseModel

from harness.engine.nemesis import Nemesis
from harness.engine.processes import ProcessTable, await_event
from harness.engine.waits import Aborted, RunClock
from harness.engine.watch import Scraper, Stacks
from harness.errors import FaultError, HarnessError, RunInterrupted, StepFailed
from harness.record.timeline import Entry, Timeline
from harness.scenario import (
    AwaitEvent,
    AwaitExit,
    AwaitMetric,
    AwaitStep,
    FaultStep,
    HealStep,
    MarkStep,
    ParallelStep,
    RestartStep,
    Scenario,
    SleepStep,
    StartStep,
    StopStep,
    describe_step,
)
from harness.scrape import compare, sample_value

__all__ = ["StepInterpreter", "StepValue"]

StepValue = dict[str, Any] | None


class StepInterpreter:
    def __init__(self, scenario: Scenario, *, timeline: Timeline, clock: RunClock, table: ProcessTable, nemesis: Nemesis,
                 scraper: Scraper, stacks: Stacks, start: Callable[[str, float], object],
                 deferred: Callable[[], AbstractContextManager[None]]) -> None:
        self.scenario = scenario
        self.timeline = timeline
        self.clock = clock
        self.table = table
        self.nemesis = nemesis
        self.scraper = scraper
        self.stacks = stacks
        self.start = start  # starts a process by name, by a deadline (the runner's start_process)
        self.deferred = deferred  # signals held off while it is entered (a fault is recorded as it lands)
        self._handlers: dict[type[BaseModel], Callable[[str, Any], StepValue]] = {
            StartStep: self._start_step,
            StopStep: self._stop_step,
            RestartStep: self._restart_step,
            SleepStep: self._sleep_step,
            MarkStep: self._mark_step,
            FaultStep: self._fault_step,
            HealStep: self._heal_step,
            AwaitStep: self._await_step,
            ParallelStep: self._parallel_step,
        }

    @property
    def handled(self) -> frozenset[type[BaseModel]]:
        """The step models there is a handler for (every registered step kind:
        ``tests/unit/harness/test_harness_structure.py`` holds it to ``harness.scenario.STEPS``)."""
        return frozenset(self._handlers)

    def run(self, steps: Sequence[BaseModel], prefix: str) -> None:
        """Interpret ``steps`` in order, numbered ``prefix1``, ``prefix2`` ...; each ends ok, failed
        (``StepFailed``) or indeterminate (an abort, an interrupt), as the timeline records it."""
        for i, step in enumerate(steps):
            sid = f"{prefix}{i + 1}"
            if self.clock.signalled is not None:
                raise RunInterrupted(self.clock.signalled)
            if self.clock.aborted:
                raise StepFailed(sid, self.clock.reason or "aborted")
            text = describe_step(step)
            self.timeline.append("invoke", "harness", "step", {"step": sid, "text": text})
            try:
                value = self._handlers[type(step)](sid, step) or {}
            except Aborted:
                reason = self.clock.reason or "aborted"
                self.timeline.append("info", "harness", "step", {"step": sid, "text": text, "indeterminate": True, "error": reason})
                raise StepFailed(sid, reason) from None
            except RunInterrupted:
                self.timeline.append("info", "harness", "step", {"step": sid, "text": text, "indeterminate": True, "error": "interrupted"})
                raise
            except StepFailed as exc:
                self.timeline.append("fail", "harness", "step", {"step": sid, "text": text, "error": exc.reason})
                if exc.step == "-":
                    raise StepFailed(sid, exc.reason) from None
                raise
            except (FaultError, HarnessError) as exc:
                self.timeline.append("fail", "harness", "step", {"step": sid, "text": text, "error": str(exc)})
                raise StepFailed(sid, str(exc)) from None
            self.timeline.append("ok", "harness", "step", {"step": sid, "text": text, **value})

    def _start_step(self, sid: str, step: StartStep) -> StepValue:
        for name in step.start:
            self.start(name, self.clock.step_deadline())
        return None

    def _stop_step(self, sid: str, step: StopStep) -> StepValue:
        for name in step.stop.process:
            self.table.stop(name, step.stop.grace or self.scenario.budgets.stop_grace)
        return None

    def _restart_step(self, sid: str, step: RestartStep) -> StepValue:
        for name in step.restart.process:
            self.table.stop(name, step.restart.grace or self.scenario.budgets.stop_grace)
            self.start(name, self.clock.step_deadline())
        return None

    def _sleep_step(self, sid: str, step: SleepStep) -> StepValue:
        self.clock.sleep(step.sleep)
        return None

    def _mark_step(self, sid: str, step: MarkStep) -> StepValue:
        self.timeline.append("info", "harness", "mark", {"mark": step.mark, "step": sid})
        return None

    def _fault_step(self, sid: str, step: FaultStep) -> StepValue:
        with self.deferred():  # a fault is never injected without being recorded as active
            skipped = self.nemesis.inject(step.fault)
        return {"skipped": skipped} if skipped is not None else None

    def _heal_step(self, sid: str, step: HealStep) -> StepValue:
        for name in self.nemesis.active() if "all" in step.heal else list(step.heal):
            self.nemesis.heal(name)
        return None

    def _parallel_step(self, sid: str, step: ParallelStep) -> StepValue:
        errors: list[BaseException] = []

        def branch(steps: Sequence[BaseModel], prefix: str) -> None:
            try:
                self.run(steps, prefix)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                errors.append(exc)
                self.clock.abort(f"parallel branch {prefix.rstrip('.')} failed")

        threads = [
            threading.Thread(target=branch, args=(b, f"{sid}.{i + 1}."), name=f"mxchaos-branch-{sid}.{i + 1}", daemon=True)
            for i, b in enumerate(step.parallel)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            # branches end at their own deadlines; the bound guards against a harness bug
            thread.join(timeout=max(1.0, self.clock.remaining() + 30))
        if any(t.is_alive() for t in threads):
            raise StepFailed(sid, "a parallel branch did not finish by the run's deadline")
        for exc in errors:
            if isinstance(exc, RunInterrupted):
                raise exc
        failures = [e for e in errors if isinstance(e, StepFailed)]
        if failures:  # the first to fail is the cause; the others were woken by the abort
            raise StepFailed(failures[0].step, failures[0].reason)
        if errors:
            raise errors[0]
        return None

    # ------------------------------------------------------------------ awaits

    def _await_step(self, sid: str, step: AwaitStep) -> StepValue:
        arg = step.await_
        if isinstance(arg, AwaitEvent):
            return self._await_event(sid, arg)
        if isinstance(arg, AwaitExit):
            return self._await_exit(sid, arg)
        return self._await_metric(sid, arg)

    def _await_event(self, sid: str, arg: AwaitEvent) -> StepValue:
        player = self.scenario.players().get(arg.process, "mxref")
        if arg.subjects is not None and player not in arg.subjects:  # another subject's event: not awaited
            self.timeline.append("info", "harness", "await_passed_over",
                                 {"step": sid, "process": arg.process, "event": arg.event, "player": player,
                                  "subjects": list(arg.subjects)})
            return {"not_for_subject": player}
        entry = await_event(self.table, arg.process, arg.event, arg.where, self.clock.step_deadline(arg.within), arg.count, arg.since)
        if entry is None:
            return self._await_timeout(sid, arg.on_timeout, f"{arg.process} did not emit {arg.event} in time")
        return {"matched_t": round(entry.t, 6)}

    def _await_exit(self, sid: str, arg: AwaitExit) -> StepValue:
        st = self.table.state(arg.process)
        if st.proc is None:
            raise StepFailed(sid, f"{arg.process} was never started")
        incarnation = st.incarnation

        def exited(e: Entry) -> bool:
            return e.actor == arg.process and e.f == "process_exit" and e.get("incarnation") == incarnation

        entry = self.clock.wait_entry(exited, self.clock.step_deadline(arg.within), start=max(0, st.start_index - 1))
        if entry is None:
            return self._await_timeout(sid, arg.on_timeout, f"{arg.process} did not exit in time")
        rc = entry.get("rc")
        if arg.code is not None and "any" not in arg.code and rc not in arg.code:
            raise StepFailed(sid, f"{arg.process} exited {rc}, expected {' or '.join(map(str, arg.code))}")
        return {"rc": rc}

    def _await_metric(self, sid: str, arg: AwaitMetric) -> StepValue:
        cond = arg.metric
        st = self.table.state(cond.process)
        deadline = self.clock.step_deadline(arg.within)
        last: float | None = None
        while True:
            port = st.ports.get("metrics") if st.alive else None
            if port:
                entry = self.scraper.scrape_one(st, port)
                if entry.get("ok"):
                    value = sample_value(entry.get("samples", ()), cond.metric, cond.labels)
                    last = cond.default if value is None else value
                    if last is not None and compare(cond.op, last, cond.value):
                        return {"value": last, "matched_t": round(entry.t, 6)}
            if time.monotonic() + arg.every > deadline:
                shown = "absent" if last is None else f"{last:g}"
                message = f"{cond.process}: {cond.metric} {cond.op} {cond.value:g} not met in time (last {shown})"
                return self._await_timeout(sid, arg.on_timeout, message)
            self.clock.pause(arg.every)

    def _await_timeout(self, sid: str, on_timeout: str, message: str) -> StepValue:
        stacks = self.stacks.dump(f"step{sid}")
        if on_timeout == "continue":
            self.timeline.append("info", "harness", "await_timeout", {"step": sid, "error": message, "stacks": stacks})
            return {"timed_out": True}
        raise StepFailed(sid, message)
