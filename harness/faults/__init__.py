"""Faults: a registry keyed by ``kind``, one small class per kind, typed by its spec.

Adding a fault is adding one module in this package (it is imported automatically)
that defines a ``FaultSpec`` subclass (its YAML parameters, ``kind: Literal[...]``, and the
scenario names it refers to) and a ``Fault`` subclass decorated with ``@register``::

    class PauseSpec(FaultSpec):
        kind: Literal["pause"]
        target: Target
        def process_refs(self) -> tuple[str, ...]:
            return (process_of(self.target),)

    @register
    class Pause(Fault[PauseSpec, Paused]):
        kind = "pause"
        Spec = PauseSpec
        healable = True
        def inject(self, ctx) -> Injected[Paused]: ...   # the token heal gets, and what is recorded
        def heal(self, ctx, token: Paused) -> dict[str, Any] | None: ...  # idempotent

``inject`` either completes and returns ``Injected(token, record)`` or undoes whatever it did
and raises (also on a ``BaseException`` such as ``RunInterrupted`` raised by a signal handler
mid-inject: register each undo on a ``contextlib.ExitStack`` before doing the thing and
``pop_all()`` once done). ``heal`` undoes exactly what the token says (the pid paused, the
chain added), never "whatever is there now"; it may be called twice. A fault keeps no
per-injection state on itself: the runner keeps the token beside the fault.

The runner records every inject and heal as invoke/ok|fail entries by the actor
``nemesis`` (value carries ``fault``: the fault's name, and ``kind``; an inject's ok value
is ``Injected.record``), heals every active fault in ``finally`` and on SIGINT/SIGTERM, and
calls ``sweep(run_id)`` of every kind from ``mxchaos cleanup`` so a crashed run's leftovers
(rules, qdiscs, proxies named after the run id) can be removed. Faults reach processes, hosts
and proxies only through ``FaultContext``, never through the runner's internals; network
faults run their commands through ``harness.faults.commands`` (the seam unit tests stub).

Scenario validation asks the spec what it refers to, before anything runs:
``process_refs()`` (process names), ``proxy_refs()`` (proxy names), ``host_refs()``
(``(key, target)`` of each parameter naming a host), ``host_kinds`` (the host kinds those
must lead to) and ``process_issues(processes)`` (what the named processes must be, e.g. started
with debug hooks).

A fault that acts on a running process declares it in ``running_refs()``. When one of those
is not running as the fault fires (``gone``: it exited, or was never started), the nemesis
does not inject: the common key ``if_gone`` says what that is, ``fail`` (the default: the
step fails, naming the target and how and when it ended) or ``skip`` (recorded as skipped,
nothing to heal, the run goes on). A target that ends during the inject is the same outcome.
"""

from __future__ import annotations

import importlib
import pkgutil
import signal
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Generic, Literal, Protocol, TypeVar, Union

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from harness.hosts.base import Place
from harness.hosts.clocks import HOST_CLOCKS, ClockOffsets
from harness.spec import Duration, Name, Scalar, SourceOf, Strict, Target, custom_error
from mxref.pki import RunCredentials

