"""The command line, typed: each role's parsed flags as one frozen dataclass (``ServerFlags``,
``SourceFlags``, ``ReaderFlags``, ``PrepareFlags``, ``DemoFlags``), built once at the front door
(``python -m mxref``, and each bench or adapter's own ``main``) and passed down; no module below
a front door sees an ``argparse.Namespace`` (a unit test holds every module to it).

The flags themselves (names, types, defaults, help) stay where argparse declares them
(``mxref.__main__.build_parser``, ``mxref.model.add_model_args``,
``mxref.metadata.main.add_server_args``); ``typed`` turns a parsed namespace into its class and
fails when a flag has no field or a field no flag, so the two cannot drift apart. The classes
are groups joined by inheritance: every role has ``CommonFlags``; a source and a reader,
``PeerFlags`` (a NIXL process on the control plane); each role that holds a model,
``ModelFlags``."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Flags = TypeVar("Flags", bound=DataclassInstance)
else:
    Flags = TypeVar("Flags")

__all__ = [
    "CommonFlags", "DemoFlags", "ModelFlags", "PeerFlags", "PrepareFlags", "ReaderFlags", "RoleFlags",
    "ROLE_FLAGS", "ServerFlags", "SourceFlags", "parse", "parse_known", "parse_role", "typed",
]


@dataclass(frozen=True, kw_only=True)
class CommonFlags:
    """Every role's: its name in events and logs, and where its events go."""

    role: ClassVar[str]
    name: str
    events: str | None


@dataclass(frozen=True, kw_only=True)
class ServerFlags(CommonFlags):
    """``python -m mxref server`` (``mxref.metadata.main.add_server_args``)."""

    role: ClassVar[str] = "server"
    host: str
    port: int
    metrics_port: int
    metrics_host: str | None
    heartbeat_timeout: float | None
    reaper_interval: float | None
    gc_timeout: float | None
    store: str
    store_timeout: float
    grpc_impl: str
    tls_cert: str | None
    tls_key: str | None
    token_file: str | None
    reader_token_file: str | None
    max_message_bytes: int
    max_blob_bytes: int
    max_name_bytes: int
    max_tensors: int
    max_worker_rank: int
    publish_rate: float
    publish_burst: int
    max_records: int
    max_record_bytes: int
    max_store_bytes: int
    peer_publish_rate: float
    peer_publish_burst: int
    peer_share: float
    new_peer_headroom: float
    mx_writes: str


@dataclass(frozen=True, kw_only=True)
class ModelFlags:
    """The model a role holds: a synthetic spec, or a safetensors file (``mxref.model.add_model_args``)."""

    model_name: str
    tensors: int
    tensor_mib: float
    dtype: str
    seed: int
    model_file: Path | None
    expect_digest: str | None
    checkpoint: Path | None


@dataclass(frozen=True, kw_only=True)
class PeerFlags(CommonFlags):
    """A NIXL process on the control plane (a source, a reader): /metrics, transport, its
    worker's place and its credentials."""

    metrics_port: int
    metrics_host: str
    transport: str
    server: str | None
    rank: int
    accelerator: str
    device_id: int
    agent_name: str | None
    advertise_host: str
    mx_version: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    token_file: str | None


@dataclass(frozen=True, kw_only=True)
class SourceFlags(PeerFlags, ModelFlags):
    """``python -m mxref source``."""

    role: ClassVar[str] = "source"
    mode: str
    nixl_port: int
    worker_port: int
    heartbeat_interval: float | None
    serve_seconds: float | None
    ready_delay: float
    lease_seconds: float | None
    drain_timeout: float | None
    debug_hooks: bool
    grow_tensors: int | None
    data_seed: int | None
    lie_manifest: bool


@dataclass(frozen=True, kw_only=True)
class ReaderFlags(PeerFlags, ModelFlags):
    """``python -m mxref reader``."""

    role: ClassVar[str] = "reader"
    transfer_timeout: float | None
    handshake_timeout: float
    read_chunk_mib: float
    read_window: int
    read_ramp: bool
    hash_while_reading: bool
    rpc_timeout: float
    selector: str | None
    selector_seed: int | None
    serve_after_load: bool
    serve_seconds: float | None
    heartbeat_interval: float | None
    worker_port: int
    mode: str
    push_metadata: bool
    skip_release: bool
    simulate_unguarded_retry: bool
    result: Path | None
    settle_s: float
    settle_always: bool
    lease: bool
    accept_growth: bool
    load_loop: bool
    probe_duplicate_registration: bool
    debug_leak: str | None
    debug_hooks: bool


@dataclass(frozen=True, kw_only=True)
class PrepareFlags(CommonFlags, ModelFlags):
    """``python -m mxref prepare``."""

    role: ClassVar[str] = "prepare"
    checkpoint: Path  # required: the file it writes
    data_seed: int | None


@dataclass(frozen=True, kw_only=True)
class DemoFlags(CommonFlags):
    """``python -m mxref demo`` (``mxref.bench.demo``)."""

    role: ClassVar[str] = "demo"
    tensors: int
    tensor_mib: float
    workdir: Path | None
    transport: str
    accelerator: str
    no_baseline: bool
    compare_chunked_runs: int
    chunk_mib: float


RoleFlags = ServerFlags | SourceFlags | ReaderFlags | PrepareFlags | DemoFlags
ROLE_FLAGS: Mapping[str, type[RoleFlags]] = {
    cls.role: cls for cls in (ServerFlags, SourceFlags, ReaderFlags, PrepareFlags, DemoFlags)
}
"""``python -m mxref ROLE``'s flags by role (``bench`` parses its own: ``mxref.bench.load``)."""


def typed(cls: type[Flags], namespace: argparse.Namespace, *, skip: Sequence[str] = ()) -> Flags:
    """``namespace`` as ``cls``; ``TypeError`` naming each flag without a field and each field
    without a flag (``skip``: destinations that are not flags, such as a subcommand's)."""
    given = {key: value for key, value in vars(namespace).items() if key not in skip}
    names = {f.name for f in dataclasses.fields(cls)}
    if given.keys() != names:
        raise TypeError(f"{cls.__name__}: flags without a field {sorted(given.keys() - names)}, "
                        f"fields without a flag {sorted(names - given.keys())}")
    return cls(**given)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None, cls: type[Flags]) -> Flags:
    """``argv`` (None: ``sys.argv[1:]``) parsed by ``parser`` into ``cls``; exits 2 on bad flags."""
    return typed(cls, parser.parse_args(argv))


def parse_known(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                cls: type[Flags]) -> tuple[Flags, list[str]]:
    """As ``parse``, leaving the flags ``parser`` does not know to the caller."""
    namespace, rest = parser.parse_known_args(argv)
    return typed(cls, namespace), rest


def parse_role(parser: argparse.ArgumentParser, argv: Sequence[str]) -> RoleFlags:
    """``python -m mxref ROLE ...``'s flags, typed by role (``parser``'s subcommand ``role``)."""
    namespace = parser.parse_args(argv)
    cls = ROLE_FLAGS.get(namespace.role)
    if cls is None:
        parser.error(f"{namespace.role}: not a role that parses here (known: {', '.join(ROLE_FLAGS)})")
    return typed(cls, namespace, skip=("role",))
