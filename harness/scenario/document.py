"""The whole scenario file as one model: ``Scenario`` (and its ``checks`` entries, one
model per registered check kind).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BaseModel, BeforeValidator, Discriminator, Field, PrivateAttr, Tag, ValidationInfo, create_model, field_validator

from harness import checks as check_registry
from harness.record.rates import parse_rate
from harness.scenario.models import (
    Broken,
    Budgets,
    EnvMap,
    HostRequires,
    HostSpec,
    LocalHostSpec,
    ModelSpec,
    ProcessSpec,
    ProxySpec,
    ReaderProcess,
    ScrapeSpec,
    SecuritySpec,
    ServerProcess,
    SourceProcess,
    Subject,
)
from harness.scenario.steps import Step, model_key
from harness.spec import Name, Strict, custom_error
from harness.subjects.envs import subject_spec
from harness.subjects.releases import client_release_fits, client_versions_rule
from mxref.config import TRANSPORT_PROFILES

__all__ = ["CHECK_MODELS", "SUBJECT_NAMES", "CheckEntry", "Scenario"]

SUBJECT_NAMES: tuple[Subject, ...] = get_args(Subject)  # every subject, the default of ``subjects``


def _check_models() -> dict[str, type[BaseModel]]:
    models: dict[str, type[BaseModel]] = {}
    for kind in sorted(check_registry.REGISTRY):
        definition = check_registry.REGISTRY[kind]
        model: type[BaseModel] = create_model(  # type: ignore[call-overload]  # fields by keyword from a dict
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
        return f"<{model_key(value)}>"
    if isinstance(value, Mapping):
        for key in value:
            if key in CHECK_MODELS:
                return f"<{key}>"
    return None


def _check_entry_shape(value: Any) -> Any:
    known = ", ".join(CHECK_MODELS)
    if not isinstance(value, Mapping) or len(value) != 1:
        raise custom_error("check", f"a check is a mapping with exactly one key, the check kind ({known})")
    (key,) = value
    if key not in CHECK_MODELS:
        close = difflib.get_close_matches(str(key), list(CHECK_MODELS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise custom_error("check", f"{key!r} is not a check{hint} (known: {known})", key=str(key))
    if value[key] is None:  # ``- integrity:`` with no parameters
        return {key: {}}
    return value


if TYPE_CHECKING:
    CheckEntry = BaseModel
else:
    CheckEntry = Annotated[
        Union[tuple(Annotated[model, Tag(f"<{kind}>")] for kind, model in CHECK_MODELS.items())],  # noqa: UP007
        Discriminator(_check_key),
        BeforeValidator(_check_entry_shape),
    ]


def _rate(value: Any, key: str = "defect_rate") -> str:
    """A measured rate, k/n, as text; a clear error naming ``key`` otherwise."""
    if not isinstance(value, str):
        raise custom_error(key, "write the measured rate as k/n, e.g. 4/6 (the defect showed in 4 of 6 runs)")
    try:
        return str(parse_rate(value))
    except ValueError as exc:
        raise custom_error(key, str(exc)) from None


def _nixl_versions(value: Any, key: str = "defect_versions") -> tuple[str, ...]:
    """NIXL versions a defect was measured on ("1.5.1", "1.4": any 1.4.x)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(
        isinstance(v, str) and re.fullmatch(r"\d+(\.\d+){1,2}", v.strip()) for v in items
    ):
        raise custom_error(key, "list NIXL versions as strings, e.g. [\"1.5.1\", \"1.4\"] (1.4: any 1.4.x)")
    return tuple(v.strip() for v in items)