__all__ = [
    "REGISTRY",
    "AnyFault",
    "Fault",
    "FaultContext",
    "FaultSpec",
    "HostView",
    "Injected",
    "ProcessView",
    "ProxyView",
    "Signal",
    "fault_spec_union",
    "gone",
    "make_fault",
    "parse_signal",
    "process_of",
    "register",
    "undo_on_failure",
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


def process_of(target: Target) -> str:
    """The scenario process a target refers to: the process itself, or for
    ``{source_of: reader}`` the reader (the source it means is only known when the fault fires)."""
    return target.source_of if isinstance(target, SourceOf) else target


class FaultSpec(Strict):
    """Keys every fault has. ``name`` lets a later ``heal`` step refer to it; ``duration``
    heals it automatically (healable kinds only); ``if_gone`` (kinds with ``running_refs``
    only): what a target that is not running when the fault fires means, ``fail`` the step
    or ``skip`` the fault; ``expect_effect: false`` makes it a negative control (its witness
    is meant to show no effect, and no effect does not make the run NOT EXERCISED).

    Each spec declares the scenario names it refers to (validated before the run); the
    defaults refer to nothing."""

    kind: str
    name: Name | None = None
    duration: Duration | None = None
    if_gone: Literal["fail", "skip"] = "fail"
    expect_effect: bool = True

    # host kinds each of ``host_refs`` must lead to
    host_kinds: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _if_gone_applies(self) -> FaultSpec:
        # only ``skip`` means something to refuse: the default (``fail``) is what a saved
        # scenario.json spells out for every fault, and it must load back (mxchaos check)
        if self.if_gone != "fail" and not self.running_refs():
            raise custom_error(
                "if_gone", f"if_gone: a {self.kind} fault does not need a running process, so if_gone does not apply"
            )
        return self

    def process_refs(self) -> tuple[str, ...]:
        """Scenario process names this fault refers to (for ``{source_of: reader}``: the reader)."""
        return ()

    def running_refs(self) -> tuple[Target, ...]:
        """The targets that must be running when the fault fires (``{source_of: reader}``: the
        source it resolves to then); one that is not is handled by ``if_gone``."""
        return ()

    def proxy_refs(self) -> tuple[str, ...]:
        """Scenario proxy names this fault refers to."""
        return ()

    def started_refs(self) -> tuple[str, ...]:
        """Scenario process names this fault starts (a later step may then rely on them, as on a
        ``start`` step's: a source started after its server)."""
        return ()

    def host_refs(self) -> tuple[tuple[str, Target], ...]:
        """(key, target) of each parameter naming a host: a host name, a process name (its
        host) or ``{source_of: reader}``; each must lead to a host of a kind in ``host_kinds``."""
        return ()

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        """(key, message) for each rule of this kind that the scenario's processes (name ->
        process spec) break, e.g. a ``corrupt`` target started without debug hooks."""
        return ()


class ProcessView(Protocol):
    """What a fault may know about a scenario process (its current incarnation). Read-only:
    a frozen dataclass satisfies it."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def pid(self) -> int | None: ...  # None when it is not running
    @property
    def incarnation(self) -> int: ...
    @property
    def host(self) -> str: ...  # the scenario host it runs on
    @property
    def alive(self) -> bool: ...
    @property
    def ended(self) -> str | None: ...  # while not running: "was never started", "exited (rc -9, SIGKILL) at 3.21s"


class HostView(Protocol):
    """A scenario host, as a network fault reaches it (read-only)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...  # local | netns | ssh
    @property
    def address(self) -> str: ...  # where its processes are reached
    @property
    def place(self) -> Place | None: ...  # where its network faults' commands act (its namespace, an ssh host's shell)
    @property
    def link(self) -> str | None: ...  # the root-namespace end of its veth, a port of the run's bridge (netns hosts)
    @property
    def inner_link(self) -> str | None: ...  # the namespace end of that veth (netns hosts), an ssh host's data device


class ProxyView(Protocol):
    """A proxy of the run's toxiproxy server, as a fault reaches it (read-only)."""

    @property
    def name(self) -> str: ...  # the scenario's name for it
    @property
    def proxy(self) -> str: ...  # its name in toxiproxy (``<run id>.<name>``)
    @property
    def api(self) -> str: ...  # the toxiproxy API, ``http://127.0.0.1:PORT``
    @property
    def listen(self) -> str: ...  # where clients connect
    @property
    def upstream(self) -> str: ...  # where it forwards to


class FaultContext(Protocol):
    """The runner's side of a fault: the only way a fault touches processes, hosts and proxies.
    A name the scenario does not have is a HarnessError (FaultError) naming it."""

    @property
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path:
        """This run's folder (a fault keeps its own files under ``faults/`` there)."""
        ...

    @property
    def credentials(self) -> RunCredentials | None:
        """The run's CA and token (``security:``), as its honest peers get them; None: plaintext."""
        ...

    def proc(self, name: str) -> ProcessView:
        """The current incarnation of process ``name``."""
        ...

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

    def start(self, name: str, clocks: ClockOffsets = HOST_CLOCKS) -> dict[str, Any]:
        """Start a new incarnation of ``name`` (waits for its server like a start step); with
        ``clocks``, in a time namespace with those offsets (``harness.hosts.clocks``)."""
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


def gone(spec: FaultSpec, ctx: FaultContext) -> str | None:
    """Why ``spec`` cannot fire now: the first of its ``running_refs`` that is not running, and
    how it ended (``source-1 exited (rc -9, SIGKILL) at 3.21s``); None when every one runs.
    FaultError when a target cannot be resolved (``{source_of: reader}`` before an attempt)."""
    for target in spec.running_refs():
        name = ctx.resolve(target)
        view = ctx.proc(name)
        if not view.alive:
            return f"{name} {view.ended or 'is not running'}"
    return None


SpecT = TypeVar("SpecT", bound=FaultSpec)
TokenT = TypeVar("TokenT")


@dataclass(frozen=True)
class Injected(Generic[TokenT]):
    """What a completed inject hands back: ``token`` goes to ``heal`` (what exactly to undo),
    ``record`` is recorded as the inject's completion value in the timeline."""

    token: TokenT
    record: dict[str, Any]


class Fault(Generic[SpecT, TokenT]):
    """One fault of a scenario, of one kind. It holds its spec and name, never per-injection
    state: ``inject`` returns the token that ``heal`` undoes."""

    kind: ClassVar[str]
    Spec: ClassVar[type[FaultSpec]]
    healable: ClassVar[bool] = False  # True: the fault has a window that heal closes
    requires: ClassVar[tuple[str, ...]] = ()  # capabilities (root, tc, iptables, toxiproxy)
    ssh_needs: ClassVar[tuple[str, ...] | None] = None
    """What the kind needs on an ssh host (probed there, ``SshHost.capabilities``); None: the kind
    has no lever of its own on ssh hosts (a process fault acts through the host's signals)."""
    no_ssh_lever: ClassVar[str | None] = None
    """Why the kind cannot act on a target on an ssh host (a run that would is a SKIP saying so,
    ``capabilities.missing_on_ssh``); None: it can, or ``ssh_needs`` says what it needs there."""
    needs_on_target_host: ClassVar[bool] = False
    """True: ``ssh_needs`` are needed on the host its target runs on (it restarts that target);
    False: on every host (a network fault's commands run on each)."""

    def __init__(self, spec: SpecT, name: str) -> None:
        self.spec = spec
        self.name = name

    def inject(self, ctx: FaultContext) -> Injected[TokenT]:
        """Do the fault. Completes and returns the token, or undoes whatever it did and raises
        (FaultError when it could not be done; anything else, e.g. RunInterrupted, passes)."""
        raise NotImplementedError

    def heal(self, ctx: FaultContext, token: TokenT) -> dict[str, Any] | None:
        """Undo exactly what the inject that returned ``token`` did. Idempotent; the value is
        recorded as the heal's completion value. Kinds with nothing to undo keep this no-op."""
        return None

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        """Remove what a crashed run of this kind left behind; returns what it removed."""
        return []


@contextmanager
def undo_on_failure() -> Iterator[ExitStack]:
    """For ``inject``: register each undo on the stack *before* doing the thing; when the block
    raises anything (FaultError, or RunInterrupted from a signal handler) the undos run, last
    first, and the original exception propagates (an undo that fails too is noted on it). When
    the block completes they are dropped: the token carries what heal undoes."""
    undo = ExitStack()
    try:
        yield undo
    except BaseException as exc:
        try:
            undo.close()
        except Exception as failed:  # noqa: BLE001 - the original error is the one to report
            exc.add_note(f"undoing it failed too: {type(failed).__name__}: {failed}")
        raise


AnyFault = Fault[Any, Any]

REGISTRY: dict[str, type[AnyFault]] = {}

FaultT = TypeVar("FaultT", bound=type[AnyFault])


def register(cls: FaultT) -> FaultT:
    """Add a fault class to ``REGISTRY`` under its ``kind`` (its spec's ``kind`` must be
    ``Literal[kind]``)."""
    kind = cls.kind
    if kind in REGISTRY and REGISTRY[kind] is not cls:
        raise ValueError(f"fault kind {kind!r} registered twice ({REGISTRY[kind].__name__}, {cls.__name__})")
    annotation = cls.Spec.model_fields["kind"].annotation
    if getattr(annotation, "__args__", None) != (kind,):
        raise ValueError(f"{cls.Spec.__name__}.kind must be Literal[{kind!r}]")
    REGISTRY[kind] = cls
    return cls


def make_fault(spec: FaultSpec, name: str) -> AnyFault:
    """The fault of ``spec``'s kind, named ``name``."""
    try:
        cls = REGISTRY[spec.kind]
    except KeyError:
        raise ValueError(f"no fault kind {spec.kind!r} (kinds: {', '.join(sorted(REGISTRY))})") from None
    if not isinstance(spec, cls.Spec):
        raise TypeError(f"fault {name}: a {spec.kind} fault takes a {cls.Spec.__name__}, not a {type(spec).__name__}")
    return cls(spec, name)


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
