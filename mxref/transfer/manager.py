"""The NIXL transfer manager: one agent per process, its peers, its memory, its health.

Behaviour contract: ``docs/contract.md#transfer-manager`` (ModelExpress's peer-lifecycle test).
The manager

* tracks every peer it loaded (``_remote_agents``: name -> (ip, port), or None
  for a blob-loaded peer) and disconnects each one before it drops its agent;
* disconnects a peer in two ways: ``remove_remote_agent`` (local) and, when the
  peer's listener is known, ``invalidate_local_metadata`` (tells the peer to drop
  *our* record; measured on UCX-TCP, removal alone leaves the source's stale
  record of a departed reader);
* deregisters its memory in reverse order, then drops the agent;
* registers ``shutdown`` with ``atexit`` once and unregisters it on shutdown;
* reports data-plane health: a READ that timed out or failed sets
  ``_data_plane_error``; a later completed transfer (or a completed, non-empty
  batch) clears it. NIXL 1.5.1 reports failures by *raising* from
  ``check_xfer_state``/``transfer`` rather than returning "ERR"; both count.

Every wait is bounded: ``timeout_seconds=None`` means the configured budget
(``mxref.config.transfer_timeout_seconds``), never "forever".
"""

from __future__ import annotations

import atexit
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mxref import config
from mxref.accelerators import AcceleratorBackend, CpuBackend
from mxref.audit import AuditedAgent, NixlAudit
from mxref.errors import (
    HandshakeTimeout,
    ManifestMismatchError,
    NixlUnavailable,
    ReadFailure,
    TransferFailed,
    TransferTimeout,
)
from mxref.events import NULL, EventLog
from mxref.metrics import NixlFamilies
from mxref.transfer.chunked import DONE_STATES, ERROR_STATES, ChunkPolicy, ChunkTime, Landing, ReadClock, read_chunked

logger = logging.getLogger("mxref.transfer.manager")

HANDSHAKE_POLL_S = 0.01
HANDSHAKE_REFETCH_S = 1.0  # a fetch request can be lost (dead cached socket): ask again


