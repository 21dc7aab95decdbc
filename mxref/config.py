"""Every environment variable mxref reads, parsed in one place.

Names follow ModelExpress where the behaviour is the same (``MX_*``); mxref's own
knobs are ``MXREF_*``. Command-line flags override the environment; the CLI passes
its values in explicitly, so nothing below ``__main__`` reads ``os.environ``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

logger = logging.getLogger("mxref.config")

# Seed 001: the RDMA path's per-candidate budget when MX_TRANSFER_TIMEOUT is not
# explicitly set (the env helper's own 900 s default is deliberately not inherited).
DEFAULT_TRANSFER_TIMEOUT_S = 300.0
DEFAULT_READ_CHUNK_MIB = 16.0  # chunked READs with a stall deadline (mxref.transfer.chunked); 0: one handle
DEFAULT_READ_WINDOW = 2  # chunks of a chunked READ in flight (its stall deadline: window x chunk / 100 MB/s + 0.5 s)
MAX_SOURCE_RETRIES = 3
# ModelExpress hard-codes 120 s for the NIXL metadata handshake poll.
DEFAULT_HANDSHAKE_TIMEOUT_S = 120.0
DEFAULT_MANIFEST_TIMEOUT_S = 5.0
DEFAULT_RPC_TIMEOUT_S = 30.0

DEFAULT_HEARTBEAT_INTERVAL_S = 30.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 90.0
DEFAULT_REAPER_SCAN_INTERVAL_S = 30.0
DEFAULT_GC_TIMEOUT_S = 3600.0



def transfer_timeout_seconds(env: Mapping[str, str] | None = None) -> float:
    """Per-candidate READ budget in seconds, as docs/contract.md#read-budget defines it.

    ``MX_TRANSFER_TIMEOUT`` is honoured only when explicitly set to a finite,
    positive number. Unset gives 300 s; garbage, zero, negative, NaN or infinity
    give 300 s with a warning, never "wait forever".
    """
    env = os.environ if env is None else env
    raw = env.get("MX_TRANSFER_TIMEOUT")
    if raw is None:
        return DEFAULT_TRANSFER_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        logger.warning(
            "MX_TRANSFER_TIMEOUT=%r is not a number; using %.1fs for the transfer budget",
            raw, DEFAULT_TRANSFER_TIMEOUT_S,
        )
        return DEFAULT_TRANSFER_TIMEOUT_S
    if not math.isfinite(value) or value <= 0:
        logger.warning(
            "MX_TRANSFER_TIMEOUT=%r is not finite and positive; using %.1fs rather than waiting forever",
            raw, DEFAULT_TRANSFER_TIMEOUT_S,
        )
        return DEFAULT_TRANSFER_TIMEOUT_S
    return value


def env_float(name: str, default: float, env: Mapping[str, str] | None = None, allow_zero: bool = False) -> float:
    """A positive (or, with ``allow_zero``, non-negative) finite float from the environment;
    warns and uses ``default`` otherwise."""
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        logger.warning("%s=%r is not a number; using %s", name, raw, default)
        return default
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        logger.warning("%s=%r is not finite and %s; using %s", name, raw,
                       "non-negative" if allow_zero else "positive", default)
        return default
    return value


def server_address(env: Mapping[str, str] | None = None) -> str:
    """``MODEL_EXPRESS_URL`` wins over ``MX_SERVER_ADDRESS`` (as in ModelExpress); scheme stripped."""
    env = os.environ if env is None else env
    raw = env.get("MODEL_EXPRESS_URL") or env.get("MX_SERVER_ADDRESS") or "localhost:8001"
    for prefix in ("http://", "https://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):]
    return raw.rstrip("/")


# Transport profiles: the UCX environment each profile sets before NIXL is imported.
# ``ucx-tcp`` is what single-host chaos needs (the default same-host transport,
# cma, hides a frozen source) plus the segment size that takes TCP from ~1.2 to
# ~3.4 GB/s here. RX is raised together with TX: a source whose TX segment exceeds
# a reader's RX aborts (docs/nixl-facts.md#segment-size-mismatch-aborts-the-source), so every peer must use the same profile.
#
# The TCP-only profiles also turn UCX's memory events off (``UCX_MEM_EVENTS=no``). UCX hooks
# mmap, munmap and their kin when a process creates its first context, so that a registration
# cache can drop pages the program unmaps; it patches each function's code, and in a process
# that already runs threads (gRPC's, NIXL's listener) each patch waited ~50 ms here: the first
# NIXL agent of a process took 0.43 s, of which 0.40 s was the hooks (strace: a sched_yield
# loop between each patch's two mprotect calls), 0.03 s without them (2026-12-02, NIXL 1.5.1,
# UCX 1.23). TCP registers nothing with a device and NIXL registers every buffer itself, so
# there is no cache for the events to keep true. Profiles that can use RDMA or CUDA memory
# keep UCX's default.
TCP_ONLY_UCX = {"UCX_TLS": "tcp", "UCX_TCP_TX_SEG_SIZE": "512K", "UCX_TCP_RX_SEG_SIZE": "512K",
                "UCX_MEM_EVENTS": "no"}
TRANSPORT_PROFILES: dict[str, dict[str, str]] = {
    "ucx-tcp": {**TCP_ONLY_UCX, "UCX_NET_DEVICES": "lo"},
    # Several hosts in network namespaces: TCP on whatever device routes there.
    "ucx-tcp-any": dict(TCP_ONLY_UCX),
    # GPU memory between processes of one host, still over TCP (cuda_copy stages it).
    "ucx-tcp-cuda": {
        "UCX_TLS": "tcp,cuda_copy",
        "UCX_NET_DEVICES": "lo",
        "UCX_TCP_TX_SEG_SIZE": "512K",
        "UCX_TCP_RX_SEG_SIZE": "512K",
    },
    # RDMA hosts: let UCX choose (rc/ud verbs, cuda_copy, ...).
    "rdma": {},
    # Whatever UCX picks on this host (cma/shm on one host).
    "default": {},
}


def apply_transport_profile(name: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Set the profile's variables in ``env`` (default ``os.environ``) unless already set.

    Returns what it set. Must run before NIXL is imported.
    """
    if name not in TRANSPORT_PROFILES:
        raise ValueError(f"unknown transport profile {name!r} (known: {', '.join(TRANSPORT_PROFILES)})")
    target = os.environ if env is None else env
    applied = {}
    for key, value in TRANSPORT_PROFILES[name].items():
        if key not in target:
            target[key] = value
            applied[key] = value
    return applied


