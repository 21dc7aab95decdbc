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

The event names and their fields are listed in ``EVENT_NAMES``; README.md has
the same table for readers of the files.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

# name -> the fields it carries (documentation and a guard against typos)
EVENT_NAMES: dict[str, str] = {
    "started": "argv, version, nixl_version, transport, env (UCX_* / MX_*)",
    "listening": "what (grpc|metrics|worker_grpc|nixl_listener), port, endpoint",
    "agent_ready": "agent_name, listen_port, backend, mem_type, regions, bytes",
    "published": "mx_source_id, worker_id, mode (p2p|central)",
    "status_change": "status (READY|STALE|...), previous, reason",
    "heartbeat": "status, ok, message",
    "health": "healthy (bool), error",
    "candidates": "listed, rank_matched, accelerator_matched, selector, order [worker_id]",
    "attempt_start": "index, mx_source_id, worker_id",
    "handshake": "index, mode (p2p|central), agent_name, seconds, ok, error, pushed (our metadata sent to the source)",
    "transfer_start": "index, agent_name, bytes, tensors, timeout_s, chunk_bytes, stall_s (chunked READ)",
    "transfer_done": "index, bytes, seconds, gbps",
    "transfer_timeout": "index, seconds, budget_s, stalled (chunked READ: no progress within stall_s)",
    "transfer_error": "index, seconds, error",
    "attempt_outcome": "index, worker_id, outcome (success|metadata_miss|transfer_retry|transfer_fallback|skipped), error",
    "peer_disconnected": "agent_name, ok, invalidated",
    "integrity": "ok, tensors, bad [names]",
    "fallback": "reason, checkpoint",
    "load_done": "path (rdma|disk), source, worker_id, bytes, seconds, gbps, integrity",
    "load_failed": "error",
    "signal": "signum, name",
    "shutdown_step": "step (mark_stale|stop_heartbeat|stop_worker_server|disconnect_peers|invalidate|deregister|drop_agent|stop_server), ok, detail",
    "exit": "code",
    # metadata server
    "source_published": "mx_source_id, worker_id, worker_rank, status",
    "source_status": "mx_source_id, worker_id, status, previous, by (rpc|reaper)",
    "source_deleted": "mx_source_id, worker_id, by (reaper)",
    # demo
    "raw_read": "bytes, seconds, gbps",
}


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
