"""Scenario files: YAML -> frozen pydantic models, validated completely before anything runs.

``load_scenario(path)`` parses, validates the schema (unknown keys rejected), then the
cross-references (process names, roles, fault names, marks, event names, budgets), and
either returns a frozen ``Scenario`` or raises ``ScenarioInvalid`` listing every
problem as ``file:line: key.path: rule (got value)``. ``scenario_json_schema()`` is the
same schema as JSON Schema (``mxchaos schema``). Nothing past this module sees a dict
from YAML. The format reference is ``harness/README.md``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    create_model,
    field_validator,
)

from harness import checks as check_registry
from harness import faults as fault_registry
from harness.checks.processes import ExitCodes
from harness.errors import Issue, ScenarioInvalid
from harness.faults import FaultSpec
from harness.scrape import Comparison
from harness.spec import Duration, Name, Ref, Scalar, SourceOf, Strict, custom_error
from mxref.config import TRANSPORT_PROFILES
from mxref.events import EVENT_NAMES

__all__ = [
    "PLACEHOLDERS",
    "AwaitEvent",
    "AwaitExit",
    "AwaitMetric",
    "Budgets",
    "CommandProcess",
    "FaultStep",
    "HealStep",
    "LocalHostSpec",
    "MarkStep",
    "NetnsHostSpec",
    "MetricCondition",
    "ModelSpec",
    "ParallelStep",
    "ProxySpec",
    "ReaderProcess",
    "RestartStep",
    "Scenario",
    "ServerProcess",
    "SleepStep",
    "SourceProcess",
    "StartStep",
    "StepRef",
    "StopStep",
    "iter_steps",
    "load_scenario",
    "parse_scenario",
    "parse_scenario_json",
    "scenario_json_schema",
]

# Placeholders allowed in launcher / argv / extra_args / env values, filled by the runner.
PLACEHOLDERS: dict[str, str] = {
    "python": "the harness's Python interpreter (sys.executable)",
    "run_dir": "this run's folder",
    "proc_dir": "the folder holding this process's log and events",
    "scenario_dir": "the folder of the scenario file",
    "seed": "the run's seed",
}
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _env_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return value


NameList = Annotated[tuple[Name, ...], BeforeValidator(_one_or_many), Field(min_length=1)]
EnvMap = dict[str, Annotated[str, BeforeValidator(_env_value)]]

# ---------------------------------------------------------------------------- hosts


def _host_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


class LocalHostSpec(Strict):
    """Processes run on this machine, reached over loopback (``ssh`` hosts come next)."""

    kind: Literal["local"] = "local"


class NetnsHostSpec(Strict):
    """Processes run in a network namespace of their own that the run creates (root needed),
    joined to the run's bridge with an address of a private /24; network faults act on it."""

    kind: Literal["netns"]


HostSpec = Annotated[
    Union[LocalHostSpec, NetnsHostSpec],  # noqa: UP007
    Field(discriminator="kind"),
    BeforeValidator(_host_shorthand),
]

# ---------------------------------------------------------------------------- model, budgets


class ModelSpec(Strict):
    """The synthetic model every source serves and every reader loads (same flags for all),
    or a safetensors ``file``."""

    name: str | None = None  # --model-name
    tensors: int = Field(8, ge=1, le=1_000_000)
    tensor_mib: float = Field(1.0, gt=0, le=1 << 20)
    dtype: Literal["float32", "float16", "int8", "uint8", "int32", "int64"] = "float16"
    seed: int | None = None  # default: the scenario's seed
    file: str | None = None  # relative to the scenario file

    def flags(self, seed: int, scenario_dir: Path) -> list[str]:
        named = ["--model-name", self.name] if self.name else []
        if self.file:
            return [*named, "--model-file", str((scenario_dir / self.file).resolve())]
        return [
            *named,
            "--tensors",
            str(self.tensors),
            "--tensor-mib",
            f"{self.tensor_mib:g}",
            "--dtype",
            self.dtype,
            "--seed",
            str(self.seed if self.seed is not None else seed),
        ]


class Budgets(Strict):
    """Every wait is bounded. ``step``: default ``within`` of awaits and bound of start/stop
    waits; ``run``: the whole run; ``stop_grace``: TERM -> KILL; ``heal``: per heal;
    ``progress``: the watchdog declares HANG after this long without a new event;
    ``prepare``: writing the disk checkpoint."""

    step: Duration = 30.0
    run: Duration = 300.0
    stop_grace: Duration = 5.0
    heal: Duration = 10.0
    progress: Duration = 60.0
    prepare: Duration = 120.0


class ScrapeSpec(Strict):
    """Periodic ``/metrics`` scrapes of every process that reported a metrics port."""

    enabled: bool = True
    interval: Duration = 1.0
    timeout: Duration = 1.0


