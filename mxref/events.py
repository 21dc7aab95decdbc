"""Lifecycle events: one JSON object per line, written with one ``write(2)`` each.

Every mxref process appends to its events file (``--events PATH`` or
``MXREF_EVENTS``) as things happen. Each line is written with a single unbuffered
``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL loses nothing already
emitted and lines from threads never interleave.

Schema (every line)::

    {"event": "<name>",          # one of EVENT_NAMES
     "ts": 1764500000.123,       # wall clock, unix seconds
     "mono": 81234.567,          # time.monotonic(): CLOCK_MONOTONIC, shared by every
                                 # process on the host, so the harness merges on it
     "proc": "reader-1",         # the name the process was given (--name)
     "role": "reader",           # server | source | reader | demo | prepare
     "pid": 1234,
     ...event fields...}

``EVENTS`` is the machine-readable schema: per event, its fields and, for a field
with a fixed set of values (a status, an outcome), those values. The harness
validates scenario ``where:`` clauses against it; a unit test keeps it in step with
the ``emit`` calls. ``EVENT_NAMES`` is the same as one line per event (docs/mxref.md has
the same table for readers of the files).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMMON_FIELDS", "EVENTS", "EVENT_NAMES", "NULL", "EventLog", "EventSpec", "SOURCE_STATUSES", "log_to_stderr"]

# the metadata server's SourceStatus enum, without its SOURCE_STATUS_ prefix
SOURCE_STATUSES = ("UNKNOWN", "INITIALIZING", "READY", "STALE")
MODES = ("p2p", "central")


@dataclass(frozen=True)
class EventSpec:
    """One event: ``fields`` maps each field it carries to its allowed values (``None``: any value)."""

    fields: Mapping[str, tuple[str, ...] | None]
    extra: Mapping[str, str] = field(default_factory=dict)  # field -> a note for the table

    def describe(self) -> str:
        parts = []
        for name, allowed in self.fields.items():
            note = f" ({'|'.join(allowed)})" if allowed else (f" ({self.extra[name]})" if name in self.extra else "")
            parts.append(name + note)
        return ", ".join(parts)


def _ev(*names: str, notes: Mapping[str, str] | None = None, **enums: tuple[str, ...]) -> EventSpec:
    fields: dict[str, tuple[str, ...] | None] = {name: None for name in names}
    fields.update(enums)
    return EventSpec(fields, dict(notes or {}))


# Fields of every record that a harness ``where`` may also test (the runner keeps these and
# adds ``incarnation``; event, ts, mono, proc and role are not event fields).
COMMON_FIELDS = ("pid", "incarnation")
# the NIXL resource audit's counts on a failed READ's events (mxref.audit.NixlAudit.open_fields)
AUDIT_OPEN = ("handles_open", "dlists_open", "registrations_open", "remote_agents_open")

EVENTS: dict[str, EventSpec] = {
    "started": _ev("argv", "version", "env", "timers", notes={"env": "UCX_* / MX_*", "timers": "server"}),
    "listening": _ev("port", "endpoint", what=("grpc", "metrics", "worker_grpc", "nixl_listener", "redis"),
                     grpc_impl=("grpcio", "native"), notes={"grpc_impl": "the metadata server's grpc"}),
    "store": _ev("url", "reachable", notes={"url": "server: memory or redis://HOST:PORT[/DB]"}),
    "agent_ready": _ev("agent_name", "listen_port", "backend", "mem_type", "regions", "bytes"),
    "published": _ev("mx_source_id", "worker_id", mode=MODES),
    "status_change": _ev("reason", status=SOURCE_STATUSES, previous=SOURCE_STATUSES),
    "heartbeat": _ev("ok", "message", status=SOURCE_STATUSES),
    "health": _ev("healthy", "error", notes={"healthy": "bool"}),
    "candidates": _ev("listed", "rank_matched", "accelerator_matched", "selector", "order", "error", "topology_matched",
                      notes={"order": "[worker_id]", "error": "listing failed",
                             "topology_matched": "ModelExpress 0.8 with a topology domain: candidates in it"}),
    # reader (ModelExpress 0.8): its topology domain is required and this node's value unknown: nothing listed
    "topology_blocked": _ev("domain"),
    # source (ModelExpress's worker server): a manifest answered to a reader, the step before any READ of it
    "manifest_served": _ev("method", "tensors"),
    "attempt_start": _ev("index", "mx_source_id", "worker_id"),
    "handshake": _ev("index", "agent_name", "seconds", "ok", "error", "pushed", mode=MODES,
                     notes={"pushed": "our metadata sent to the source"}),
    "transfer_start": _ev("index", "agent_name", "bytes", "tensors", "timeout_s", "lease_id", "chunk_bytes", "stall_s",
                          "first_stall_s",
                          notes={"stall_s": "chunked READ: deadline of a full window",
                                 "first_stall_s": "chunked READ: deadline of its first window (the ramp holds less)"}),
    "transfer_done": _ev("index", "bytes", "seconds", "gbps", "hashing_s", "read_phases", "window", "chunk_ms",
                         notes={"hashing_s": "of seconds, hashing landed tensors between polls (null: none)",
                                "read_phases": "chunked READ: seconds per phase, polls and posts (transfer.chunked.ReadClock; null: one handle)",
                                "window": "chunked READ: where its window idled (transfer.chunked.window_idle; null: one handle)",
                                "chunk_ms": "chunked READ: [bytes, posted, done] of each chunk, ms from the READ's start"}),
    "transfer_timeout": _ev("index", "seconds", "budget_s", "stalled", "chunks_done", "read_phases", "error", *AUDIT_OPEN,
                            notes={"stalled": "chunked READ: no progress within stall_s",
                                   "read_phases": "chunked READ: where its seconds went up to the stall or budget (as transfer_done's)",
                                   "chunks_done": "a stall: the chunks completed before it (0: it stalled before any progress)",
                                   "handles_open": "the attempt's agent: made and not released (mxref.audit)"}),
    "transfer_error": _ev("index", "seconds", "error", *AUDIT_OPEN),
    # a NIXL agent dropped: its resources made, released and still open (a leak the drop hid)
    "nixl_audit": _ev("agent_name", "made", "released", "open", "balanced",
                      notes={"open": "{handles|dlists|registrations|remote_agents: made - released}"}),
    # reader, the late-write guard: which memory an attempt reads into (fresh: newly allocated and
    # registered with a fresh agent; parked: regions set aside), and a stalled attempt's memory set aside
    "target_region": _ev("index", "agent_name", "addr", "bytes", "fresh", "parked"),
    "region_parked": _ev("index", "addr", "bytes", "parked"),
    # reader: a READ quiet for half its stall deadline gets the next attempt's target prepared beside it
    "target_prestart": _ev("index", "reason"),
    "attempt_outcome": _ev("index", "worker_id", "error", "seconds",
                           outcome=("success", "metadata_miss", "reference_mismatch", "transfer_retry",
                                    "transfer_fallback", "integrity_mismatch", "lease_refused", "skipped"),
                           notes={"outcome": "reference_mismatch: manifest disagrees with the reference, "
                                             "never read; integrity_mismatch: the bytes READ are not the reference's"}),
    "peer_disconnected": _ev("agent_name", "ok", "invalidated"),
    "integrity": _ev("ok", "tensors", "bad", "hashed_during_read",
                     notes={"bad": "[names] differing from the reference",
                            "hashed_during_read": "tensors whose checksum was taken as the chunked READ landed them"}),
    # the content reference this process holds a model to (source, reader; see mxref.model.Reference)
    "reference": _ev("digest", "tensors", "pinned", "held_digest", "manifest",
                     origin=("spec", "recorded", "hashed"),
                     notes={"pinned": "--expect-digest given", "held_digest": "source: what it holds",
                            "manifest": "source: held | reference (checksums it publishes)"}),
    # a source checking the file it serves against the checksums recorded in it
    "content_check": _ev("path", "ok", "tensors", "bad", "error", notes={"bad": "[names]"}),
    # reader: what its memory holds (re-hashed), after the load, after --settle-s, before release
    "memory_digest": _ev("digest", "checksums", when=("loaded", "settled", "exit"),
                         notes={"checksums": "{name: xxh3-64 hex}"}),
    # --debug-hooks: SIGUSR2 toggled the corruption of the registered memory
    "debug_corrupt": _ev("corrupted", "tensors", "addrs", notes={"corrupted": "bool", "addrs": "where byte 0 of each tensor is"},
                         memory=("host", "device")),
    # --debug-leak (a looping reader): the leak planted after a load, and how many so far
    "debug_leak": _ev("leaked", kind=("fd", "registration")),
    "duplicate_registration": _ev("baseline", "registered", "after", "balanced", "bytes", "register_first",
                                  "register_second", "deregister_1", "deregister_2",
                                  notes={"balanced": "bool: after == baseline", "register_first": "ok | error: ..."}),
    # reader with --lease: a tensor read lease per attempt (mxref.roles.lease)
    "lease_acquired": _ev("index", "lease_id", "mx_source_id", "worker_id"),
    "lease_released": _ev("index", "lease_id", "ok", "error", notes={"ok": "false: the source did not take it back"}),
    "lease_refused": _ev("index", "mx_source_id", "worker_id", "code", "error", notes={"code": "gRPC status name"}),
    # source: the tensor read leases it grants, and a refit's drain (SIGHUP with --debug-hooks)
    "lease_granted": _ev("lease_id", "lifetime_s"),
    "lease_returned": _ev("lease_id"),
    "lease_expired": _ev("lease_id"),
    "drain_started": _ev("timeout_s", "live", "generation"),
    "drain_done": _ev("waited_s", "outstanding", "released", "expired",
                      notes={"outstanding": "leases live when the drain began",
                             "expired": "of those, leases that ran out while it waited"}),
    "drain_timed_out": _ev("timeout_s", "waited_s", "live"),
    "refit": _ev("generation", "tensors", "seconds"),
    # source with --grow-tensors: a refit that adds tensors (registered first) and republishes the grown manifest
    "manifest_grown": _ev("generation", "tensors", "added", "mx_source_id"),
    # reader with --accept-growth: a manifest holding the reference's tensors and more, adopted for this attempt
    "reference_grown": _ev("index", "tensors", "added", "digest"),
    "fallback": _ev("reason", "checkpoint"),
    "load_done": _ev("source", "worker_id", "bytes", "seconds", "gbps", "integrity", "attempts", "phases",
                     path=("rdma", "disk"), notes={"phases": "{load_phase: seconds the load spent in it}"}),
    # reader: where a load's time went, one event per phase (per attempt where it has an index);
    # overlapped: it ran beside the control-plane calls (the prestarted target), not on the load's path
    "load_phase": _ev("index", "seconds", "ok", "overlapped",
                      phase=("warmup", "list", "metadata", "wait_target", "allocate", "warmup_wait", "agent",
                             "register", "handshake",
                             "read", "release", "verify", "fallback", "settle")),
    "load_failed": _ev("error"),
    "signal": _ev("signum", "name"),
    "shutdown_step": _ev("ok", "detail", step=("mark_stale", "stop_heartbeat", "stop_worker_server",
                                                "disconnect_peers", "deregister", "drop_agent", "stop_server")),
    "exit": _ev("code", "error", "simulated"),
    # metadata server
    "source_published": _ev("mx_source_id", "worker_id", "worker_rank", status=SOURCE_STATUSES),
    "source_status": _ev("mx_source_id", "worker_id", status=SOURCE_STATUSES, previous=SOURCE_STATUSES,
                         by=("rpc", "reaper")),
    "source_deleted": _ev("mx_source_id", "worker_id", by=("reaper",)),
    "unauthenticated": _ev("method", "peer", "count", reason=("missing_token", "wrong_token"),
                           notes={"peer": "address without port", "count": "refusals since the last line of this "
                                  "peer, method and reason (one line a second at most)"}),
    # demo
    "raw_read": _ev("bytes", "seconds", "gbps"),
}

# name -> the fields it carries, one line (documentation; the names guard against typos)
EVENT_NAMES: dict[str, str] = {name: spec.describe() for name, spec in EVENTS.items()}


class EventLog:
    """Append-only JSON-lines event writer. ``path=None`` writes nowhere."""

    def __init__(self, path: str | os.PathLike[str] | None, proc: str, role: str) -> None:
        self.proc = proc
        self.role = role
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._fd: int | None = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        if event not in EVENT_NAMES:
            raise ValueError(f"unknown event name {event!r} (known: {', '.join(EVENT_NAMES)})")
        record: dict[str, Any] = {
            "event": event,
            "ts": round(time.time(), 6),
            "mono": round(time.monotonic(), 6),
            "proc": self.proc,
            "role": self.role,
            "pid": self.pid,
        }
        record.update(fields)
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is not None:
                os.write(self._fd, line)
        return record

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


NULL = EventLog(None, proc="-", role="-")


def log_to_stderr(record: dict[str, Any]) -> None:
    """Human line for a process log (the harness captures stderr to the process log)."""
    fields = {k: v for k, v in record.items() if k not in ("event", "ts", "mono", "proc", "role", "pid")}
    print(f"[{record['proc']}] {record['event']} {json.dumps(fields, default=str)}", file=sys.stderr, flush=True)