# --- gRPC transport -----------------------------------------------------------

# ModelExpress's MxClient caps messages at 100 MB; servers accept the same.
MAX_GRPC_MESSAGE_BYTES = 100 * 1024 * 1024


def grpc_message_options() -> list[tuple[str, int]]:
    """Channel/server options raising both message-size limits to ``MAX_GRPC_MESSAGE_BYTES``."""
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    ]


# A channel that lost its server waits out gRPC's reconnect backoff (default: 1 s, x1.6 per
# failure, up to 120 s) and fails every RPC fast meanwhile, so a source whose server was down
# for a while re-published only seconds to minutes after it was back (measured: 1.6-4.7 s after
# a 3 s outage, 6.4 s after 20 s; ModelExpress #196/#658). The metadata client caps it at about
# a heartbeat interval, so a server that is back is found again by the next heartbeat or two.
# Only the initial and maximum backoff: gRPC also uses ``grpc.min_reconnect_backoff_ms`` as the
# connect timeout (default 20 s), and lowering it made a connection to a hung server fail fast
# with UNAVAILABLE instead of running into the RPC deadline (metadata_server_hangs).
RECONNECT_BACKOFF_MS = (250, 1000)  # (initial, max)


def grpc_client_options() -> list[tuple[str, int]]:
    """``grpc_message_options`` plus the capped reconnect backoff (``RECONNECT_BACKOFF_MS``) of a
    long-lived client channel (the metadata client)."""
    first, cap = RECONNECT_BACKOFF_MS
    return [
        *grpc_message_options(),
        ("grpc.initial_reconnect_backoff_ms", first),
        ("grpc.max_reconnect_backoff_ms", cap),
    ]


# --- metadata server timers ---------------------------------------------------


def parse_seconds(text: str) -> float:
    """A finite, positive duration: ``"2"``, ``"0.5"``, ``"2s"`` or ``"500ms"``.

    Raises ``ValueError`` naming the value and the rule; used for CLI flags, where a
    bad value must stop the process rather than fall back.
    """
    raw = text.strip()
    scale = 1.0
    if raw.endswith("ms"):
        raw, scale = raw[:-2], 0.001
    elif raw.endswith("s"):
        raw = raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (seconds, e.g. 2, 0.5, 2s, 500ms)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a finite duration > 0")
    return value