# ---------------------------------------------------------------------------- processes


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _flag_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class Options(Strict):
    """Role options, each passed as ``--key-name value`` (booleans as bare flags when true)."""

    def argv(self) -> list[str]:
        out: list[str] = []
        for key in type(self).model_fields:
            value = getattr(self, key)
            if value is None or value is False:
                continue
            if value is True:
                out.append(_flag(key))
            else:
                out += [_flag(key), _flag_value(value)]
        return out


class ServerOptions(Options):
    port: int = Field(0, ge=0, le=65535)
    host: str | None = None  # bind address (mxref's default: 127.0.0.1)
    heartbeat_timeout: Duration | None = None
    reaper_interval: Duration | None = None
    gc_timeout: Duration | None = None


class PeerOptions(Options):
    """Options sources and readers share."""

    rank: int | None = Field(None, ge=0)
    agent_name: str | None = None  # default: unique per incarnation (mxref)
    accelerator: Literal["cpu", "cuda"] | None = None
    device_id: int | None = Field(None, ge=0)
    advertise_host: str | None = None
    worker_port: int | None = Field(None, ge=0, le=65535)
    heartbeat_interval: Duration | None = None
    serve_seconds: Duration | None = None


class SourceOptions(PeerOptions):
    mode: Literal["p2p", "central"] | None = None
    nixl_port: int | None = Field(None, ge=0, le=65535)
    checkpoint: str | None = None  # serve this safetensors file's bytes


class ReaderOptions(PeerOptions):
    transfer_timeout: Duration | None = None
    handshake_timeout: Duration | None = None
    rpc_timeout: Duration | None = None  # deadline of each metadata-server RPC (mxref: 30s)
    read_chunk_mib: float | None = Field(None, gt=0)  # chunked READ with a stall deadline (mxref: off)
    selector: Literal["random", "rendezvous_hash"] | None = None
    selector_seed: int | None = None  # default: the run's seed
    serve_after_load: bool = False
    skip_release: bool = False  # the simulated pre-fix bug: never disconnect the source
    push_metadata: bool = False  # experimental: push the reader's NIXL metadata to the source
    mode: Literal["p2p", "central"] | None = None  # serving mode after load
    checkpoint: str | None = None  # default: the checkpoint the runner prepares in the run folder


class ProcessBase(Strict):
    host: Name | None = None  # default: the only host
    env: EnvMap = Field(default_factory=dict)


class MxrefProcess(ProcessBase):
    launcher: tuple[str, ...] | None = Field(None, min_length=1)  # default: the scenario's
    extra_args: tuple[str, ...] = ()


class ServerProcess(MxrefProcess):
    """``mxref server``: the metadata server (port 0: it picks one and reports it)."""

    role: Literal["server"]
    options: ServerOptions = ServerOptions()


class SourceProcess(MxrefProcess):
    """``mxref source``: serves the model; ``server`` defaults to the only server (or the
    upstream of ``server_via``, a proxy it reaches the server through)."""

    role: Literal["source"]
    server: Name | None = None
    server_via: Name | None = None
    options: SourceOptions = SourceOptions()


class ReaderProcess(MxrefProcess):
    """``mxref reader``: loads the model (rdma, else disk fallback) and exits (0: verified)."""

    role: Literal["reader"]
    server: Name | None = None
    server_via: Name | None = None  # reach the server through this proxy
    options: ReaderOptions = ReaderOptions()


class CommandProcess(ProcessBase):
    """Any other program (``argv``), e.g. a proxy; it writes no events."""

    role: Literal["command"]
    argv: tuple[str, ...] = Field(min_length=1)


ProcessSpec = Annotated[
    Union[ServerProcess, SourceProcess, ReaderProcess, CommandProcess],  # noqa: UP007
    Field(discriminator="role"),
]
MXREF_ROLES = ("server", "source", "reader")


class ProxySpec(Strict):
    """A toxiproxy proxy in front of ``upstream``'s gRPC endpoint (a server process). Sources
    and readers with ``server_via`` reach that server through it; ``toxic`` and
    ``proxy_down`` faults act on it."""

    upstream: Name


# ---------------------------------------------------------------------------- steps


class StartStep(Strict):
    """Start processes (in order; a source/reader waits for its server's grpc port)."""

    start: NameList


class StopArgs(Strict):
    process: NameList
    grace: Duration | None = None  # default: budgets.stop_grace


def _stop_shorthand(value: Any) -> Any:
    return {"process": value} if isinstance(value, str | list | tuple) else value


StopArg = Annotated[StopArgs, BeforeValidator(_stop_shorthand)]


class StopStep(Strict):
    """Stop processes: TERM, ``grace``, KILL."""

    stop: StopArg


class RestartStep(Strict):
    """Stop then start again (a new incarnation)."""

    restart: StopArg


class SleepStep(Strict):
    sleep: Duration


class MarkStep(Strict):
    """Put a named point on the timeline (for check references)."""

    mark: Name


