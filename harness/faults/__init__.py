"""Faults: a registry keyed by ``kind``, one small class per kind.

Adding a fault is adding one module in this package (it is imported automatically)
that defines a ``FaultSpec`` subclass (its YAML parameters, ``kind: Literal[...]``)
and a ``Fault`` subclass decorated with ``@register``::

    class PauseSpec(FaultSpec):
        kind: Literal["pause"]
        target: Name

    @register
    class Pause(Fault):
        kind = "pause"
        Spec = PauseSpec
        healable = True
        def inject(self, ctx): ...   # returns a dict recorded as the completion value
        def heal(self, ctx): ...     # idempotent; safe when nothing was injected

The runner records every inject and heal as invoke/ok|fail entries by the actor
``nemesis`` (value carries ``fault``: the fault's name, and ``kind``), heals every
active fault in ``finally`` and on SIGINT/SIGTERM, and calls ``sweep(run_id)`` of
every kind from ``mxchaos cleanup`` so a crashed run's leftovers (rules, qdiscs,
proxies named after the run id) can be removed. Faults reach processes, hosts and proxies
only through ``FaultContext``, never through the runner's internals.
"""

from __future__ import annotations

import importlib
import pkgutil
import signal
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Protocol, Union

from pydantic import BeforeValidator, Field, WithJsonSchema

from harness.spec import Duration, Name, Scalar, SourceOf, Strict, Target, custom_error

__all__ = [
    "REGISTRY",
    "Fault",
    "FaultContext",
    "FaultSpec",
    "HostView",
    "ProcessView",
    "ProxyView",
    "Signal",
    "fault_spec_union",
    "make_fault",
    "parse_signal",
    "register",
]


def parse_signal(value: Any) -> int:
    """``KILL`` / ``SIGKILL`` / ``9`` / ``"9"`` -> ``signal.SIGKILL``; anything else is an error."""
    if isinstance(value, bool):
        raise custom_error("signal", f"not a signal: {value!r}")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        number = int(value)
        try:
            return int(signal.Signals(number))
        except ValueError:
            raise custom_error("signal", f"{number} is not a signal number on this system") from None
    if isinstance(value, str):
        name = value.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signal.Signals.__members__:
            return int(signal.Signals[name])
    known = "KILL, TERM, INT, QUIT, ABRT, SEGV, STOP, CONT, HUP, USR1, USR2 ..."
    raise custom_error("signal", f"{value!r} is not a signal name or number (e.g. {known})")


Signal = Annotated[
    int,
    BeforeValidator(parse_signal),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}], "description": "signal name or number"}),
]


class FaultSpec(Strict):
    """Keys every fault has. ``name`` lets a later ``heal`` step refer to it; ``duration``
    heals it automatically (healable kinds only)."""

    kind: str
    name: Name | None = None
    duration: Duration | None = None


class ProcessView(Protocol):
    """What a fault may know about a scenario process (its current incarnation)."""

    name: str
    role: str
    pid: int | None
    incarnation: int
    host: str  # the scenario host it runs on

    @property
    def alive(self) -> bool: ...


class HostView(Protocol):
    """A scenario host, as a network fault reaches it."""

    name: str
    kind: str  # local | netns
    address: str  # where its processes are reached
    netns: str | None  # its network namespace (netns hosts)
    link: str | None  # the root-namespace end of its veth, a port of the run's bridge (netns hosts)
    inner_link: str | None  # the namespace end of that veth (netns hosts)


class ProxyView(Protocol):
    """A proxy of the run's toxiproxy server, as a fault reaches it."""

    name: str  # the scenario's name for it
    proxy: str  # its name in toxiproxy (``<run id>.<name>``)
    api: str  # the toxiproxy API, ``http://127.0.0.1:PORT``
    listen: str  # where clients connect
    upstream: str  # where it forwards to


