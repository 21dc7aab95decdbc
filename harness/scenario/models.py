"""Scenario models of everything but steps and checks: hosts, the model, budgets, scrapes,
process options, processes and proxies (and the placeholders their strings may hold).

Leaf of the ``harness.scenario`` package: the step models (``steps.py``) and the whole
``Scenario`` (``document.py``) are built from these.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from harness.spec import Duration, Name, Strict, custom_error

__all__ = [
    "PLACEHOLDERS",
    "PLACEHOLDER_RE",
    "Broken",
    "Budgets",
    "CommandProcess",
    "EnvMap",
    "HostRequires",
    "HostSpec",
    "LocalHostSpec",
    "ModelSpec",
    "MxrefProcess",
    "NameList",
    "NetnsHostSpec",
    "ProcessSpec",
    "ProxySpec",
    "ReaderProcess",
    "Credentials",
    "ScrapeSpec",
    "SecuritySpec",
    "ServerProcess",
    "SourceProcess",
    "Subject",
    "TamperCheckpoint",
]

# Placeholders allowed in launcher / argv / extra_args / env values, filled by the runner.
PLACEHOLDERS: dict[str, str] = {
    "python": "the harness's Python interpreter (sys.executable)",
    "run_dir": "this run's folder",
    "proc_dir": "the folder holding this process's log and events",
    "scenario_dir": "the folder of the scenario file",
    "seed": "the run's seed",
}
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


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
    if isinstance(value, str):
        return {"kind": value}
    if isinstance(value, dict) and "kind" not in value:  # ``{requires: {...}}``: a local host
        return {"kind": "local", **value}
    return value


class HostRequires(Strict):
    """Hardware a logical host must have (``hosts: {a: {requires: {accelerator: cuda,
    transport: rdma}}}``). Only an inventory's machines provide it: its machine must declare it
    (``accelerator: {kind: cuda, device: N}``, ``transport: rdma``) and have it when probed over
    ssh (``harness.scenario.capabilities.HARDWARE_PROBE``); otherwise the run is a SKIP naming the host and
    the lack. Without ``--inventory`` such a scenario is a SKIP saying it needs one."""

    accelerator: Literal["cuda"] | None = None  # a GPU: VRAM sources and readers
    transport: Literal["rdma"] | None = None  # an RDMA NIC, and the machine's transport profile rdma

    @model_validator(mode="after")
    def _something(self) -> HostRequires:
        if self.accelerator is None and self.transport is None:
            raise custom_error("requires", "requires names accelerator: cuda, transport: rdma or both (or drop it)")
        return self

    def describe(self) -> str:
        return ", ".join(f"{key} {value}" for key, value in (("accelerator", self.accelerator), ("transport", self.transport)) if value)


class HostBase(Strict):
    requires: HostRequires | None = None  # hardware it needs (an inventory's machine provides it)


class LocalHostSpec(HostBase):
    """Processes run on this machine, reached over loopback (with ``--inventory``: on the
    machine it is bound to, over ssh)."""

    kind: Literal["local"] = "local"


class NetnsHostSpec(HostBase):
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


class SecuritySpec(Strict):
    """The control plane's credentials (``mxref.pki`` writes them per run): ``tls`` gives
    every mxref server a certificate of a throwaway CA and every client that CA; ``token``
    (needs ``tls``) a bearer token every server requires. Off: plaintext, as mxref defaults."""

    tls: bool = False
    token: bool = False

    @model_validator(mode="after")
    def _token_needs_tls(self) -> SecuritySpec:
        if self.token and not self.tls:
            raise custom_error("security", "token: true needs tls: true (a bearer token never travels in plaintext)")
        return self


Credentials = Literal["run", "no_token", "wrong_token", "none"]
"""What a source or reader is given of the run's credentials: ``run`` all of them; the others
make it a rogue: ``no_token`` / ``wrong_token`` get the CA (public) and no token or a wrong
one, ``none`` nothing (plaintext). A rogue never gets the servers' certificate and key, so its
own WorkerService is plaintext."""


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
    store_timeout: Duration | None = None  # bound on one Redis socket operation (mxref: 1s), with a store
    grpc_impl: Literal["native", "grpcio"] | None = None  # its gRPC (mxref: native); mxchaos run --grpc-impl sets every server's


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
    # the identity's mx_version (mxref: its own version): peers of different versions never match,
    # as ModelExpress's source id hashes the client version (a rolling upgrade's version skew)
    mx_version: str | None = Field(None, pattern=r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$")


class SourceOptions(PeerOptions):
    mode: Literal["p2p", "central"] | None = None
    nixl_port: int | None = Field(None, ge=0, le=65535)
    checkpoint: str | None = None  # serve this safetensors file's bytes
    data_seed: int | None = None  # serve the bytes of this seed under the model's identity (a lying source)
    # SIGUSR2 toggles corruption of its registered memory (the `corrupt` fault); SIGHUP asks a refit (`drain`)
    debug_hooks: bool = False
    lease_seconds: Duration | None = None  # a tensor read lease's lifetime (mxref: ModelExpress's rule, 1830 s)
    drain_timeout: Duration | None = None  # a refit's drain bound (mxref: a lease lifetime + 1 s)
    # with debug_hooks: a refit (`drain`) adds this many tensors and republishes the grown manifest
    # under the same identity (ModelExpress 0.8); the `one_generation` check knows both generations
    grow_tensors: int | None = Field(None, ge=1, le=4096)


class ReaderOptions(PeerOptions):
    transfer_timeout: Duration | None = None
    handshake_timeout: Duration | None = None
    rpc_timeout: Duration | None = None  # deadline of each metadata-server RPC (mxref: 30s)
    # chunked READ with a stall deadline (mxref's default: 16 MiB); 0: one READ handle, bounded
    # only by transfer_timeout (docs/contract.md#read-budget)
    read_chunk_mib: float | None = Field(None, ge=0)
    read_window: int | None = Field(None, ge=1, le=64)  # chunks in flight (mxref's default: 2); a deeper window's deadline is longer
    selector: Literal["random", "rendezvous_hash", "ordinal"] | None = None
    selector_seed: int | None = None  # default: the run's seed
    serve_after_load: bool = False
    skip_release: bool = False  # the simulated pre-fix bug: never disconnect the source
    push_metadata: bool = False  # experimental: push the reader's NIXL metadata to the source
    mode: Literal["p2p", "central"] | None = None  # serving mode after load
    checkpoint: str | None = None  # default: the checkpoint the runner prepares in the run folder
    # after a load that released a READ before it completed, wait this long and report what memory
    # holds again (mxref: 0.5 s); settle_always: after every load
    settle_s: Duration | None = None
    settle_always: bool = False
    lease: bool = False  # take a tensor read lease (PrepareTensorRead) for each READ, give it back after
    # a NIXL probe: after a load over NIXL, register one range twice and deregister both (NIXL #1792)
    probe_duplicate_registration: bool = False
    # read a manifest that grew after publishing (ModelExpress 0.8's republish) whole; else it is a mismatch
    accept_growth: bool = False


Subject = Literal["mxref", "modelexpress"]
"""Who plays a source or reader: mxref, or the real ModelExpress client (``harness.subjects``)."""


class ProcessBase(Strict):
    host: Name | None = None  # default: the only host
    env: EnvMap = Field(default_factory=dict)


class MxrefProcess(ProcessBase):
    launcher: tuple[str, ...] | None = Field(None, min_length=1)  # default: the scenario's
    extra_args: tuple[str, ...] = ()


class ServerProcess(MxrefProcess):
    """``mxref server``: the metadata server (port 0: it picks one and reports it). ``store``: a
    ``redis`` process of the scenario to keep its records in (``--store redis://...``; default:
    in memory)."""

    role: Literal["server"]
    options: ServerOptions = ServerOptions()
    store: Name | None = None
    store_via: Name | None = None  # reach the store through this proxy (its upstream: the redis process)
    # who plays it: mxref's server, or the real ModelExpress server (harness.subjects.mx_server; needs a store)
    subject: Subject | None = None


class SourceProcess(MxrefProcess):
    """``mxref source``: serves the model; ``server`` defaults to the only server (or the
    upstream of ``server_via``, a proxy it reaches the server through)."""

    role: Literal["source"]
    server: Name | None = None
    server_via: Name | None = None
    options: SourceOptions = SourceOptions()
    credentials: Credentials = "run"
    subject: Subject | None = None  # who plays it (harness.subjects); default: the scenario's


class TamperCheckpoint(Strict):
    """The reader falls back to a tampered copy of the run's checkpoint, written into the run
    folder when it starts: byte ``byte`` of tensor ``tensor`` (index in name order) XORed with
    ``xor``. ``consistent``: the copy's recorded checksums are recomputed to match the tampered
    bytes (a checkpoint that lies consistently: only an independent reference catches it);
    false keeps the honest recorded checksums."""

    tensor: int = Field(0, ge=0)
    byte: int = Field(0, ge=0)
    xor: int = Field(0xFF, ge=1, le=0xFF)
    consistent: bool = True


class ReaderProcess(MxrefProcess):
    """``mxref reader``: loads the model (rdma, else disk fallback) and exits (0: verified)."""

    role: Literal["reader"]
    server: Name | None = None
    server_via: Name | None = None  # reach the server through this proxy
    options: ReaderOptions = ReaderOptions()
    credentials: Credentials = "run"
    subject: Subject | None = None  # who plays it (harness.subjects); default: the scenario's
    tamper_checkpoint: TamperCheckpoint | None = None

    @model_validator(mode="after")
    def _one_checkpoint(self) -> ReaderProcess:
        if self.tamper_checkpoint is not None and self.options.checkpoint is not None:
            raise custom_error(
                "tamper_checkpoint",
                "tamper_checkpoint tampers a copy of the run's prepared checkpoint (or model file), "
                "so it cannot be combined with options.checkpoint"
            )
        return self


class CommandProcess(ProcessBase):
    """Any other program (``argv``), e.g. a proxy; it writes no events."""

    role: Literal["command"]
    argv: tuple[str, ...] = Field(min_length=1)


class RedisProcess(ProcessBase):
    """A real ``redis-server`` (``harness.subjects.redisd``): a server's store. ``port`` 0: a free one,
    kept across restarts, so the server's ``--store`` stays right."""

    role: Literal["redis"]
    port: int = Field(0, ge=0, le=65535)


ProcessSpec = Annotated[
    Union[ServerProcess, SourceProcess, ReaderProcess, CommandProcess, RedisProcess],  # noqa: UP007
    Field(discriminator="role"),
]


class ProxySpec(Strict):
    """A toxiproxy proxy in front of ``upstream``'s gRPC endpoint (a server process), or its
    Redis port (a redis process). Sources and readers with ``server_via`` reach that server
    through it, a server with ``store_via`` that store; ``toxic`` and ``proxy_down`` faults
    act on it."""

    upstream: Name




class Broken(BaseModel):
    """Stands for an entry (a step, a check) that failed schema validation, so that the
    cross-reference rules can run on the rest of the file with every other entry at its own
    index. Never part of a valid scenario."""

    model_config = ConfigDict(frozen=True)
    raw: Any = None