class HealStep(Strict):
    """Heal named faults (or ``all``)."""

    heal: NameList


class FaultStep(Strict):
    fault: fault_registry.fault_spec_union()  # type: ignore[valid-type]


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


def _await_kind(value: Any) -> str | None:
    if isinstance(value, BaseModel):  # serialising
        return {AwaitEvent: "event", AwaitExit: "exit", AwaitMetric: "metric"}.get(type(value))
    if isinstance(value, Mapping):
        if "metric" in value:
            return "metric"
        if "exit" in value:
            return "exit"
        return "event"
    return None


AwaitArg = Annotated[
    Union[Annotated[AwaitEvent, Tag("event")], Annotated[AwaitExit, Tag("exit")], Annotated[AwaitMetric, Tag("metric")]],  # noqa: UP007
    Discriminator(
        _await_kind,
        custom_error_type="await",
        custom_error_message="await needs a mapping: {process, event} | {process, exit: true} | {metric: {...}}",
    ),
]


class AwaitStep(Strict):
    await_: AwaitArg = Field(alias="await")


STEP_KEYS = ("start", "stop", "restart", "await", "sleep", "fault", "heal", "mark", "parallel")


def _model_key(value: BaseModel) -> str:
    """The single field of a step / check wrapper model, by its YAML name."""
    (name, field), *_ = type(value).model_fields.items()
    return field.alias or name


def _step_key(value: Any) -> str | None:
    if isinstance(value, BaseModel):  # serialising
        return _model_key(value)
    if isinstance(value, Mapping):
        for key in value:
            if key in STEP_KEYS:
                return str(key)
    return None


def _check_step_shape(value: Any) -> Any:
    if not isinstance(value, Mapping):
        raise custom_error("step", f"a step is a mapping with one action key ({', '.join(STEP_KEYS)})")
    found = [k for k in value if k in STEP_KEYS]
    if len(found) > 1:
        raise custom_error(
            "step", f"a step has exactly one action key, got {', '.join(map(repr, found))}; split it into steps"
        )
    if not found:
        keys = ", ".join(repr(k) for k in value) or "none"
        close = [m for k in value for m in difflib.get_close_matches(str(k), STEP_KEYS, n=1, cutoff=0.6)]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise custom_error("step", f"no action key in step (got {keys}){hint} (actions: {', '.join(STEP_KEYS)})")
    return value


Step = Annotated[
    Union[  # noqa: UP007
        Annotated[StartStep, Tag("start")],
        Annotated[StopStep, Tag("stop")],
        Annotated[RestartStep, Tag("restart")],
        Annotated[AwaitStep, Tag("await")],
        Annotated[SleepStep, Tag("sleep")],
        Annotated[FaultStep, Tag("fault")],
        Annotated[HealStep, Tag("heal")],
        Annotated[MarkStep, Tag("mark")],
        Annotated["ParallelStep", Tag("parallel")],
    ],
    Discriminator(_step_key),
    BeforeValidator(_check_step_shape),
]


def _branch_shorthand(value: Any) -> Any:
    return [value] if isinstance(value, Mapping) else value


Branch = Annotated[tuple[Step, ...], BeforeValidator(_branch_shorthand), Field(min_length=1)]


class ParallelStep(Strict):
    """Run branches concurrently (each a list of steps, or one step); done when all are."""

    parallel: tuple[Branch, ...] = Field(min_length=2)


ParallelStep.model_rebuild()

# ---------------------------------------------------------------------------- checks


def _check_models() -> dict[str, type[BaseModel]]:
    models: dict[str, type[BaseModel]] = {}
    for kind in sorted(check_registry.REGISTRY):
        definition = check_registry.REGISTRY[kind]
        model = create_model(  # type: ignore[call-overload]
            f"{''.join(p.title() for p in kind.split('_'))}Check",
            __base__=Strict,
            __doc__=definition.doc or None,
            **{kind: (definition.params, ...)},
        )
        models[kind] = model
    return models


CHECK_MODELS = _check_models()


def _check_key(value: Any) -> str | None:
    if isinstance(value, BaseModel):  # serialising
        return _model_key(value)
    if isinstance(value, Mapping):
        for key in value:
            if key in CHECK_MODELS:
                return str(key)
    return None