def import_nixl() -> Any:
    """The NIXL Python API module (``nixl._api`` or a CUDA-variant wheel's), imported lazily."""
    for name in ("nixl._api", "nixl_cu13._api", "nixl_cu12._api"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and not name.startswith(exc.name.split(".")[0]):
                raise
        except ImportError:
            continue
    raise NixlUnavailable("the nixl package is not installed (run .ci/bootstrap)")


def nixl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nixl")
    except PackageNotFoundError:
        return "unknown"


def same_dtype(a: str, b: str) -> bool:
    """Whether two dtype spellings name the same type: ModelExpress writes ``torch.float16``
    (``str(torch.float16)``), mxref ``float16``."""
    return a.removeprefix("torch.") == b.removeprefix("torch.")


@dataclass(frozen=True)
class LocalTensor:
    name: str
    addr: int
    size: int
    dtype: str
    device_id: int = 0


@dataclass
class PostedRead:
    """One in-flight READ of a batch (``post_read_batch`` -> ``await_read_batches``)."""

    handle: Any
    total_bytes: int
    num_ranges: int
    posted_at: float


@dataclass(frozen=True)
class PumpPacing:
    """How a progress pump paces an agent that has no progress thread (a source's).

    Idle, it polls every ``idle_s`` (~2 % of a core). A poll that spent more than
    ``busy_call_s`` of its thread's CPU did work: over UCX TCP an idle poll takes ~2 us, one
    that sends a READ's replies 3-10 ms (measured on a source serving 1 GiB). The pump then
    polls again at once for ``linger_s``, so a reader's next chunk is answered when it
    arrives, not after the rest of a sleep. With 1 ms sleeps alone, each window of a chunked
    READ waited for the source's next poll: 16 MiB x 2 chunks from a raw source ran at
    0.82-0.85x one handle's speed, 0.96-0.97x with this pacing (1 GiB, 5 interleaved
    rounds; NIXL's own progress thread on the source: 0.97x, spinning a core even idle).
    CPU time, not wall time, so that a poll preempted on a busy machine is not taken for
    work."""

    idle_s: float = 0.001
    busy_call_s: float = 50e-6
    linger_s: float = 0.02


class NixlTransferManager:
    def __init__(
        self,
        agent_name: str,
        device_id: int,
        accelerator_backend: AcceleratorBackend | None = None,
        *,
        events: EventLog = NULL,
        metrics: NixlFamilies | None = None,
        initial_error: str | None = None,
    ) -> None:
        """``initial_error`` carries a data-plane failure over from a manager this
        one replaces (a reader's rollback), so health stays down until a transfer
        succeeds rather than resetting with the new agent."""
        self.agent_name = agent_name
        self.device_id = device_id
        self._accelerator: AcceleratorBackend = accelerator_backend or CpuBackend()
        self._events = events
        self._metrics = metrics
        self.audit = NixlAudit(metrics)  # what the agent made and gave back (mxref.audit)
        self._agent: Any = None
        self._metadata: bytes = b""
        self._remote_agents: dict[str, tuple[str, int] | None] = {}
        self._registered_memory: list[Any] = []
        self._local_tensors: dict[str, LocalTensor] = {}
        self._data_plane_error: str | None = initial_error
        self._atexit_registered = False
        self._listen_port: int | None = None
        self._pump_stop = threading.Event()
        self._pump: threading.Thread | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ agent
    def create_agent(self, listen_port: int, progress_thread: bool) -> None:
        """Create the NIXL agent with a metadata listener on ``listen_port``.

        ``progress_thread=False`` leaves progress to whoever polls: a reader's tight
        ``check_xfer_state`` loop (the fastest READ over TCP), or ``start_progress_pump``
        on a process that must serve READs.
        """
        api = import_nixl()
        conf = api.nixl_agent_config(
            enable_prog_thread=progress_thread,
            enable_listen_thread=True,
            listen_port=listen_port,
            backends=["UCX"],
        )
        self._agent = AuditedAgent(api.nixl_agent(self.agent_name, conf), self.audit)
        self._listen_port = listen_port
        self._metadata = self._agent.get_agent_metadata()
        self._register_atexit()
        self._set_health_gauge()

    def create_agent_on_free_port(self, progress_thread: bool, attempts: int = 3) -> int:
        """``create_agent`` on a port nobody listens on; returns the port. Choosing a free port
        and binding it are two steps (NIXL's listener cannot bind port 0), so another process
        may take it in between: then it tries again on another port, ``attempts`` times in all."""
        from mxref.process import free_port

        for attempt in range(1, attempts + 1):
            port = free_port()
            try:
                self.create_agent(port, progress_thread)
                return port
            except Exception as exc:
                if attempt == attempts:
                    raise
                logger.warning("NIXL agent on port %d failed (%s: %s); trying another port", port, type(exc).__name__, exc)
        raise AssertionError("unreachable")

    @property
    def listen_port(self) -> int | None:
        return self._listen_port

    def register_tensors(self, tensors: Sequence[LocalTensor]) -> None:
        """Register each tensor as its own region, then refresh our metadata blob."""
        if self._agent is None:
            raise RuntimeError("register_tensors needs an agent (create_agent first)")
        descs = np.array([(t.addr, t.size, t.device_id) for t in tensors], dtype=np.uint64)
        reg = self._agent.register_memory(descs, self._accelerator.mem_type)
        self._registered_memory.append(reg)
        for t in tensors:
            self._local_tensors[t.name] = t
        self._metadata = self._agent.get_agent_metadata()
        if self._metrics is not None:
            self._metrics.registered_bytes.set(sum(t.size for t in self._local_tensors.values()))

    def start_progress_pump(self, pacing: PumpPacing | None = None) -> None:
        """Drive the agent's progress from a thread (for an agent created without one), paced
        by ``pacing`` (``PumpPacing``: slow while idle, at once while serving)."""
        if self._pump is not None:
            return
        pace = pacing or PumpPacing()

        def pump() -> None:
            busy_until = 0.0
            while True:
                agent = self._agent
                if agent is None:
                    return
                cpu = time.thread_time()
                try:
                    agent.get_new_notifs()
                except Exception as exc:  # noqa: BLE001 - keep serving; a peer's failure is not ours
                    logger.debug("progress pump: %s", exc)
                now = time.monotonic()
                if time.thread_time() - cpu > pace.busy_call_s:
                    busy_until = now + pace.linger_s
                if now < busy_until:
                    if self._pump_stop.is_set():
                        return
                    time.sleep(0)  # let other threads have the GIL, then poll again
                elif self._pump_stop.wait(pace.idle_s):
                    return

        self._pump = threading.Thread(target=pump, name="nixl-progress", daemon=True)
        self._pump.start()

    def _stop_pump(self) -> None:
        self._pump_stop.set()
        if self._pump is not None:
            self._pump.join(timeout=2.0)
            self._pump = None

    # ------------------------------------------------------------------ peers
    def fetch_remote_and_wait(
        self,
        remote_agent_name: str,
        ip: str,
        port: int,
        timeout_seconds: float = config.DEFAULT_HANDSHAKE_TIMEOUT_S,
    ) -> None:
        """Ask the peer's listener for its metadata and wait (bounded) until it is loaded.

        The request is re-sent every second: one sent over a cached socket to a
        restarted peer is silently lost. The peer is tracked only once loaded.
        """
        agent = self._require_agent()
        deadline = time.monotonic() + timeout_seconds
        next_fetch = 0.0
        while True:
            now = time.monotonic()
            if now >= next_fetch:
                agent.fetch_remote_metadata(remote_agent_name, ip, port)
                next_fetch = now + HANDSHAKE_REFETCH_S
            if agent.check_remote_metadata(remote_agent_name):
                with self._lock:
                    self._remote_agents[remote_agent_name] = (ip, port)
                    self._count_peers()
                return
            if now >= deadline:
                raise HandshakeTimeout(
                    f"NIXL metadata of {remote_agent_name!r} from {ip}:{port} did not arrive "
                    f"within {timeout_seconds:.1f}s"
                )
            time.sleep(min(HANDSHAKE_POLL_S, max(0.0, deadline - now)))

    def add_remote_agent(self, metadata: bytes) -> str:
        """Load a peer from its metadata blob (centralized mode); tracked without an endpoint."""
        added: str | bytes = self._require_agent().add_remote_agent(metadata)
        name = added.decode() if isinstance(added, bytes) else added
        with self._lock:
            self._remote_agents[name] = None
            self._count_peers()
        return name

    def push_local_metadata(self, name: str, ip: str, port: int) -> None:
        """Send our metadata to peer ``name``'s listener (NIXLCOMM:LOAD), so the peer holds a
        NIXL endpoint for us with peer error handling. The peer is then tracked with that
        endpoint, so removing it also invalidates our record there."""
        self._require_agent().send_local_metadata(ip, port)
        with self._lock:
            if name in self._remote_agents:
                self._remote_agents[name] = (ip, port)

    def remove_remote_agent(self, name: str) -> bool:
        """Disconnect one peer. True when NIXL accepted the removal (again is harmless)."""
        agent = self._agent
        if agent is None:
            return False
        with self._lock:
            endpoint = self._remote_agents.pop(name, None)
            self._count_peers()
        ok = True
        try:
            agent.remove_remote_agent(name)
        except Exception as exc:  # noqa: BLE001 - best-effort release; reported in peer_disconnected
            ok = False
            logger.warning("remove_remote_agent(%s) failed: %s", name, exc)
        invalidated = False
        if endpoint is not None and hasattr(agent, "invalidate_local_metadata"):
            try:
                agent.invalidate_local_metadata(endpoint[0], endpoint[1])
                invalidated = True
            except Exception as exc:  # noqa: BLE001 - best-effort release; reported in peer_disconnected
                logger.warning("invalidate_local_metadata(%s:%s) failed: %s", endpoint[0], endpoint[1], exc)
        self._events.emit("peer_disconnected", agent_name=name, ok=ok, invalidated=invalidated)
        return ok

    def disconnect_remote_agents(self) -> int:
        """Disconnect every tracked peer; returns how many were tracked."""
        if self._agent is None:
            return 0
        with self._lock:
            names = list(self._remote_agents)
        for name in names:
            self.remove_remote_agent(name)
        return len(names)

    def _count_peers(self) -> None:
        if self._metrics is not None:
            self._metrics.peers.set(len(self._remote_agents))

    # --------------------------------------------------------------- transfer
    def receive_from_source(
        self,
        source_metadata: bytes,
        source_tensors: Sequence[Any],
        timeout_seconds: float | None = None,
        remote_agent_name: str | None = None,
        require_exact_match: bool = False,
        chunks: ChunkPolicy | None = None,
        on_suspect: Callable[[], None] | None = None,
        landing: Landing | None = None,
        trace: list[ChunkTime] | None = None,
        clock: ReadClock | None = None,
    ) -> tuple[int, int, str]:
        """READ the source's tensors into ours (matched by name), bounded by the budget.

        One transfer handle (docs/contract.md#read-budget), or with ``chunks`` a window of chunk handles with a
        stall deadline (``ChunkPolicy``; ``on_suspect``, ``landing``, ``trace``, ``clock``: see ``read_chunked``). Returns ``(bytes, tensors, result)`` with result
        complete|partial|empty. Raises ManifestMismatchError (sizes/dtypes, or names under
        exact match), TransferTimeout (TransferStalled for a stalled window) or TransferFailed.
        """
        self._accelerator.set_device(self.device_id)
        if remote_agent_name is None:
            remote_agent_name = self.add_remote_agent(source_metadata)
        budget = config.transfer_timeout_seconds() if timeout_seconds is None else timeout_seconds
        pairs = self._match(source_tensors, require_exact_match)
        if not pairs:
            self._count_receive("empty")
            return 0, 0, "empty"
        partial = len(pairs) != len(self._local_tensors) or len(pairs) != len(source_tensors)
        agent = self._require_agent()
        mem = self._accelerator.mem_type
        if chunks is not None:
            ranges = [((t.addr, t.size, t.device_id), (int(s.addr), int(s.size), int(s.device_id))) for t, s in pairs]
            try:
                read_chunked(agent, mem, chunks.split(ranges), remote_agent_name, budget, chunks,
                             on_suspect, landing, trace, clock)
            except (TransferTimeout, TransferFailed) as exc:
                self._record_failure(str(exc), exc.failure)
                raise
            self._clear_failure()
            self._accelerator.synchronize()
            total = sum(t.size for t, _ in pairs)
            result = "partial" if partial else "complete"
            self._count_receive(result)
            return total, len(pairs), result
        local = np.array([(t.addr, t.size, t.device_id) for t, _ in pairs], dtype=np.uint64)
        remote = np.array([(int(s.addr), int(s.size), int(s.device_id)) for _, s in pairs], dtype=np.uint64)
        try:
            handle = agent.initialize_xfer(
                "READ", agent.get_xfer_descs(local, mem), agent.get_xfer_descs(remote, mem), remote_agent_name
            )
        except Exception as exc:
            self._record_failure(f"READ could not be prepared: {type(exc).__name__}: {exc}", ReadFailure.FAILED)
            raise TransferFailed(self._data_plane_error) from exc
        try:
            try:
                state = agent.transfer(handle)
            except Exception as exc:
                self._record_failure(f"READ failed at post: {type(exc).__name__}: {exc}", ReadFailure.FAILED)
                raise TransferFailed(self._data_plane_error) from exc
            if state in ERROR_STATES:
                self._record_failure(f"READ failed at post: NIXL state {state}", ReadFailure.FAILED)
                raise TransferFailed(self._data_plane_error)
            self._wait_for_xfer(handle, budget, "READ")
        finally:
            try:
                agent.release_xfer_handle(handle)
            except Exception as exc:  # noqa: BLE001 - a failed release must not hide the transfer's outcome
                logger.warning("release_xfer_handle failed: %s", exc)
        self._accelerator.synchronize()
        total = sum(t.size for t, _ in pairs)
        result = "partial" if partial else "complete"
        self._count_receive(result)
        return total, len(pairs), result

    def _match(self, source_tensors: Sequence[Any], exact: bool) -> list[tuple[LocalTensor, Any]]:
        by_name = {s.name: s for s in source_tensors}
        local_only = sorted(set(self._local_tensors) - set(by_name))
        remote_only = sorted(set(by_name) - set(self._local_tensors))
        if exact and (local_only or remote_only):
            self._count_receive("rejected")
            raise ManifestMismatchError(
                f"tensor catalogs differ (local only: {local_only[:5]}, source only: {remote_only[:5]})"
            )
        pairs = []
        for name, mine in self._local_tensors.items():
            theirs = by_name.get(name)
            if theirs is None:
                continue
            if int(theirs.size) != mine.size or (theirs.dtype and mine.dtype and not same_dtype(theirs.dtype, mine.dtype)):
                self._count_receive("rejected")
                raise ManifestMismatchError(
                    f"tensor {name!r}: source has {theirs.size} B {theirs.dtype}, we have {mine.size} B {mine.dtype}"
                )
            pairs.append((mine, theirs))
        if exact and not pairs:
            self._count_receive("rejected")
            raise ManifestMismatchError("no tensor in common with the source")
        return pairs

    def post_read_batch(self, local: Iterable[LocalTensor], remote: Iterable[Any], remote_agent_name: str) -> PostedRead:
        """Post one READ of several ranges and return without waiting."""
        agent = self._require_agent()
        mem = self._accelerator.mem_type
        lt, rt = list(local), list(remote)
        ldescs = np.array([(t.addr, t.size, t.device_id) for t in lt], dtype=np.uint64)
        rdescs = np.array([(int(r.addr), int(r.size), int(r.device_id)) for r in rt], dtype=np.uint64)
        handle = agent.initialize_xfer(
            "READ", agent.get_xfer_descs(ldescs, mem), agent.get_xfer_descs(rdescs, mem), remote_agent_name
        )
        agent.transfer(handle)
        return PostedRead(handle, sum(t.size for t in lt), len(lt), time.perf_counter())

    def await_read_batches(self, posted: Sequence[Any], timeout_seconds: float | None = None) -> int:
        """Wait for every posted READ (one budget for the set), release them all; returns bytes."""
        if not posted:
            return 0
        budget = config.transfer_timeout_seconds() if timeout_seconds is None else timeout_seconds
        agent = self._require_agent()
        try:
            self._wait_for_xfers([p.handle for p in posted], budget, "READ batch")
        finally:
            for p in posted:
                try:
                    agent.release_xfer_handle(p.handle)
                except Exception as exc:  # noqa: BLE001 - a failed release must not hide the transfer's outcome
                    logger.warning("release_xfer_handle failed: %s", exc)
        self._accelerator.synchronize()
        return sum(p.total_bytes for p in posted)

    # ------------------------------------------------------------------ waits
    def _wait_for_xfer(self, handle: Any, timeout_s: float, label: str) -> None:
        """Poll one transfer until DONE (clears health), an error, or the deadline (sets health)."""
        self._wait_for_xfers([handle], timeout_s, label)

    def _wait_for_xfers(self, handles: Sequence[Any], timeout_s: float, label: str) -> None:
        """Poll a set of transfers; health is cleared only when the whole non-empty set completed."""
        if not handles:
            return
        agent = self._require_agent()
        pending = list(handles)
        start = time.monotonic()
        deadline = start + timeout_s
        while pending:
            still = []
            for handle in pending:
                try:
                    state = agent.check_xfer_state(handle)
                except Exception as exc:
                    self._record_failure(
                        f"{label} failed: NIXL raised {type(exc).__name__}: {exc}", ReadFailure.FAILED
                    )
                    raise TransferFailed(self._data_plane_error) from exc
                if state in DONE_STATES:
                    continue
                if state in ERROR_STATES:
                    self._record_failure(f"{label} failed: NIXL state {state}", ReadFailure.FAILED)
                    raise TransferFailed(self._data_plane_error)
                still.append(handle)
            pending = still
            if pending and time.monotonic() >= deadline:
                self._record_failure(
                    f"{label} timed out after {timeout_s:.3f}s with no completion and no error status from NIXL "
                    f"({len(pending)} of {len(handles)} pending)",
                    ReadFailure.TIMED_OUT,
                )
                raise TransferTimeout(self._data_plane_error)
            # Tight poll: with the reader's progress thread off, this loop is what
            # moves the bytes (about 1.5x faster than a progress thread over TCP).
        self._clear_failure()

    # ----------------------------------------------------------------- health
    @property
    def data_plane_error(self) -> str | None:
        return self._data_plane_error

    def carry_error(self, error: str | None) -> None:
        """Take over a data-plane failure of a manager this one replaces, when this one has seen
        none (a target prepared before the failure it replaces): health stays down until a
        transfer succeeds, as with ``initial_error``."""
        with self._lock:
            if error is not None and self._data_plane_error is None:
                self._data_plane_error = error

    def is_healthy(self) -> bool:
        return self._agent is not None and bool(self._metadata) and self._data_plane_error is None

    def _record_failure(self, message: str, failure: ReadFailure) -> None:
        self._data_plane_error = message
        if self._metrics is not None:
            self._metrics.data_plane_errors.labels(failure.metric_kind).inc()
        self._report_health()

    def _clear_failure(self) -> None:
        if self._data_plane_error is not None:
            self._data_plane_error = None
            self._report_health()

    def _report_health(self) -> None:
        """Publish a health transition (event + gauge); called when a transfer sets or clears it."""
        self._set_health_gauge()
        self._events.emit("health", healthy=self.is_healthy(), error=self._data_plane_error)

    def _set_health_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.data_plane_healthy.set(1 if self.is_healthy() else 0)

    def _count_receive(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.receives.labels(result).inc()

    # --------------------------------------------------------------- teardown
    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.shutdown)
            self._atexit_registered = True

    def shutdown(self) -> None:
        """Disconnect every peer, deregister memory in reverse, then drop the agent. Never raises."""
        if self._atexit_registered:
            atexit.unregister(self.shutdown)
            self._atexit_registered = False
        self._stop_pump()
        agent = self._agent
        if agent is not None:
            try:
                count = self.disconnect_remote_agents()
                self._events.emit("shutdown_step", step="disconnect_peers", ok=True, detail=count)
            except Exception as exc:  # noqa: BLE001 - shutdown never raises (remove_remote_agent already swallows)
                logger.warning("disconnecting peers failed: %s", exc)
            for reg in reversed(self._registered_memory):
                try:
                    agent.deregister_memory(reg)
                except Exception as exc:  # noqa: BLE001 - shutdown never raises; deregister the rest
                    logger.warning("deregister_memory failed: %s", exc)
            if self._registered_memory:
                self._events.emit("shutdown_step", step="deregister", ok=True, detail=len(self._registered_memory))
        if agent is not None:  # what the drop would release unseen: a leak (mxref.audit)
            self._events.emit("nixl_audit", agent_name=self.agent_name, **self.audit.balance())
        self._registered_memory = []
        self._local_tensors = {}
        self._remote_agents = {}
        self._metadata = b""
        self._agent = None
        if agent is not None:
            self._events.emit("shutdown_step", step="drop_agent", ok=True, detail=self.agent_name)
            del agent

    @property
    def agent(self) -> Any:
        """The audited NIXL agent (``mxref.audit.AuditedAgent``), or None before ``create_agent`` and after ``shutdown``."""
        return self._agent

    def _require_agent(self) -> Any:
        if self._agent is None:
            raise RuntimeError("NIXL agent not created")
        return self._agent