@dataclass(frozen=True)
class ServerTimers:
    """The metadata server's liveness clocks, in seconds (fractions allowed).

    ``heartbeat_timeout_s``: a READY/INITIALIZING record older than this is stale
    (reaper) and hidden from READY queries (query-time freshness).
    ``reaper_scan_interval_s``: how often the reaper scans.
    ``gc_timeout_s``: a STALE record older than this is deleted.
    """

    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    reaper_scan_interval_s: float = DEFAULT_REAPER_SCAN_INTERVAL_S
    gc_timeout_s: float = DEFAULT_GC_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("heartbeat_timeout_s", "reaper_scan_interval_s", "gc_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"ServerTimers.{name}={value!r}: must be a finite number of seconds > 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServerTimers:
        """``MX_HEARTBEAT_TIMEOUT_SECS`` (90), ``MX_REAPER_SCAN_INTERVAL_SECS`` (30), ``MX_GC_TIMEOUT_SECS`` (3600)."""
        return cls(
            heartbeat_timeout_s=env_float("MX_HEARTBEAT_TIMEOUT_SECS", DEFAULT_HEARTBEAT_TIMEOUT_S, env),
            reaper_scan_interval_s=env_float("MX_REAPER_SCAN_INTERVAL_SECS", DEFAULT_REAPER_SCAN_INTERVAL_S, env),
            gc_timeout_s=env_float("MX_GC_TIMEOUT_SECS", DEFAULT_GC_TIMEOUT_S, env),
        )

    @classmethod
    def resolve(
        cls,
        heartbeat_timeout_s: float | None = None,
        reaper_scan_interval_s: float | None = None,
        gc_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ServerTimers:
        """Flags (the non-``None`` arguments) over the environment over the defaults."""
        base = cls.from_env(env)
        return cls(
            heartbeat_timeout_s=base.heartbeat_timeout_s if heartbeat_timeout_s is None else heartbeat_timeout_s,
            reaper_scan_interval_s=(
                base.reaper_scan_interval_s if reaper_scan_interval_s is None else reaper_scan_interval_s
            ),
            gc_timeout_s=base.gc_timeout_s if gc_timeout_s is None else gc_timeout_s,
        )


# --- what a process reports about its environment -----------------------------

LOGGED_ENV_PREFIXES = ("MX_", "MXREF_", "MODEL_EXPRESS_", "UCX_")


def logged_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a ``started`` event records: ``MX_*``, ``MXREF_*``, ``MODEL_EXPRESS_*``, ``UCX_*``."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(LOGGED_ENV_PREFIXES)}


# --- metadata server limits ---------------------------------------------------
# The server trusts no peer: every request is checked against these before it
# touches the store. ``ServerLimits`` holds the ones an operator may change (each
# has a ``server`` flag); the others are fixed here. docs/mxref.md "Server limits" lists all.

DEFAULT_SERVER_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""gRPC ``max_receive_message_length`` of the metadata server (a larger message never
reaches a handler: gRPC answers RESOURCE_EXHAUSTED itself)."""
DEFAULT_MAX_BLOB_BYTES = 4 * 1024 * 1024
"""``worker.nixl_metadata``, the only bytes field: a NIXL agent blob is tens of KB to a few MB."""
DEFAULT_MAX_NAME_BYTES = 256
"""Names: ``model_name``, ``worker_id``, ``agent_name``, ``mx_source_id``, ``model_name_filter``."""
MAX_STRING_BYTES = 1024
"""Every other string (endpoints, versions, dtypes, tensor names, checksums, pod fields)."""
DEFAULT_MAX_TENSORS = 65536
"""Tensor descriptors in one list (``worker.tensors``, ``worker.tensor_source.tensors``); the
server checks their number, not each one (a reader checks them against its own model)."""
MAX_EXTRA_PARAMETERS = 64
"""Entries of ``identity.extra_parameters``."""
MAX_REPEATED = 1024
"""Any other repeated field of a request (none exists today; a guard for new ones)."""
DEFAULT_MAX_WORKER_RANK = 65535
"""The highest ``worker_rank`` (and ``worker_rank_filter``) accepted."""
DEFAULT_PUBLISH_RATE_PER_S = 20.0
"""Per client (one gRPC connection): PublishMetadata + UpdateStatus calls refilled per second.
A source heartbeats every 0.5-30 s and publishes once per (re)start."""
DEFAULT_PUBLISH_BURST = 100
"""Per client: writes allowed back to back before the rate applies."""
DEFAULT_MAX_RECORDS = 100_000
"""Worker records the store holds; a publish of a new key beyond it is RESOURCE_EXHAUSTED."""
MAX_STREAMS_PER_CONNECTION = 8
"""HTTP/2 concurrent streams one connection may hold (``grpc.max_concurrent_streams``): one
client occupies at most this many of the server's handler threads; more calls queue at the client."""
MAX_TRACKED_CLIENTS = 10_000
"""Rate-limit buckets kept; beyond it, buckets that have refilled (idle clients) are dropped."""
DEFAULT_MAX_RECORD_BYTES = 8 * 1024 * 1024
"""One PublishMetadata request's bytes (the record it stores): a 4 MiB blob plus a few thousand
tensor descriptors fit; a larger request is refused before it is parsed."""
DEFAULT_MAX_STORE_BYTES = 2 * 1024 * 1024 * 1024
"""The bytes of every record the store holds together (each counted as its publish's size)."""
DEFAULT_PEER_PUBLISH_RATE_PER_S = 200.0
"""Per peer address (every connection of one host together): writes refilled per second."""
DEFAULT_PEER_PUBLISH_BURST = 1000
"""Per peer address: writes allowed back to back before the rate applies."""
DEFAULT_PEER_SHARE = 0.5
"""The part of ``max_records`` and of ``max_store_bytes`` the records published from one peer
address may hold together (``mxref.metadata.limits.Capacity``)."""
DEFAULT_NEW_PEER_HEADROOM = 0.05
"""The part of both budgets kept for peers that hold no record yet: a peer that holds one may not
take the store past ``1 - headroom`` of either (``mxref.metadata.limits.Capacity``)."""
MAX_TOPOLOGY_ENTRIES = 32
"""Entries of ModelExpress's ``worker.topology`` (listed with every ref, so kept small)."""
MAX_TOPOLOGY_STRING_BYTES = 256
"""Each key and value of ModelExpress's ``worker.topology``."""
MAX_FOREIGN_UNKNOWN_BYTES = 4096
"""Bytes of fields ModelExpress's schema does not define in one of its requests (a newer client's
additions: kept, never listed); in ``mxref.v1`` such fields are refused."""


@dataclass(frozen=True)
class ServerLimits:
    """The metadata server's operator-tunable limits (see the constants above)."""

    max_message_bytes: int = DEFAULT_SERVER_MAX_MESSAGE_BYTES
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    max_name_bytes: int = DEFAULT_MAX_NAME_BYTES
    max_tensors: int = DEFAULT_MAX_TENSORS
    max_worker_rank: int = DEFAULT_MAX_WORKER_RANK
    publish_rate_per_s: float = DEFAULT_PUBLISH_RATE_PER_S
    publish_burst: int = DEFAULT_PUBLISH_BURST
    max_records: int = DEFAULT_MAX_RECORDS
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_store_bytes: int = DEFAULT_MAX_STORE_BYTES
    peer_publish_rate_per_s: float = DEFAULT_PEER_PUBLISH_RATE_PER_S
    peer_publish_burst: int = DEFAULT_PEER_PUBLISH_BURST
    peer_share: float = DEFAULT_PEER_SHARE
    new_peer_headroom: float = DEFAULT_NEW_PEER_HEADROOM

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_blob_bytes", "max_name_bytes", "max_tensors", "publish_burst",
                     "max_records", "max_record_bytes", "max_store_bytes", "peer_publish_burst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerLimits.{name}={value!r}: must be an integer >= 1")
        if isinstance(self.max_worker_rank, bool) or not isinstance(self.max_worker_rank, int) or not (
            0 <= self.max_worker_rank <= 0xFFFFFFFF
        ):
            raise ValueError(f"ServerLimits.max_worker_rank={self.max_worker_rank!r}: must be in 0..{0xFFFFFFFF}")
        for name in ("publish_rate_per_s", "peer_publish_rate_per_s"):
            rate = getattr(self, name)
            if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
                raise ValueError(f"ServerLimits.{name}={rate!r}: must be a finite number > 0")
        if isinstance(self.peer_share, bool) or not isinstance(self.peer_share, (int, float)) or not (
            0 < self.peer_share <= 1
        ):
            raise ValueError(f"ServerLimits.peer_share={self.peer_share!r}: must be in (0, 1]")
        headroom = self.new_peer_headroom
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
            raise ValueError(f"ServerLimits.new_peer_headroom={headroom!r}: must be in [0, 1)")
        if self.max_record_bytes > self.max_store_bytes:
            raise ValueError(f"ServerLimits.max_record_bytes={self.max_record_bytes} must not exceed "
                             f"max_store_bytes={self.max_store_bytes} (one record must fit the store)")
        if self.max_blob_bytes >= self.max_message_bytes:
            raise ValueError(
                f"ServerLimits.max_blob_bytes={self.max_blob_bytes} must be below "
                f"max_message_bytes={self.max_message_bytes} (the blob travels inside a message)"
            )


def whole_number_arg(noun: str, lo: int, hi: int | None = None, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number ``lo``..``hi`` (no upper bound when ``hi`` is None),
    refused with a message naming ``noun`` and the range."""
    span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number{' of ' + unit if unit else ''}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text!r}: {noun} must be {span}{suffix}")
        return value

    return parse