def _check_entry_shape(value: Any) -> Any:
    known = ", ".join(CHECK_MODELS)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise custom_error("check", f"a check is a mapping with exactly one key, the check kind ({known})")
    (key,) = value
    if key not in CHECK_MODELS:
        close = difflib.get_close_matches(str(key), CHECK_MODELS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise custom_error("check", f"{key!r} is not a check{hint} (known: {known})", key=str(key))
    if value[key] is None:  # ``- integrity:`` with no parameters
        return {key: {}}
    return value


CheckEntry = Annotated[
    Union[tuple(Annotated[model, Tag(kind)] for kind, model in CHECK_MODELS.items())],  # type: ignore[valid-type]  # noqa: UP007
    Discriminator(_check_key),
    BeforeValidator(_check_entry_shape),
]

# ---------------------------------------------------------------------------- scenario


class Scenario(Strict):
    """One scenario file."""

    name: Name
    description: str = ""
    references: tuple[str, ...] = ()
    # a defect of a dependency this scenario documents: failing checks are expected (xfail)
    known_defect: str | None = None
    seed: int = 0
    transport: str | None = None  # default: ucx-tcp, or ucx-tcp-any when the hosts are netns
    markers: tuple[Name, ...] = ()
    budgets: Budgets = Budgets()
    scrape: ScrapeSpec = ScrapeSpec()
    hosts: dict[Name, HostSpec] = Field(default_factory=lambda: {"local": LocalHostSpec()}, min_length=1)
    model: ModelSpec = ModelSpec()
    launcher: tuple[str, ...] = Field(("{python}", "-m", "mxref"), min_length=1)
    env: EnvMap = Field(default_factory=dict)
    proxies: dict[Name, ProxySpec] = Field(default_factory=dict)
    processes: dict[Name, ProcessSpec] = Field(min_length=1)
    steps: tuple[Step, ...] = Field(min_length=1)
    checks: tuple[CheckEntry, ...] = ()

    _path: Path | None = PrivateAttr(None)
    _text: str = PrivateAttr("")

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, value: str | None) -> str | None:
        if value is not None and value not in TRANSPORT_PROFILES:
            raise custom_error(
                "transport", f"{value!r} is not a transport profile (known: {', '.join(TRANSPORT_PROFILES)})"
            )
        return value

    @field_validator("known_defect")
    @classmethod
    def _defect_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise custom_error(
                "known_defect", "describe the defect: what is broken, where, since which version (or drop the key)"
            )
        return value.strip() if value is not None else None

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def text(self) -> str:
        return self._text

    @property
    def directory(self) -> Path:
        return self._path.parent if self._path else Path.cwd()

    def role(self, process: str) -> str:
        return self.processes[process].role

    def roles(self) -> dict[str, str]:
        return {name: spec.role for name, spec in self.processes.items()}

    def host_of(self, process: str) -> str:
        return self.processes[process].host or next(iter(self.hosts))

    def netns_hosts(self) -> list[str]:
        return [name for name, spec in self.hosts.items() if spec.kind == "netns"]

    def transport_of(self, process: str) -> str:
        """The ``--transport`` of a source/reader: the scenario's, else ``ucx-tcp-any`` on a
        netns host (TCP on whatever device routes to the peer) and ``ucx-tcp`` (loopback) elsewhere."""
        if self.transport is not None:
            return self.transport
        return "ucx-tcp-any" if self.hosts[self.host_of(process)].kind == "netns" else "ucx-tcp"

    def server_of(self, process: str) -> str | None:
        spec = self.processes[process]
        if not isinstance(spec, SourceProcess | ReaderProcess):
            return None
        if spec.server:
            return spec.server
        if spec.server_via is not None and spec.server_via in self.proxies:
            return self.proxies[spec.server_via].upstream
        servers = [n for n, p in self.processes.items() if p.role == "server"]
        return servers[0] if len(servers) == 1 else None

    def check_entries(self) -> list[tuple[str, check_registry.CheckParams]]:
        out = []
        for entry in self.checks:
            (kind,) = type(entry).model_fields
            out.append((kind, getattr(entry, kind)))
        return out

    def with_seed(self, seed: int) -> Scenario:
        return self.model_copy(update={"seed": seed})


@dataclass(frozen=True)
class StepRef:
    """A step with its position: ``id`` like ``3`` or ``4.2.1`` (1-based), ``loc`` its YAML path."""

    id: str
    loc: tuple[str | int, ...]
    step: BaseModel


def iter_steps(steps: Sequence[BaseModel], prefix: str = "", loc: tuple[str | int, ...] = ("steps",)) -> Iterator[StepRef]:
    """Depth-first, in file order, including steps inside parallel branches."""
    for i, step in enumerate(steps):
        sid = f"{prefix}{i + 1}"
        yield StepRef(sid, (*loc, i), step)
        if isinstance(step, ParallelStep):
            for b, branch in enumerate(step.parallel):
                yield from iter_steps(branch, f"{sid}.{b + 1}.", (*loc, i, "parallel", b))