class FaultContext(Protocol):
    """The runner's side of a fault: the only way a fault touches the world."""

    run_id: str

    def proc(self, name: str) -> ProcessView: ...

    def locate(self, target: Target) -> HostView:
        """The host a target means now: a host name, a process name (the host it runs on) or
        ``{source_of: reader}`` (the host of the source that reader is attempting)."""
        ...

    def resolve(self, target: Target) -> str:
        """The process name a target means now (``{source_of: reader}``: the source that
        reader is attempting); FaultError when it cannot be told yet."""
        ...

    def send_signal(self, name: str, sig: int, *, group: bool = True) -> int:
        """Signal the current incarnation of ``name``; returns its pid. FaultError if not running."""
        ...

    def signal_pid(self, pid: int, sig: int, *, group: bool = True) -> bool:
        """Signal a specific pid (or its group) if it is still a process of this run; False if gone."""
        ...

    def stop(self, name: str, grace: float) -> dict[str, Any]:
        """TERM, wait ``grace``, KILL; recorded. Returns ``{rc, escalated}``."""
        ...

    def start(self, name: str) -> dict[str, Any]:
        """Start a new incarnation of ``name`` (waits for its server like a start step)."""
        ...

    def wait_event(self, name: str, event: str, where: Mapping[str, Scalar], within: float) -> dict[str, Any]:
        """Wait for ``event`` from the current incarnation of ``name``; FaultError at the deadline."""
        ...

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake (RunInterrupted / StepFailed) if the run is aborted."""
        ...

    def proxy(self, name: str) -> ProxyView:
        """The scenario proxy ``name`` on the run's toxiproxy server (created now if its
        upstream server is running but it is not yet); FaultError when there is none."""
        ...


class Fault:
    """One injected fault. Instances hold per-injection state so ``heal`` undoes exactly
    what ``inject`` did (e.g. resumes the pid it paused, not a later incarnation)."""

    kind: ClassVar[str]
    Spec: ClassVar[type[FaultSpec]]
    healable: ClassVar[bool] = False  # True: the fault has a window that heal closes
    requires: ClassVar[tuple[str, ...]] = ()  # capabilities (root, tc, iptables, toxiproxy)

    def __init__(self, spec: FaultSpec, name: str) -> None:
        self.spec = spec
        self.name = name

    def targets(self) -> tuple[str, ...]:
        """Scenario process names this fault refers to (validated before the run); for a
        ``{source_of: reader}`` target, the reader."""
        target = getattr(self.spec, "target", None)
        if isinstance(target, SourceOf):
            return (target.source_of,)
        return (target,) if isinstance(target, str) else ()

    def host_targets(self) -> tuple[tuple[str, Target], ...]:
        """(key, target) of each parameter naming a host: a host name, a process name (its
        host) or ``{source_of: reader}``. Validated before the run: each must lead to a host of
        a kind in ``host_kinds``."""
        return ()

    host_kinds: ClassVar[tuple[str, ...]] = ("netns",)

    def proxies(self) -> tuple[str, ...]:
        """Scenario proxy names this fault refers to (validated before the run)."""
        proxy = getattr(self.spec, "proxy", None)
        return (proxy,) if isinstance(proxy, str) else ()

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        raise NotImplementedError

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        """Undo the fault. Idempotent; a no-op for faults with nothing to undo."""
        return None

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        """Remove what a crashed run of this kind left behind; returns what it removed."""
        return []


REGISTRY: dict[str, type[Fault]] = {}


def register(cls: type[Fault]) -> type[Fault]:
    kind = cls.kind
    if kind in REGISTRY and REGISTRY[kind] is not cls:
        raise ValueError(f"fault kind {kind!r} registered twice ({REGISTRY[kind].__name__}, {cls.__name__})")
    annotation = cls.Spec.model_fields["kind"].annotation
    if getattr(annotation, "__args__", None) != (kind,):
        raise ValueError(f"{cls.Spec.__name__}.kind must be Literal[{kind!r}]")
    REGISTRY[kind] = cls
    return cls


def make_fault(spec: FaultSpec, name: str) -> Fault:
    return REGISTRY[spec.kind](spec, name)


def fault_spec_union() -> Any:
    """The discriminated union of every registered fault's spec, for scenario.py."""
    specs = tuple(REGISTRY[kind].Spec for kind in sorted(REGISTRY))
    if len(specs) == 1:
        return specs[0]
    return Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007 (runtime union of a tuple)


def _discover() -> None:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_discover()
