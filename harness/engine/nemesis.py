"""The nemesis: injecting faults, healing them within a bound, and healing all of them.

Every inject and heal is recorded by the actor ``nemesis`` (invoke, then ok / fail, or info
with ``indeterminate`` when its outcome is unknown, or info with ``skipped`` when the fault's
target was gone and its ``if_gone`` is ``skip``). Before injecting, the nemesis checks that the
targets a fault needs running (``FaultSpec.running_refs``) are: one that is not (it exited, or
was never started) fails the step naming it and how and when it ended, or (``if_gone: skip``)
skips the fault, nothing to heal. A target that ends during the inject, so the inject fails,
has the same outcome. A healable fault stays active until a
``heal`` step, its ``duration`` (a timer), or teardown heals it; each heal runs in its own
thread and is waited for at most ``budgets.heal``; a heal that fails or overruns is recorded,
kept for the run's outcome, and the next fault is healed regardless.

Faults reach the run only through ``RunFaultContext`` (``harness.faults.FaultContext``): the
process table, the hosts, the run's proxies and its clock, nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness import faults as fault_registry
from harness.engine.processes import ProcessTable, await_event
from harness.engine.proxies import ProxyView, RunProxies
from harness.engine.waits import Aborted, RunClock
from harness.errors import FaultError, HarnessError, RunInterrupted, StepFailed
from harness.hosts.base import Host, Place
from harness.hosts.clocks import HOST_CLOCKS, ClockOffsets
from harness.record.timeline import Timeline
from harness.scenario import Scenario
from harness.spec import Scalar, SourceOf
from mxref.pki import RunCredentials

__all__ = ["HostView", "Nemesis", "NemesisContext", "ProcView", "RunFaultContext"]


class _HealOverrun(Exception):
    """A heal did not return within ``budgets.heal``."""


@dataclass(frozen=True)
class ProcView:
    """A scenario process as a fault sees it (``harness.faults.ProcessView``)."""

    name: str
    role: str
    pid: int | None
    incarnation: int
    alive: bool
    host: str
    ended: str | None = None


@dataclass(frozen=True)
class HostView:
    """A scenario host as a network fault reaches it (``harness.faults.HostView``)."""

    name: str
    kind: str
    address: str
    place: Place | None
    link: str | None
    inner_link: str | None


class NemesisContext(fault_registry.FaultContext, Protocol):
    """What the nemesis needs: a ``FaultContext``, and the same for heals (``RunFaultContext``;
    unit tests give a fake)."""

    def healing(self) -> fault_registry.FaultContext:
        """The context a heal runs with (it never creates a proxy)."""
        ...


class RunFaultContext:
    """``FaultContext`` over one run: what a fault may do, nothing more."""

    def __init__(
        self,
        *,
        run_id: str,
        run_dir: Path,
        table: ProcessTable,
        hosts: Mapping[str, Host],
        clock: RunClock,
        proxies: RunProxies,
        start: Callable[[str, ClockOffsets], dict[str, Any]],
        ensure_proxy: Callable[[str], ProxyView],
        proxy_names: frozenset[str],
        credentials: Callable[[], RunCredentials | None] = lambda: None,
        healing: bool = False,
    ) -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self._table = table
        self._hosts = hosts
        self._clock = clock
        self._proxies = proxies
        self._start = start
        self._ensure_proxy = ensure_proxy
        self._proxy_names = proxy_names
        self._healing = healing
        self._credentials = credentials  # asked when a fault runs: the run makes them after this context

    def healing(self) -> RunFaultContext:
        """The same context for a heal: it never creates a proxy."""
        return RunFaultContext(
            run_id=self.run_id, run_dir=self.run_dir, table=self._table, hosts=self._hosts, clock=self._clock, proxies=self._proxies,
            start=self._start, ensure_proxy=self._ensure_proxy, proxy_names=self._proxy_names,
            credentials=self._credentials, healing=True,
        )

    @property
    def credentials(self) -> RunCredentials | None:
        return self._credentials()

    def _known(self, name: str) -> str:
        if name not in self._table.states:
            raise FaultError(f"the scenario has no process named {name!r}")
        return name

    def proc(self, name: str) -> ProcView:
        st = self._table.refresh(self._known(name))  # an exit the monitor has not seen yet counts
        return ProcView(st.name, st.role, st.pid if st.alive else None, st.incarnation, st.alive, st.host.name, st.ended)

    def locate(self, target: str | SourceOf) -> HostView:
        if isinstance(target, str) and target in self._hosts:
            name = target
        else:
            name = self._table.state(self._known(self.resolve(target))).host.name
        host = self._hosts[name]
        return HostView(name, host.kind, host.address, host.fault_place(), host.link, host.inner_link)

    def resolve(self, target: str | SourceOf) -> str:
        if isinstance(target, str):
            return target
        reader = target.source_of
        entries = self._table.timeline.entries()
        attempt = None
        for e in entries:
            if e.actor == reader and e.type == "info" and e.f == "attempt_start":
                attempt = e
        if attempt is None:
            raise FaultError(f"source_of {reader}: {reader} has not started an attempt yet")
        worker_id = attempt.get("worker_id")
        for e in reversed(entries):
            if e.type == "info" and e.f == "published" and e.get("worker_id") == worker_id:
                return str(e.actor)
        raise FaultError(f"source_of {reader}: no process of this run published worker {worker_id!r}")

    def send_signal(self, name: str, sig: int, *, group: bool = True) -> int:
        return self._table.send_signal(self._known(name), sig, group=group)

    def signal_pid(self, pid: int, sig: int, *, group: bool = True) -> bool:
        return self._table.signal_pid(pid, sig, group=group)

    def stop(self, name: str, grace: float) -> dict[str, Any]:
        return self._table.stop(self._known(name), grace, reason="fault")

    def start(self, name: str, clocks: ClockOffsets = HOST_CLOCKS) -> dict[str, Any]:
        return self._start(self._known(name), clocks)

    def wait_event(self, name: str, event: str, where: Mapping[str, Scalar], within: float) -> dict[str, Any]:
        entry = await_event(self._table, self._known(name), event, where, self._clock.step_deadline(within))
        if entry is None:
            raise FaultError(f"{name} did not emit {event} within {within:g}s")
        return {"t": entry.t, **entry.value}

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)

    def proxy(self, name: str) -> ProxyView:
        if name not in self._proxy_names:
            raise FaultError(f"the scenario has no proxy named {name!r}")
        view = self._proxies.view(name)
        if view is not None:
            return view
        if self._healing:
            raise FaultError(f"proxy {name} was never created")
        try:
            return self._ensure_proxy(name)
        except StepFailed as exc:
            raise FaultError(f"proxy {name}: {exc.reason}") from None
        except HarnessError as exc:
            raise FaultError(str(exc)) from None


class Nemesis:
    """The run's faults: inject, heal (bounded), heal on a timer, heal everything."""

    def __init__(self, sc: Scenario, timeline: Timeline, ctx: NemesisContext) -> None:
        self.timeline = timeline
        self.heal_budget = sc.budgets.heal
        self.ctx = ctx
        self._lock = threading.Lock()
        self._active: dict[str, tuple[fault_registry.AnyFault, Any]] = {}  # name -> (fault, its inject's token)
        self._timers: list[threading.Timer] = []
        self._counter = 0
        self._closing = False
        self.heal_failures: list[str] = []  # "name (kind): why", in the order they happened

    def active(self) -> list[str]:
        with self._lock:
            return list(self._active)

    def active_unlocked(self) -> list[str]:
        """``active`` without the lock, for a signal handler (it may have interrupted the lock's
        holder): a copy taken under the GIL, at worst a step behind."""
        return list(self._active)

    def inject(self, spec: fault_registry.FaultSpec) -> str | None:
        """Inject ``spec`` (recorded); None once injected, or why it was skipped (a target is
        gone and ``if_gone`` is ``skip``). FaultError / StepFailed when it failed."""
        with self._lock:
            self._counter += 1
            name = spec.name or f"{spec.kind}-{self._counter}"
        fault = fault_registry.make_fault(spec, name)
        dumped = spec.model_dump(mode="json")
        # the target as JSON ({source_of: r} a mapping, not its model): the same live and read back
        base = {"fault": name, "kind": spec.kind, "target": dumped.get("target")}
        healable = type(fault).healable
        self.timeline.append("invoke", "nemesis", "inject", {**base, "spec": dumped})
        try:
            why = fault_registry.gone(spec, self.ctx)
            if why is None:
                try:
                    injected = fault.inject(self.ctx)  # completes, or undoes what it did and raises
                except FaultError:
                    why = self._gone_during(spec)
                    if why is None:
                        raise
            if why is not None:
                if spec.if_gone == "skip":
                    self.timeline.append("info", "nemesis", "inject", {**base, "skipped": why})
                    return why
                raise FaultError(f"fault {name} ({spec.kind}): {why} (if_gone: fail)")
            if healable:  # the runner defers its signals until this is recorded (Runner._signals_deferred)
                with self._lock:
                    self._active[name] = (fault, injected.token)
        except (Aborted, RunInterrupted) as exc:
            reason = "interrupted" if isinstance(exc, RunInterrupted) else "aborted"
            self.timeline.append("info", "nemesis", "inject", {**base, "indeterminate": True, "error": reason})
            raise
        except FaultError as exc:
            measured = {} if exc.witness is None else {"witness": exc.witness}
            self.timeline.append("fail", "nemesis", "inject", {**base, "error": str(exc), **measured})
            raise
        except StepFailed as exc:
            self.timeline.append("fail", "nemesis", "inject", {**base, "error": exc.reason})
            raise
        except Exception as exc:  # a bug of the fault: indeterminate (its inject undid what it did)
            self.timeline.append("info", "nemesis", "inject", {**base, "indeterminate": True, "error": f"{type(exc).__name__}: {exc}"})
            raise FaultError(f"fault {name} ({spec.kind}) raised {type(exc).__name__}: {exc}") from exc
        self.timeline.append("ok", "nemesis", "inject", {**base, "healable": healable, **injected.record})
        if spec.duration and healable:
            timer = threading.Timer(spec.duration, self._auto_heal, args=(name,))
            timer.daemon = True
            with self._lock:
                self._timers.append(timer)
            timer.start()
        return None

    def _gone_during(self, spec: fault_registry.FaultSpec) -> str | None:
        """After an inject failed: why, if a target it needs is gone now (it ended during the
        inject; the inject undid what it did), else None (the failure is the inject's own)."""
        try:
            why = fault_registry.gone(spec, self.ctx)
        except FaultError:
            return None
        return None if why is None else f"{why}, during the inject"

    def _auto_heal(self, name: str) -> None:
        if self._closing:
            return
        try:
            self.heal(name, reason="duration")
        except Exception:  # noqa: BLE001 - recorded inside heal; teardown heals again
            pass

    def heal(self, name: str, reason: str = "step") -> None:
        with self._lock:
            active = self._active.get(name)
        if active is None:
            self.timeline.append("info", "nemesis", "heal", {"fault": name, "reason": reason, "noop": True})
            return
        fault, token = active
        base = {"fault": name, "kind": fault.kind, "reason": reason}
        self.timeline.append("invoke", "nemesis", "heal", base)
        try:
            value = self._bounded_heal(fault, token) or {}
        except RunInterrupted:
            self.timeline.append("info", "nemesis", "heal", {**base, "indeterminate": True, "error": "interrupted"})
            raise
        except _HealOverrun:
            # the heal is still running in its thread: never heal this fault again concurrently
            error = f"did not return within {self.heal_budget:g}s (budgets.heal)"
            with self._lock:
                self._active.pop(name, None)
            self.timeline.append("fail", "nemesis", "heal", {**base, "error": error, "timed_out": True})
            self.heal_failures.append(f"{name} ({fault.kind}) {error}")
            raise FaultError(f"healing {name} {error}") from None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.timeline.append("fail", "nemesis", "heal", {**base, "error": error})
            self.heal_failures.append(f"{name} ({fault.kind}) raised {error}")
            raise FaultError(f"healing {name} failed: {exc}") from exc
        with self._lock:
            self._active.pop(name, None)
        self.timeline.append("ok", "nemesis", "heal", {**base, **value})

    def _bounded_heal(self, fault: fault_registry.AnyFault, token: Any) -> dict[str, Any] | None:
        """``fault.heal`` in its own thread, waited for at most ``budgets.heal`` (a heal that
        blocks, e.g. on an unreachable host, must not hold up the rest of the teardown)."""
        outcome: dict[str, Any] = {}
        done = threading.Event()
        ctx = self.ctx.healing()

        def heal() -> None:
            try:
                outcome["value"] = fault.heal(ctx, token)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome["error"] = exc
            finally:
                done.set()

        thread = threading.Thread(target=heal, name=f"mxchaos-heal-{fault.name}", daemon=True)
        thread.start()
        if not done.wait(self.heal_budget):
            raise _HealOverrun()
        if "error" in outcome:
            raise outcome["error"]
        value: dict[str, Any] | None = outcome.get("value")
        return value

    def heal_all(self) -> None:
        """Teardown: no more timed heals; heal every active fault, newest first (each bounded;
        a failure is recorded and the next is healed)."""
        self._closing = True
        with self._lock:
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        for name in reversed(self.active()):
            try:
                self.heal(name, reason="teardown")
            except Exception:  # noqa: BLE001 - recorded inside heal; the next is healed regardless
                pass