def describe_step(step: BaseModel) -> str:
    """One line for progress output and reports."""
    if isinstance(step, StartStep):
        return "start " + ", ".join(step.start)
    if isinstance(step, StopStep):
        return "stop " + ", ".join(step.stop.process)
    if isinstance(step, RestartStep):
        return "restart " + ", ".join(step.restart.process)
    if isinstance(step, SleepStep):
        return f"sleep {step.sleep:g}s"
    if isinstance(step, MarkStep):
        return f"mark {step.mark}"
    if isinstance(step, HealStep):
        return "heal " + ", ".join(step.heal)
    if isinstance(step, FaultStep):
        spec = step.fault
        target = getattr(spec, "target", None) or getattr(spec, "proxy", None)
        if isinstance(target, SourceOf):
            target = f"source_of({target.source_of})"
        extra = f" for {spec.duration:g}s" if spec.duration else ""
        return f"fault {spec.kind}" + (f" {target}" if target else "") + (f" ({spec.name})" if spec.name else "") + extra
    if isinstance(step, AwaitStep):
        arg = step.await_
        if isinstance(arg, AwaitEvent):
            where = "".join(f" {k}={v}" for k, v in arg.where.items())
            return f"await {arg.process} {arg.event}{where}"
        if isinstance(arg, AwaitExit):
            return f"await {arg.process} exit" + (f" code {arg.code}" if arg.code is not None else "")
        cond = arg.metric
        return f"await {cond.process} {cond.metric} {cond.op} {cond.value:g}"
    if isinstance(step, ParallelStep):
        return f"parallel ({len(step.parallel)} branches)"
    return type(step).__name__


# ---------------------------------------------------------------------------- loading