class SubjectDefect(Strict):
    """A client's own known defect in a file that also states another (``subject_defects``): its
    text, measured rate and NIXL versions, as the top-level keys of the same names say."""

    known_defect: str = Field(min_length=1)
    defect_rate: str | None = None
    defect_versions: tuple[str, ...] = ()

    @field_validator("known_defect")
    @classmethod
    def _text(cls, value: str) -> str:
        if not value.strip():
            raise custom_error("known_defect", "describe the defect: what is broken, where, since which version")
        return value.strip()

    @field_validator("defect_rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        return None if value is None else _rate(value)

    @field_validator("defect_versions", mode="before")
    @classmethod
    def _versions(cls, value: Any) -> Any:
        return () if not value else _nixl_versions(value)


def _default_hosts() -> dict[str, HostSpec]:
    return {"local": LocalHostSpec()}



class Scenario(Strict):
    """One scenario file."""

    name: Name
    description: str = ""
    references: tuple[str, ...] = ()
    # a defect of a dependency this scenario documents: failing checks are expected (xfail)
    known_defect: str | None = None
    # the rate the defect was measured at, k/n ("4/6": it showed in 4 of 6 runs); `--repeat N`
    # calls the defect "FIXED?" only when 0 of N puts the confidence bound below it (harness.record.rates)
    defect_rate: str | None = None
    # the NIXL versions the defect was measured on ("1.5.1", or "1.4" for any 1.4.x); the release
    # matrix expects it there and headlines a version where it did not show (harness.matrix)
    defect_versions: tuple[str, ...] = ()
    # the servers whose defect it is (a ModelExpress server's: [modelexpress]); played by another
    # server (a matrix's mxref server column) the run is judged as a plain scenario (``with_subjects``)
    defect_servers: tuple[Subject, ...] = ()
    # a client's own known defect (``{modelexpress: {known_defect: ..., defect_rate: 1/1}}``), alone or
    # beside the file's general one (a NIXL defect, say): while that client plays a source or reader its
    # defect is the run's known defect in place of the general one; played by another subject (the
    # default mxref, a matrix's mxref column) the general one, or none: a plain scenario
    # (``harness.scenario.subjects.settle_subject_defect``)
    subject_defects: dict[Subject, SubjectDefect] = Field(default_factory=dict)
    seed: int = 0
    transport: str | None = None  # default: ucx-tcp, or ucx-tcp-any when the hosts are netns
    markers: tuple[Name, ...] = ()
    # beside other scenarios in a matrix column (shared) or with nothing beside it (alone);
    # unset: inferred from its faults, hosts, processes and timing checks (harness.matrix.schedule)
    schedule: Literal["alone", "shared"] | None = None
    budgets: Budgets = Budgets()
    scrape: ScrapeSpec = ScrapeSpec()
    hosts: dict[Name, HostSpec] = Field(default_factory=_default_hosts, min_length=1)
    model: ModelSpec = ModelSpec()
    launcher: tuple[str, ...] = Field(("{python}", "-m", "mxref"), min_length=1)
    # who plays the sources and readers: mxref, or the real ModelExpress client (harness.subjects)
    subject: Subject = "mxref"
    # who can play it (default: every subject); a scenario staged with mxref's own options, hooks
    # or events lists [mxref] and says why in subjects_note: played by another subject it SKIPs
    subjects: tuple[Subject, ...] = SUBJECT_NAMES
    subjects_note: str = ""  # required when a subject is left out (harness.scenario.rules.processes)
    # who can play its servers (default: both): a scenario staged with mxref's server's own options,
    # events or metrics lists [mxref] and says why in servers_note; served by the real ModelExpress
    # server (`--subject server=modelexpress`) it SKIPs naming that reason
    servers: tuple[Subject, ...] = SUBJECT_NAMES
    servers_note: str = ""  # required when a server is left out
    # the ModelExpress client releases the scenario is about (a PEP 440 specifier, ``>=0.8.0.dev0``):
    # played by the client of another release (the run's ``--subject modelexpress@V``, else the pinned
    # default) it SKIPs naming both (``not_playable``); mxref's processes are not versioned by it
    client_versions: str | None = None
    env: EnvMap = Field(default_factory=dict)
    security: SecuritySpec = SecuritySpec()  # the control plane's TLS / bearer token (default: plaintext)
    # where servers keep their records: memory, or redis (every server without a ``store`` gets
    # the scenario's redis process, one named ``store`` added when there is none: harness.scenario.stores)
    store: Literal["memory", "redis"] = "memory"
    proxies: dict[Name, ProxySpec] = Field(default_factory=dict)
    processes: dict[Name, ProcessSpec] = Field(min_length=1)
    steps: tuple[Step, ...] = Field(min_length=1)
    checks: tuple[CheckEntry, ...] = ()

    RETIRED_KEYS: ClassVar[dict[str, str]] = {
        "defect_subjects": "a client's own known defect is written under subject_defects, e.g. subject_defects: "
                           "{modelexpress: {known_defect: ..., defect_rate: 1/1}} (move known_defect, defect_rate and "
                           "defect_versions into the client's block)",
    }

    # the file's known defects as written, kept while the one in force is settled for who plays
    # (settle_subject_defect): set aside while others play, restored when they play again
    _subject_defect: dict[str, Any] | None = PrivateAttr(None)
    # the client whose own defect (subject_defects) is the one in force (None: the general one, or none)
    _defect_subject: str | None = PrivateAttr(None)
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

    @field_validator("subjects", "servers")
    @classmethod
    def _subjects(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        key = info.field_name or "subjects"
        if not value:
            raise custom_error(key, f"name who can play the scenario (from {', '.join(SUBJECT_NAMES)}), or drop the key")
        if len(set(value)) != len(value):
            raise custom_error(key, "name each subject once", value=list(value))
        return value

    @field_validator("subjects_note", "servers_note")
    @classmethod
    def _subjects_note(cls, value: str, info: ValidationInfo) -> str:
        key = info.field_name or "subjects_note"
        subjects = info.data.get(key.removesuffix("_note"))
        if subjects is None:  # subjects did not validate: reported there
            return value.strip()
        if set(subjects) == set(SUBJECT_NAMES) and value.strip():
            raise custom_error(key, "every subject can play the scenario: there is nothing to explain (drop the key)")
        return value.strip()

    @field_validator("client_versions")
    @classmethod
    def _client_versions(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        problem = client_versions_rule(value)
        if problem:
            raise custom_error("client_versions", problem)
        subjects = info.data.get("subjects")
        if subjects is not None and "modelexpress" not in subjects:
            raise custom_error("client_versions", f"the ModelExpress client cannot play this scenario (subjects: "
                               f"[{', '.join(subjects)}]): its releases do not apply (drop the key)")
        return value.strip()

    @field_validator("known_defect")
    @classmethod
    def _defect_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise custom_error(
                "known_defect", "describe the defect: what is broken, where, since which version (or drop the key)"
            )
        return value.strip() if value is not None else None

    @field_validator("defect_rate", mode="before")
    @classmethod
    def _defect_rate(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if "known_defect" in info.data and info.data["known_defect"] is None:
            raise custom_error("defect_rate", "defect_rate is the measured rate of a known_defect: state known_defect too")
        return _rate(value)

    @field_validator("defect_versions", mode="before")
    @classmethod
    def _defect_versions(cls, value: Any, info: ValidationInfo) -> Any:
        if not value:
            return ()
        if "known_defect" in info.data and info.data["known_defect"] is None:
            raise custom_error("defect_versions", "defect_versions are where a known_defect was measured: state known_defect too")
        return _nixl_versions(value)

    @field_validator("defect_servers")
    @classmethod
    def _defect_servers(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if value and "known_defect" in info.data and info.data["known_defect"] is None:
            raise custom_error("defect_servers", "defect_servers name whose defect a known_defect is: state known_defect too")
        if len(set(value)) != len(value):
            raise custom_error("defect_servers", "name each server once", value=list(value))
        return value

    @property
    def defect_subject(self) -> str | None:
        """The client whose own known defect (``subject_defects``) is in force as the scenario is
        played now (``settle_subject_defect``); None: the file's general one, or none."""
        return self._defect_subject

    @property
    def measured_rate(self) -> tuple[int, int] | None:
        """``defect_rate`` as (k, n), or None when the scenario states none."""
        if self.defect_rate is None:
            return None
        k, n = self.defect_rate.split("/")
        return int(k), int(n)

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

    def players(self) -> dict[str, str]:
        """Who plays each server, source and reader: its own ``subject``, else (sources and
        readers) the scenario's, else mxref."""
        out: dict[str, str] = {}
        for name, spec in self.processes.items():
            own = getattr(spec, "subject", None)
            if spec.role in ("source", "reader"):
                out[name] = own or self.subject
            elif spec.role == "server":
                out[name] = own or "mxref"
        return out

    def read_windows(self) -> dict[str, tuple[float | None, int | None]]:
        """Each reader's chunked READ as given (``read_chunk_mib``, ``read_window``; None: its default)."""
        return {name: (spec.options.read_chunk_mib, spec.options.read_window)
                for name, spec in self.processes.items() if isinstance(spec, ReaderProcess)}

    def host_of(self, process: str) -> str:
        return self.processes[process].host or next(iter(self.hosts))

    def hardware_hosts(self) -> dict[str, HostRequires]:
        """The hosts that require hardware (``requires:``), with what they require."""
        return {name: spec.requires for name, spec in self.hosts.items() if spec.requires is not None}

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
            if isinstance(entry, Broken):
                continue
            (kind,) = type(entry).model_fields
            out.append((kind, getattr(entry, kind)))
        return out

    def judged_entries(self) -> list[tuple[str, check_registry.CheckParams]]:
        """The checks a run is judged by: the file's own, then the implicit ones every run gets.
        Implicit: NIXL's balance (``nixl_balance``) of every source and reader, unless the file
        judges it itself; those played by ModelExpress's client (which emits no audit) are named
        as not judged (with only those, "not observable", naming the gap); readers that leave
        without a NIXL teardown by design (``skip_release``, the simulated pre-fix bug) are named
        as not judged."""
        own = self.check_entries()
        agents = [n for n, spec in self.processes.items() if spec.role in ("source", "reader")]
        if not agents or any(kind == "nixl_balance" for kind, _ in own):
            return own
        played = self.players()
        departs = [n for n in agents if isinstance(spec := self.processes[n], ReaderProcess) and spec.options.skip_release]
        implicit = check_registry.REGISTRY["nixl_balance"].params.model_validate({
            "name": "nixl_balance (every run)", "implicit": True,
            "processes": [n for n in agents if played[n] == "mxref" and n not in departs],
            "not_audited": [n for n in agents if played[n] != "mxref"],
            "departs": departs,
        })
        return [*own, ("nixl_balance", implicit)]

    def with_seed(self, seed: int) -> Scenario:
        return self.model_copy(update={"seed": seed})

    def with_subject(self, subject: str) -> Scenario:
        """The same scenario played by ``subject`` (``mxchaos run --subject``)."""
        return self.model_copy(update={"subject": subject})

    def with_grpc_impl(self, impl: str) -> Scenario:
        """The same scenario with every server mxref plays on ``impl`` (``mxchaos run
        --grpc-impl``); ModelExpress's server runs its own binary and is left alone."""
        processes = dict(self.processes)
        for name, spec in self.processes.items():
            if isinstance(spec, ServerProcess) and (spec.subject or "mxref") == "mxref":
                processes[name] = spec.model_copy(update={"options": spec.options.model_copy(update={"grpc_impl": impl})})
        return self.model_copy(update={"processes": processes})

    def not_playable(self) -> str | None:
        """Why the subjects that play this scenario's sources and readers, or its servers, cannot
        stage it (one of them is not in ``subjects`` / ``servers``, or the ModelExpress client
        playing is a release outside ``client_versions``), or None when they can."""
        players = {getattr(spec, "subject", None) or self.subject for spec in self.processes.values()
                   if spec.role in ("source", "reader")}
        outside = sorted(players - set(self.subjects))
        if outside:
            return (f"not staged for {', '.join(outside)} (subjects: [{', '.join(self.subjects)}]): "
                    f"{self.subjects_note}")
        if self.client_versions is not None and "modelexpress" in players:
            playing = subject_spec("modelexpress").version  # this run's (--subject modelexpress@V)
            if not client_release_fits(self.client_versions, playing):
                return (f"about the ModelExpress client {self.client_versions} (client_versions), and this run plays "
                        f"{playing}: run it with --subject modelexpress@VERSION of a release in that range "
                        f"(modelexpress@latest-nightly: the newest pre-release)")
        servers = {getattr(spec, "subject", None) or "mxref" for spec in self.processes.values() if spec.role == "server"}
        outside = sorted(servers - set(self.servers))
        if outside:
            return (f"not staged for a {', '.join(outside)} server (servers: [{', '.join(self.servers)}]): "
                    f"{self.servers_note}")
        return None

