"""Scenario steps: one model per step kind, and the step registry they are built into.

A step kind is one class: a ``StepModel`` subclass decorated ``@step("key")`` (its YAML
action key) that says how it is described (``describe``), which process names it
references (``process_refs``, checked before the run), which durations must fit the run's
budget (``bounds``) and which child steps it holds (``branches``, parallel blocks).
``STEPS`` (key -> model), the ``Step`` union, ``iter_steps`` and ``describe_step`` all
derive from that registry, and so do the cross-reference rules.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, Discriminator, Field, Tag

from harness import faults as fault_registry
from harness.checks.processes import ExitCodes
from harness.faults import FaultSpec
from harness.locate import Loc
from harness.record.fault_windows import target_text
from harness.scenario.models import NameList
from harness.scrape import Comparison
from harness.spec import Duration, Name, Scalar, Strict, custom_error

__all__ = [
    "STEPS",
    "STEP_KEYS",
    "AwaitEvent",
    "AwaitExit",
    "AwaitMetric",
    "AwaitStep",
    "FaultStep",
    "HealStep",
    "MarkStep",
    "MetricCondition",
    "ParallelStep",
    "RestartStep",
    "SleepStep",
    "StartStep",
    "Step",
    "StepModel",
    "StepRef",
    "StopArgs",
    "StopStep",
    "describe_step",
    "iter_steps",
    "model_key",
]


class StepModel(Strict):
    """The base of every step kind (see the module docstring)."""

    yaml_key: ClassVar[str] = ""

    def describe(self) -> str:
        """One line for progress output and reports."""
        return self.yaml_key

    def process_refs(self) -> Iterator[tuple[Loc, str]]:
        """(location below the step, process name) of every process this step names."""
        return iter(())

    def bounds(self) -> Iterator[tuple[Loc, float]]:
        """(location below the step, seconds) of every duration that must fit ``budgets.run``."""
        return iter(())

    def branches(self) -> Sequence[Sequence[StepModel]]:
        """Child step lists (the branches of a parallel block)."""
        return ()


STEPS: dict[str, type[StepModel]] = {}
M = TypeVar("M", bound=type[StepModel])


def step(key: str) -> Callable[[M], M]:
    """Register a step kind under its YAML action key."""

    def register(cls: M) -> M:
        if key in STEPS:
            raise ValueError(f"step key {key!r} registered twice ({STEPS[key].__name__}, {cls.__name__})")
        cls.yaml_key = key
        STEPS[key] = cls
        return cls

    return register


@step("start")
class StartStep(StepModel):
    """Start processes (in order; a source/reader waits for its server's grpc port)."""

    start: NameList

    def describe(self) -> str:
        return "start " + ", ".join(self.start)

    def process_refs(self) -> Iterator[tuple[Loc, str]]:
        return ((("start", i), name) for i, name in enumerate(self.start))


class StopArgs(Strict):
    process: NameList
    grace: Duration | None = None  # default: budgets.stop_grace


def _stop_shorthand(value: Any) -> Any:
    return {"process": value} if isinstance(value, str | list | tuple) else value


StopArg = Annotated[StopArgs, BeforeValidator(_stop_shorthand)]


@step("stop")
class StopStep(StepModel):
    """Stop processes: TERM, ``grace``, KILL."""

    stop: StopArg

    def describe(self) -> str:
        return "stop " + ", ".join(self.stop.process)

    def process_refs(self) -> Iterator[tuple[Loc, str]]:
        return ((("stop", "process", i), name) for i, name in enumerate(self.stop.process))


@step("restart")
class RestartStep(StepModel):
    """Stop then start again (a new incarnation)."""

    restart: StopArg

    def describe(self) -> str:
        return "restart " + ", ".join(self.restart.process)

    def process_refs(self) -> Iterator[tuple[Loc, str]]:
        return ((("restart", "process", i), name) for i, name in enumerate(self.restart.process))


OnTimeout = Literal["fail", "continue"]


class AwaitEvent(Strict):
    """Wait for ``process`` to emit ``event`` (fields equal to ``where``), the ``count``-th
    match counted ``since`` the process's current incarnation started (default), this
    step started, or the run started."""

    process: Name
    event: str
    where: dict[str, Scalar] = Field(default_factory=dict)
    count: int = Field(1, ge=1)
    since: Literal["incarnation", "step", "run"] = "incarnation"
    within: Duration | None = None
    on_timeout: OnTimeout = "fail"
    # the subjects whose event it is (an event only mxref emits: [mxref]); where another subject
    # plays ``process`` the step is passed over, recorded (``harness.engine.steps``), and the
    # checks of that event say ``subjects:`` too; unset: every subject
    subjects: tuple[Literal["mxref", "modelexpress"], ...] | None = Field(None, min_length=1)


class AwaitExit(Strict):
    """Wait for ``process`` (its current incarnation) to exit, optionally with ``code`` (one
    or a list; negative or a signal name: killed by that signal)."""

    process: Name
    exit: Literal[True]
    code: ExitCodes | None = None
    within: Duration | None = None
    on_timeout: OnTimeout = "fail"


class MetricCondition(Strict):
    """``metric`` (exact sample name) summed over samples whose labels include ``labels``,
    compared with ``value``; a missing series is ``default`` (none: not met)."""

    process: Name
    metric: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    op: Comparison = "=="
    value: float
    default: float | None = None


class AwaitMetric(Strict):
    """Scrape ``metric.process`` every ``every`` until the condition holds."""

    metric: MetricCondition
    every: Duration = 0.25
    within: Duration | None = None
    on_timeout: OnTimeout = "fail"


# Union tags are in pydantic's error locations; ``<...>`` never names a key of the file,
# so an error is located at the key the user wrote, not at a key that shares a tag's name.
_AWAIT_TAGS: dict[type[BaseModel], str] = {AwaitEvent: "<event>", AwaitExit: "<exit>", AwaitMetric: "<metric>"}


def _await_kind(value: Any) -> str | None:
    if isinstance(value, BaseModel):  # serialising
        return _AWAIT_TAGS.get(type(value))
    if isinstance(value, Mapping):
        if "metric" in value:
            return "<metric>"
        if "exit" in value:
            return "<exit>"
        return "<event>"
    return None


AwaitArg = Annotated[
    Union[  # noqa: UP007
        Annotated[AwaitEvent, Tag("<event>")], Annotated[AwaitExit, Tag("<exit>")], Annotated[AwaitMetric, Tag("<metric>")]
    ],
    Discriminator(
        _await_kind,
        custom_error_type="await",
        custom_error_message="await needs a mapping: {process, event} | {process, exit: true} | {metric: {...}}",
    ),
]


@step("await")
class AwaitStep(StepModel):
    await_: AwaitArg = Field(alias="await")

    def describe(self) -> str:
        arg = self.await_
        if isinstance(arg, AwaitEvent):
            where = "".join(f" {k}={v}" for k, v in arg.where.items())
            return f"await {arg.process} {arg.event}{where}"
        if isinstance(arg, AwaitExit):
            return f"await {arg.process} exit" + (f" code {arg.code}" if arg.code is not None else "")
        cond = arg.metric
        return f"await {cond.process} {cond.metric} {cond.op} {cond.value:g}"

    def process_refs(self) -> Iterator[tuple[Loc, str]]:
        arg = self.await_
        if isinstance(arg, AwaitMetric):
            yield ("await", "metric", "process"), arg.metric.process
        else:
            yield ("await", "process"), arg.process

    def bounds(self) -> Iterator[tuple[Loc, float]]:
        if self.await_.within is not None:
            yield ("await", "within"), self.await_.within


@step("sleep")
class SleepStep(StepModel):
    sleep: Duration

    def describe(self) -> str:
        return f"sleep {self.sleep:g}s"

    def bounds(self) -> Iterator[tuple[Loc, float]]:
        yield ("sleep",), self.sleep


if TYPE_CHECKING:
    FaultSpecs = FaultSpec
else:
    FaultSpecs = fault_registry.fault_spec_union()


@step("fault")
class FaultStep(StepModel):
    fault: FaultSpecs

    def describe(self) -> str:
        spec = self.fault
        target = target_text(getattr(spec, "target", None) or getattr(spec, "proxy", None))
        extra = f" for {spec.duration:g}s" if spec.duration else ""
        return f"fault {spec.kind}" + (f" {target}" if target else "") + (f" ({spec.name})" if spec.name else "") + extra

    def bounds(self) -> Iterator[tuple[Loc, float]]:
        if self.fault.duration is not None:
            yield ("fault", "duration"), self.fault.duration


@step("heal")
class HealStep(StepModel):
    """Heal named faults (or ``all``)."""

    heal: NameList

    def describe(self) -> str:
        return "heal " + ", ".join(self.heal)


@step("mark")
class MarkStep(StepModel):
    """Put a named point on the timeline (for check references)."""

    mark: Name

    def describe(self) -> str:
        return f"mark {self.mark}"


def model_key(value: BaseModel) -> str:
    """The single field of a step / check wrapper model, by its YAML name."""
    (name, field), *_ = type(value).model_fields.items()
    return field.alias or name


def _step_tag(value: Any) -> str | None:
    if isinstance(value, StepModel):  # serialising
        return f"<{value.yaml_key}>"
    if isinstance(value, Mapping):
        for key in value:
            if key in STEPS:
                return f"<{key}>"
    return None


def _check_step_shape(value: Any) -> Any:
    keys = ", ".join(STEPS)
    if not isinstance(value, Mapping):
        raise custom_error("step", f"a step is a mapping with one action key ({keys})")
    found = [k for k in value if k in STEPS]
    if len(found) > 1:
        raise custom_error(
            "step", f"a step has exactly one action key, got {', '.join(map(repr, found))}; split it into steps"
        )
    if not found:
        got = ", ".join(repr(k) for k in value) or "none"
        close = [m for k in value for m in difflib.get_close_matches(str(k), list(STEPS), n=1, cutoff=0.6)]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise custom_error("step", f"no action key in step (got {got}){hint} (actions: {keys})")
    return value


@step("parallel")
class ParallelStep(StepModel):
    """Run branches concurrently (each a list of steps, or one step); done when all are."""

    parallel: tuple[Branch, ...] = Field(min_length=2)

    def describe(self) -> str:
        return f"parallel ({len(self.parallel)} branches)"

    def branches(self) -> Sequence[Sequence[StepModel]]:
        return self.parallel


if TYPE_CHECKING:
    Step = StepModel
else:
    Step = Annotated[
        Union[tuple(Annotated[model, Tag(f"<{key}>")] for key, model in STEPS.items())],  # noqa: UP007
        Discriminator(_step_tag),
        BeforeValidator(_check_step_shape),
    ]


def _branch_shorthand(value: Any) -> Any:
    return [value] if isinstance(value, Mapping) else value


Branch = Annotated[tuple[Step, ...], BeforeValidator(_branch_shorthand), Field(min_length=1)]
ParallelStep.model_rebuild()
STEP_KEYS = tuple(STEPS)


@dataclass(frozen=True)
class StepRef:
    """A step with its position: ``id`` like ``3`` or ``4.2.1`` (1-based), ``loc`` its YAML path."""

    id: str
    loc: Loc
    step: StepModel


def iter_steps(steps: Sequence[BaseModel], prefix: str = "", loc: Loc = ("steps",)) -> Iterator[StepRef]:
    """Depth-first, in file order, including steps inside parallel branches (a broken step
    (``Broken``) of a partly valid file is skipped, its index kept)."""
    for i, item in enumerate(steps):
        if not isinstance(item, StepModel):
            continue
        sid = f"{prefix}{i + 1}"
        yield StepRef(sid, (*loc, i), item)
        for b, branch in enumerate(item.branches()):
            yield from iter_steps(branch, f"{sid}.{b + 1}.", (*loc, i, item.yaml_key, b))


def describe_step(item: BaseModel) -> str:
    """One line for progress output and reports."""
    return item.describe() if isinstance(item, StepModel) else type(item).__name__