def load_scenario(path: str | Path, *, seed: int | None = None) -> Scenario:
    """Read, parse and validate a scenario file; ``ScenarioInvalid`` lists every problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioInvalid(file, [Issue("", f"cannot read the file: {exc.strerror or exc}")]) from None
    scenario = parse_scenario(text, file)
    return scenario.with_seed(seed) if seed is not None else scenario


def parse_scenario(text: str, file: str | Path = "<string>") -> Scenario:
    file_label = str(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        line = mark.line + 1 if mark is not None else None
        raise ScenarioInvalid(file_label, [Issue("", f"not valid YAML: {problem}", line)]) from None
    return _validated(data, root, file, text)


def parse_scenario_json(text: str, file: str | Path = "<string>") -> Scenario:
    """A scenario as the runner saved it (``scenario.json`` of a run folder: the validated
    model, seed override applied), validated again with the current harness. Values come
    from JSON; the YAML composer only locates problems (JSON is YAML) for the messages."""
    file_label = str(file)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ScenarioInvalid(file_label, [Issue("", f"not valid JSON: {exc}")]) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = yaml.compose("{}", Loader=yaml.SafeLoader)  # no line numbers then
    return _validated(data, root, file, text)


def _validated(data: Any, root: yaml.Node | None, file: str | Path, text: str) -> Scenario:
    """Schema, then cross-references; ``ScenarioInvalid`` with every problem located in ``root``."""
    file_label = str(file)
    if not isinstance(data, dict) or root is None:
        raise ScenarioInvalid(file_label, [Issue("", "a scenario file must be a YAML mapping (name, processes, steps, ...)", 1)])
    issues = _duplicate_keys(root, ())
    scenario: Scenario | None = None
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # "should have at least N items after validation" is noise when items themselves failed
        failed = [tuple(e["loc"]) for e in errors if e["type"] != "too_short"]
        errors = [
            e
            for e in errors
            if e["type"] != "too_short" or not any(loc[: len(e["loc"])] == tuple(e["loc"]) and len(loc) > len(e["loc"]) for loc in failed)
        ]
        issues += [_issue_from_pydantic(err, root) for err in errors]
    if scenario is not None and not issues:
        issues += [_locate(root, issue_loc, message, value, show) for issue_loc, message, value, show in _semantic(scenario)]
    if issues:
        issues.sort(key=lambda i: (i.line or 0, i.path))
        raise ScenarioInvalid(file_label, issues)
    assert scenario is not None
    if isinstance(file, Path):
        scenario._path = file.resolve()
    scenario._text = text
    return scenario


def scenario_json_schema() -> dict[str, Any]:
    schema = Scenario.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://mxchaos/scenario.schema.json",
        **schema,
        "title": "mxchaos scenario",
    }


# ---------------------------------------------------------------------------- error locations

Loc = tuple[str | int, ...]


def _duplicate_keys(node: yaml.Node, loc: Loc) -> list[Issue]:
    issues: list[Issue] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                issues.append(
                    Issue(
                        _render_loc((*loc, key)),
                        f"duplicate key {key!r} (first at line {seen[key]}); a later value would silently win",
                        key_node.start_mark.line + 1,
                    )
                )
            else:
                seen[key] = key_node.start_mark.line + 1
            issues += _duplicate_keys(value_node, (*loc, key))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            issues += _duplicate_keys(item, (*loc, i))
    return issues


def _render_loc(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _walk(root: yaml.Node, loc: Sequence[str | int]) -> tuple[list[str | int], int | None]:
    """Follow ``loc`` through the YAML nodes: the path that exists in the file (plus a final
    missing key) and the line of the deepest node reached. Location parts that are not in
    the file (union tags, normalised shorthands) are skipped."""
    node: yaml.Node | None = root
    path: list[str | int] = []
    line = root.start_mark.line + 1
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is not None:
                path.append(part)
                line = match[0].start_mark.line + 1
                node = match[1]
                continue
            if last:
                path.append(part)
            continue
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                path.append(part)
                node = node.value[part]
                line = node.start_mark.line + 1
            continue
        # scalar (or shorthand): the rest of the location is inside a normalised value
    return path, line


def _locate(root: yaml.Node, loc: Loc, message: str, value: Any = None, show_value: bool = False) -> Issue:
    path, line = _walk(root, loc)
    return Issue(_render_loc(path), message, line, value, show_value)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _issue_from_pydantic(err: Mapping[str, Any], root: yaml.Node) -> Issue:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    show = _is_scalar(value)
    message = str(ctx.get("message", err["msg"]))
    if kind == "missing":
        message, show = "required key is missing", False
    elif kind == "union_tag_invalid":
        key = str(ctx.get("discriminator", "")).strip("'")
        loc = (*loc, key)
        message = f"{ctx.get('tag')!r} is not a known {key} (known: {ctx.get('expected_tags')})"
        show = False
    elif kind == "union_tag_not_found":
        key = str(ctx.get("discriminator", "")).strip("'")
        loc = (*loc, key)
        message, show = f"required key is missing (the {key} decides which other keys are allowed)", False
    elif kind == "extra_forbidden":
        message, show = "unknown key", False
    elif kind in ("unknown_key", "step", "check", "ref", "bounds"):
        show = False
    if show and repr(value) in message:
        show = False
    return _locate(root, loc, message, value, show)


# ---------------------------------------------------------------------------- cross-references

SemanticIssue = tuple[Loc, str, Any, bool]


def _placeholders(texts: Sequence[str]) -> list[str]:
    bad = []
    for text in texts:
        for match in _PLACEHOLDER_RE.finditer(text):
            if match.group(1) not in PLACEHOLDERS:
                bad.append(match.group(0))
    return bad


def _semantic(sc: Scenario) -> list[SemanticIssue]:
    """Rules that span keys: names exist, roles fit, faults/marks are defined, budgets fit."""
    issues: list[SemanticIssue] = []
    procs = sc.processes
    names = ", ".join(procs)

    def need_process(loc: Loc, name: str, roles: Sequence[str] | None = None, what: str = "process") -> bool:
        if name not in procs:
            close = difflib.get_close_matches(name, list(procs), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            issues.append((loc, f"no {what} named {name!r}{hint} (processes: {names})", None, False))
            return False
        if roles is not None and procs[name].role not in roles:
            issues.append(
                (loc, f"{name!r} is a {procs[name].role}, expected a {' or '.join(roles)}", None, False)
            )
            return False
        return True

    def need_event(loc: Loc, process: str, event: str) -> None:
        if process in procs and procs[process].role == "command":
            issues.append((loc, f"{process!r} is a command process and writes no events", None, False))
            return
        if event not in EVENT_NAMES:
            close = difflib.get_close_matches(event, list(EVENT_NAMES), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            issues.append((loc, f"{event!r} is not an mxref event{hint}", None, False))

    # proxies
    proxy_names = ", ".join(sc.proxies) or "none defined"

    def need_proxy(loc: Loc, name: str) -> bool:
        if name in sc.proxies:
            return True
        close = difflib.get_close_matches(name, list(sc.proxies), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        issues.append((loc, f"no proxy named {name!r}{hint} (proxies: {proxy_names})", None, False))
        return False

    for name, proxy in sc.proxies.items():
        need_process(("proxies", name, "upstream"), proxy.upstream, ("server",), "server process")

    # hosts, servers, placeholders
    host_names = list(sc.hosts)
    kinds = {spec.kind for spec in sc.hosts.values()}
    if "netns" in kinds and len(kinds) > 1:
        others = [n for n, h in sc.hosts.items() if h.kind != "netns"]
        issues.append((("hosts",), f"netns hosts cannot be mixed with other kinds ({', '.join(others)}): a process "
                       "in a namespace cannot reach one on this machine's loopback", None, False))
    for name, spec in procs.items():
        loc: Loc = ("processes", name)
        if spec.host is not None and spec.host not in sc.hosts:
            issues.append(((*loc, "host"), f"no host named {spec.host!r} (hosts: {', '.join(host_names)})", None, False))
        if spec.host is None and len(host_names) > 1:
            issues.append(((*loc, "host"), f"required when the scenario has several hosts ({', '.join(host_names)})", None, False))
        if isinstance(spec, SourceProcess | ReaderProcess):
            servers = [n for n, p in procs.items() if p.role == "server"]
            if spec.server is not None:
                need_process((*loc, "server"), spec.server, ("server",), "server process")
            if spec.server_via is not None and need_proxy((*loc, "server_via"), spec.server_via):
                upstream = sc.proxies[spec.server_via].upstream
                if spec.server is not None and spec.server != upstream:
                    issues.append(((*loc, "server_via"), f"proxy {spec.server_via!r} leads to {upstream!r}, "
                                   f"not to this {spec.role}'s server {spec.server!r}", None, False))
            named = spec.server is not None or spec.server_via is not None  # the proxy names its server
            if not named and not servers:
                issues.append((loc, f"a {spec.role} needs a server process, and the scenario defines none", None, False))
            elif not named and len(servers) > 1:
                issues.append(((*loc, "server"), f"required: several servers ({', '.join(servers)})", None, False))
        texts: list[str] = list(spec.env.values())
        if isinstance(spec, CommandProcess):
            texts += list(spec.argv)
        elif isinstance(spec, MxrefProcess):
            texts += list(spec.launcher or ()) + list(spec.extra_args)
        for bad in _placeholders(texts):
            issues.append((loc, f"unknown placeholder {bad} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})", None, False))
    for bad in _placeholders([*sc.launcher, *sc.env.values()]):
        issues.append((("launcher",), f"unknown placeholder {bad} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})", None, False))

    # steps
    fault_names: dict[str, Loc] = {}
    marks: dict[str, Loc] = {}
    counter = 0
    for ref in iter_steps(sc.steps):
        step = ref.step
        if isinstance(step, FaultStep):
            counter += 1
            name = step.fault.name or f"{step.fault.kind}-{counter}"
            if name in fault_names:
                issues.append(((*ref.loc, "fault", "name"), f"fault name {name!r} is used twice", None, False))
            fault_names[name] = ref.loc
        elif isinstance(step, MarkStep):
            if step.mark in marks:
                issues.append(((*ref.loc, "mark"), f"mark {step.mark!r} is used twice", None, False))
            marks[step.mark] = ref.loc

    run_budget = sc.budgets.run

    def need_within(loc: Loc, within: float | None) -> None:
        if within is not None and within > run_budget:
            issues.append((loc, f"{within:g}s is longer than the whole run's budget (budgets.run {run_budget:g}s)", within, True))

    if sc.budgets.step > run_budget:
        issues.append((("budgets", "step"), f"{sc.budgets.step:g}s is longer than budgets.run ({run_budget:g}s)", None, False))

    defined_faults: set[str] = set()
    counter = 0
    for ref in iter_steps(sc.steps):
        step, loc = ref.step, ref.loc
        if isinstance(step, SleepStep):
            need_within((*loc, "sleep"), step.sleep)
        elif isinstance(step, StartStep):
            for i, name in enumerate(step.start):
                need_process((*loc, "start", i), name)
        elif isinstance(step, StopStep | RestartStep):
            arg = step.stop if isinstance(step, StopStep) else step.restart
            key = "stop" if isinstance(step, StopStep) else "restart"
            for i, name in enumerate(arg.process):
                need_process((*loc, key, "process", i), name)
        elif isinstance(step, AwaitStep):
            arg = step.await_
            base = (*loc, "await")
            if isinstance(arg, AwaitEvent):
                if need_process((*base, "process"), arg.process):
                    need_event((*base, "event"), arg.process, arg.event)
            elif isinstance(arg, AwaitExit):
                need_process((*base, "process"), arg.process)
            else:
                need_process((*base, "metric", "process"), arg.metric.process)
            need_within((*base, "within"), arg.within)
        elif isinstance(step, FaultStep):
            counter += 1
            spec: FaultSpec = step.fault
            cls = fault_registry.REGISTRY[spec.kind]
            fault = fault_registry.make_fault(spec, spec.name or f"{spec.kind}-{counter}")
            for target in fault.targets():
                need_process((*loc, "fault", "target"), target)
            for proxy in fault.proxies():
                need_proxy((*loc, "fault", "proxy"), proxy)
            for key, host_target in fault.host_targets():
                issues += _host_target(sc, (*loc, "fault", key), host_target, spec.kind, cls.host_kinds)
            spec_target = getattr(spec, "target", None)
            if isinstance(spec_target, SourceOf) and spec_target.source_of in procs \
                    and procs[spec_target.source_of].role != "reader":
                issues.append(((*loc, "fault", "target", "source_of"),
                               f"source_of names a reader, and {spec_target.source_of!r} is a "
                               f"{procs[spec_target.source_of].role}", spec_target.source_of, False))
            if spec.duration is not None and not cls.healable:
                issues.append(
                    ((*loc, "fault", "duration"), f"a {spec.kind} fault has nothing to heal, so it takes no duration", None, False)
                )
            need_within((*loc, "fault", "duration"), spec.duration)
            after = getattr(spec, "after", None)
            target = getattr(spec, "target", None)
            if isinstance(after, str) and isinstance(target, str) and target in procs:
                need_event((*loc, "fault", "after"), target, after)
            defined_faults.add(fault.name)
        elif isinstance(step, HealStep):
            for i, name in enumerate(step.heal):
                if name != "all" and name not in fault_names:
                    known = ", ".join(fault_names) or "none defined"
                    issues.append(((*loc, "heal", i), f"no fault named {name!r} (faults: {known})", None, False))
                elif name != "all" and name not in defined_faults:
                    issues.append(((*loc, "heal", i), f"fault {name!r} is healed before it is injected", None, False))

    # start order: a source/reader needs its server started earlier (or in the same parallel block)
    issues += _start_order(sc, sc.steps, ("steps",), set())

    # checks
    for i, (kind, params) in enumerate(sc.check_entries()):
        base: Loc = ("checks", i, kind)
        for key, name, roles in params.process_refs():
            key_loc: Loc = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", key) if p)
            need_process((*base, *key_loc), name, roles)
        for key_loc, ref in _refs_in(params):
            where = (*base, *key_loc)
            if ref.process is not None:
                if need_process((*where, "process"), ref.process) and ref.event is not None:
                    need_event((*where, "event"), ref.process, ref.event)
            if ref.fault is not None and ref.fault not in fault_names:
                issues.append(((*where, "fault"), f"no fault named {ref.fault!r} (faults: {', '.join(fault_names) or 'none'})", None, False))
            if ref.mark is not None and ref.mark not in marks:
                issues.append(((*where, "mark"), f"no mark named {ref.mark!r} (marks: {', '.join(marks) or 'none'})", None, False))
    return issues


def _host_target(sc: Scenario, loc: Loc, target: str | SourceOf, kind: str, kinds: Sequence[str]) -> list[SemanticIssue]:
    """A network fault's host parameter: a host, a process (its host) or ``{source_of: reader}``
    (the host of whichever source it attempts: every source must then be on a fitting host)."""
    procs, hosts = sc.processes, sc.hosts
    wanted = " or ".join(kinds)
    if isinstance(target, SourceOf):
        reader = target.source_of
        if reader not in procs:
            return [((*loc, "source_of"), f"no process named {reader!r} (processes: {', '.join(procs)})", None, False)]
        if procs[reader].role != "reader":
            return [((*loc, "source_of"), f"source_of names a reader, and {reader!r} is a {procs[reader].role}", reader, False)]
        candidates = [n for n, p in procs.items() if p.role == "source"]
        off = [n for n in candidates if hosts[sc.host_of(n)].kind not in kinds]
        if off:
            return [(loc, f"a {kind} fault acts on {wanted} hosts, and source(s) {', '.join(off)} run on "
                     f"{' '.join(sorted({hosts[sc.host_of(n)].kind for n in off}))} hosts", None, False)]
        return []
    if target in hosts:
        if target in procs and sc.host_of(target) != target:
            return [(loc, f"{target!r} is both a host and a process on host {sc.host_of(target)!r}; rename one", None, False)]
        host = target
    elif target in procs:
        host = sc.host_of(target)
    else:
        close = difflib.get_close_matches(target, [*hosts, *procs], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return [(loc, f"no host or process named {target!r}{hint} (hosts: {', '.join(hosts)}; processes: "
                 f"{', '.join(procs)})", None, False)]
    if host not in hosts:
        return []  # the process's own host key is reported already
    if hosts[host].kind not in kinds:
        return [(loc, f"a {kind} fault acts on {wanted} hosts, and host {host!r} is {hosts[host].kind} "
                 f"(declare it `{host}: {{kind: netns}}` under hosts)", None, False)]
    return []


def _refs_in(params: BaseModel) -> Iterator[tuple[Loc, Ref]]:
    for key, field in type(params).model_fields.items():
        value = getattr(params, key)
        alias = field.alias or key
        if isinstance(value, Ref):
            yield (alias,), value
        elif isinstance(value, tuple | list):
            for i, item in enumerate(value):
                if isinstance(item, Ref):
                    yield (alias, i), item


def _start_order(sc: Scenario, steps: Sequence[BaseModel], loc: Loc, started: set[str]) -> list[SemanticIssue]:
    issues: list[SemanticIssue] = []
    for i, step in enumerate(steps):
        here = (*loc, i)
        if isinstance(step, StartStep):
            for j, name in enumerate(step.start):
                server = sc.server_of(name) if name in sc.processes else None
                if server is not None and server not in started:
                    issues.append(
                        ((*here, "start", j), f"{name!r} is started before its server {server!r}", None, False)
                    )
                started.add(name)
        elif isinstance(step, ParallelStep):
            block = set(started)
            for branch in step.parallel:
                for ref in iter_steps(branch):
                    if isinstance(ref.step, StartStep):
                        block.update(ref.step.start)
            for b, branch in enumerate(step.parallel):
                issues += _start_order(sc, branch, (*here, "parallel", b), set(block))
            started.update(block)
    return issues

