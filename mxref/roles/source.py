"""A weight source: holds a model in registered memory and advertises it.

``SourceService`` is what turns any process holding registered tensors into a
source (``python -m mxref source``, and a reader with ``--serve-after-load``):

1. start the WorkerService (P2P mode) before publishing: until then every
   manifest request is refused;
2. ``Publisher``: publish (3 tries, 1 s then 2 s backoff, on UNAVAILABLE or
   DEADLINE_EXCEEDED), then ``UpdateStatus(READY)`` and a READY heartbeat every
   interval, gated on ``manager.is_healthy()``: unhealthy after having been READY
   sends STALE once; healthy again sends READY. Two rejected heartbeats in a row
   (a wiped store) drop the registration and publish again. ``ready_delay_s``
   simulates an engine that is still warming up after its weights are registered
   (ModelExpress #520): the record is published INITIALIZING at once, but the source
   reports healthy, and so READY, only that long after it was built (``warming_gate``);
3. teardown (SIGTERM/SIGINT or end of serving), in this order: stop the
   heartbeat, mark STALE, stop the WorkerService, then the manager's shutdown
   (disconnect peers, deregister memory in reverse, drop the agent).

Tensor read leases (ModelExpress's ``PrepareTensorRead``/``ReleaseTensorRead``,
``mxref.modelexpress.worker``) live ``lease_seconds`` (default ModelExpress's rule,
``lease_seconds()``); each is an event (``lease_granted``, ``lease_returned``, ``lease_expired``).
``refit(mutate)`` is a donor's weight update (RL refit): drain the leases, bounded by
``drain_timeout_s`` (default: one lease lifetime and a second, so the lease of a holder that
vanished has expired by then), write the weights (``mutate``), count a generation and admit leases
again; a drain that times out re-opens admission and writes nothing (``drain_timed_out``).
``grow(arena, checksums)`` is the write of a refit that adds tensors (``--grow-tensors``, ModelExpress
0.8's manifest that grows after publishing): their memory is registered first, then the manifest is
swapped whole for the grown one and republished under the same identity (``manifest_grown``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mxref import __version__, config
from mxref.errors import MetadataServerError
from mxref.events import EventLog
from mxref.metrics import SourceFamilies
from mxref.model import Arena
from mxref.modelexpress.worker import DrainTimeout, Leases, MxWorkerService, lease_seconds
from mxref.roles.client import MxClient
from mxref.rpc import endpoint
from mxref.transfer.manager import NixlTransferManager
from mxref.v1 import p2p_pb2
from mxref.worker_service import WorkerManifest, WorkerServicer, start_worker_server

logger = logging.getLogger("mxref.roles.source")

STATUS_NAMES = {v: k.removeprefix("SOURCE_STATUS_") for k, v in p2p_pb2.SourceStatus.items()}
PUBLISH_BACKOFF_S = (1.0, 2.0)
# Teardown must finish well inside a typical 30 s termination grace period even when
# the metadata server does not answer: the last STALE gets this long, and so does
# the wait for a heartbeat already in flight.
SHUTDOWN_RPC_TIMEOUT_S = 2.0
REJECTIONS_BEFORE_REPUBLISH = 2
DRAIN_MARGIN_S = 1.0


def identity_for(model_name: str, dtype: str, tp: int = 1, revision: str = "",
                 mx_version: str | None = None) -> p2p_pb2.SourceIdentity:
    """The identity a source publishes and a reader lists by. ``revision`` carries the model's
    content reference digest (``mxref.model.Reference.digest``), so a reader only matches
    sources that claim the content it expects. ``mx_version`` (default: this mxref's version)
    is part of the source's id, as ModelExpress hashes its client version into it: a source
    and a reader of different versions (a rolling upgrade) never see each other."""
    return p2p_pb2.SourceIdentity(
        mx_version=mx_version or __version__, mx_source_type=p2p_pb2.WEIGHTS, model_name=model_name,
        backend_framework=p2p_pb2.VLLM, tensor_parallel_size=tp, pipeline_parallel_size=1,
        expert_parallel_size=0, dtype=dtype, revision=revision,
    )


def tensor_descriptors(arena: Arena, checksums: list[str], device_id: int = 0) -> list[p2p_pb2.TensorDescriptor]:
    return [
        p2p_pb2.TensorDescriptor(
            name=s.name, addr=addr, size=size, device_id=device_id, dtype=s.dtype,
            checksum=sum_, shape=list(s.shape),
        )
        for s, (addr, size), sum_ in zip(arena.specs, arena.regions(), checksums)
    ]


class ControlPlane(Protocol):
    """What a ``Publisher`` needs of the metadata server (``MxClient`` is one)."""

    def publish_metadata(
        self, identity: p2p_pb2.SourceIdentity, worker: p2p_pb2.WorkerMetadata, worker_id: str
    ) -> p2p_pb2.PublishMetadataResponse: ...

    def update_status(
        self, mx_source_id: str, worker_id: str, worker_rank: int, status: p2p_pb2.SourceStatus,
        timeout_s: float | None = None,
    ) -> p2p_pb2.UpdateStatusResponse: ...


class Publisher(threading.Thread):
    """Publishes one worker and keeps its status honest (see module docstring)."""

    def __init__(
        self,
        client: ControlPlane,
        identity: p2p_pb2.SourceIdentity,
        worker: p2p_pb2.WorkerMetadata,
        worker_id: str,
        is_healthy: Callable[[], bool],
        interval_s: float,
        events: EventLog,
        metrics: SourceFamilies,
        on_published: Callable[[str], None] = lambda sid: None,
    ) -> None:
        super().__init__(name=f"mx-publisher-{worker.worker_rank}", daemon=True)
        self.client = client
        self.identity = identity
        self.worker = worker
        self.worker_id = worker_id
        self.is_healthy = is_healthy
        self.interval_s = interval_s
        self.events = events
        self.metrics = metrics
        self.on_published = on_published
        self.mx_source_id: str | None = None
        self.status = p2p_pb2.SOURCE_STATUS_UNKNOWN
        self._been_ready = False
        self._rejections = 0
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    # one tick = publish if needed, then one status update
    def tick(self) -> None:
        with self._lock:
            if self._stop_event.is_set():
                return
            if self.mx_source_id is None and not self._publish():
                return
            healthy = self.is_healthy()
            if healthy:
                self._send(p2p_pb2.SOURCE_STATUS_READY, "healthy")
            elif self._been_ready and self.status != p2p_pb2.SOURCE_STATUS_STALE:
                self._send(p2p_pb2.SOURCE_STATUS_STALE, "data plane unhealthy")

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.tick()
            except Exception:  # a tick never kills the heartbeat
                logger.exception("publisher tick failed")
            self._stop_event.wait(self.interval_s)

    def stop(self, timeout_s: float = SHUTDOWN_RPC_TIMEOUT_S) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=timeout_s)

    def mark_stale(self, reason: str, timeout_s: float = SHUTDOWN_RPC_TIMEOUT_S) -> bool:
        """Send STALE once, bounded by ``timeout_s`` even if a heartbeat is stuck in flight."""
        locked = self._lock.acquire(timeout=timeout_s)
        try:
            if self.mx_source_id is None:
                return False
            return self._send(p2p_pb2.SOURCE_STATUS_STALE, reason, timeout_s)
        finally:
            if locked:
                self._lock.release()

    def republish(self, worker: p2p_pb2.WorkerMetadata) -> str | None:
        """Publish ``worker`` again under the same identity (a grown manifest, ModelExpress 0.8's
        republish): the record keeps its id; the status goes on from READY. The id, or None when
        the publish failed (the next tick tries again, as after a wiped store)."""
        with self._lock:
            self.worker = worker
            if self._stop_event.is_set():
                return None
            if self._publish():
                return self.mx_source_id
            self.mx_source_id = None  # the record is the old one: the next tick publishes the grown one
            return None

    def _publish(self) -> bool:
        for attempt in range(len(PUBLISH_BACKOFF_S) + 1):
            try:
                resp = self.client.publish_metadata(self.identity, self.worker, self.worker_id)
            except MetadataServerError as exc:
                if exc.retryable and attempt < len(PUBLISH_BACKOFF_S):
                    if self._stop_event.wait(PUBLISH_BACKOFF_S[attempt]):
                        return False
                    continue
                logger.warning("publish failed: %s", exc)
                return False
            if not resp.success:
                logger.warning("publish rejected: %s", resp.message)
                return False
            self.mx_source_id = resp.mx_source_id
            self._rejections = 0
            mode = "p2p" if self.worker.worker_grpc_endpoint else "central"
            self.events.emit("published", mx_source_id=resp.mx_source_id, worker_id=self.worker_id, mode=mode)
            self.on_published(resp.mx_source_id)
            return True
        return False

    def _send(self, status: p2p_pb2.SourceStatus, reason: str, timeout_s: float | None = None) -> bool:
        assert self.mx_source_id is not None
        name = STATUS_NAMES[status]
        try:
            resp = self.client.update_status(
                self.mx_source_id, self.worker_id, self.worker.worker_rank, status, timeout_s=timeout_s
            )
        except MetadataServerError as exc:
            self.metrics.heartbeats.labels(name, "error").inc()
            self.events.emit("heartbeat", status=name, ok=False, message=str(exc))
            return False
        self.metrics.heartbeats.labels(name, "ok" if resp.success else "rejected").inc()
        self.events.emit("heartbeat", status=name, ok=resp.success, message=resp.message)
        if not resp.success:
            self._rejections += 1
            if self._rejections >= REJECTIONS_BEFORE_REPUBLISH:
                logger.warning("heartbeat rejected %d times: publishing again", self._rejections)
                self.mx_source_id = None
                self._rejections = 0
            return False
        self._rejections = 0
        if status != self.status:
            self.events.emit("status_change", status=name, previous=STATUS_NAMES[self.status], reason=reason)
            for s, n in STATUS_NAMES.items():
                self.metrics.source_status.labels(n).set(1 if s == status else 0)
            self.status = status
        if status == p2p_pb2.SOURCE_STATUS_READY:
            self._been_ready = True
        return True


@dataclass(frozen=True)
class ServeOptions:
    server: str
    worker_rank: int = 0
    mode: str = "p2p"  # p2p | central
    advertise_host: str = "127.0.0.1"
    worker_port: int = 0
    heartbeat_interval_s: float = config.DEFAULT_HEARTBEAT_INTERVAL_S
    ready_delay_s: float = 0.0  # simulated engine warm-up: not healthy (so not READY) until then
    lease_seconds: float | None = None  # a tensor read lease's lifetime (None: ModelExpress's rule)
    drain_timeout_s: float | None = None  # a refit's drain bound (None: a lease lifetime + DRAIN_MARGIN_S)


def warming_gate(
    is_healthy: Callable[[], bool], ready_delay_s: float, clock: Callable[[], float] = time.monotonic
) -> Callable[[], bool]:
    """``is_healthy`` that also answers False until ``ready_delay_s`` after this call (the engine's
    warm-up, ModelExpress #520: a source is advertised READY only once it can serve)."""
    if ready_delay_s <= 0:
        return is_healthy
    ready_at = clock() + ready_delay_s
    return lambda: clock() >= ready_at and is_healthy()


def lease_events(events: EventLog, lifetime_s: float) -> Callable[[str, str], None]:
    """What a source's ``Leases`` tell: each lease granted, given back or expired, as an event."""

    def tell(kind: str, lease_id: str) -> None:
        if kind == "granted":
            events.emit("lease_granted", lease_id=lease_id, lifetime_s=lifetime_s)
        elif kind == "released":
            events.emit("lease_returned", lease_id=lease_id)
        else:
            events.emit("lease_expired", lease_id=lease_id)

    return tell


class Refit:
    """A donor's weight updates, one at a time: drain the leases (bounded by ``drain_timeout_s``),
    write (``mutate``: the tensors written), count a generation, admit leases again (module docstring)."""

    def __init__(self, leases: Leases, events: EventLog, drain_timeout_s: float) -> None:
        self.leases = leases
        self.events = events
        self.drain_timeout_s = drain_timeout_s
        self.generation = 0  # weight updates so far
        self._lock = threading.Lock()

    def refit(self, mutate: Callable[[], int]) -> bool:
        """True when the weights were written; False when the drain timed out (nothing written)."""
        with self._lock:
            timeout = self.drain_timeout_s
            self.events.emit("drain_started", timeout_s=timeout, live=self.leases.live(), generation=self.generation)
            try:
                report = self.leases.drain(timeout)
            except DrainTimeout as exc:
                self.events.emit("drain_timed_out", timeout_s=timeout, waited_s=round(exc.waited_s, 6), live=exc.live)
                return False
            self.events.emit("drain_done", waited_s=round(report.waited_s, 6), outstanding=report.outstanding,
                             released=report.released, expired=report.expired)
            t0 = time.monotonic()
            try:
                tensors = mutate()
                self.generation += 1
            finally:
                self.leases.reopen()
            self.events.emit("refit", generation=self.generation, tensors=tensors,
                             seconds=round(time.monotonic() - t0, 6))
            return True


class SourceService:
    """WorkerService + Publisher around a manager that already holds registered tensors."""

    def __init__(
        self,
        manager: NixlTransferManager,
        arena: Arena,
        checksums: list[str],
        identity: p2p_pb2.SourceIdentity,
        options: ServeOptions,
        accelerator: str,
        events: EventLog,
        metrics: SourceFamilies,
    ) -> None:
        self.manager = manager
        self.options = options
        self.events = events
        self.metrics = metrics
        self.worker_id = uuid.uuid4().hex[:8]
        # A heartbeat must not outlive its interval by much: a stuck one delays the next.
        self.client = MxClient(options.server, timeout_s=min(config.DEFAULT_RPC_TIMEOUT_S,
                                                             max(2.0, options.heartbeat_interval_s)))
        tensors = tensor_descriptors(arena, checksums, manager.device_id)
        md_endpoint = endpoint(options.advertise_host, manager.listen_port or 0)
        self.manifest = WorkerManifest(
            worker_id=self.worker_id, worker_rank=options.worker_rank, tensors=tuple(tensors),
            metadata_endpoint=md_endpoint, agent_name=manager.agent_name, accelerator=accelerator,
        )
        self.servicer = WorkerServicer(self.manifest, metrics=metrics)
        self.extra_arenas: list[Arena] = []  # tensors added after publishing (``grow``)
        lifetime = options.lease_seconds if options.lease_seconds is not None else float(lease_seconds())
        self.leases = Leases(lifetime, on_change=lease_events(events, lifetime))
        self.refitter = Refit(self.leases, events, options.drain_timeout_s if options.drain_timeout_s is not None
                              else lifetime + DRAIN_MARGIN_S)
        # ModelExpress's WorkerService, same manifest, same port
        self.mx_worker = MxWorkerService(self.servicer, self.leases)
        self.grpc_server = None
        # The NIXL listener's endpoint is published in both modes: central readers ignore it
        # unless they push their own metadata to the source (``--push-metadata``).
        worker = p2p_pb2.WorkerMetadata(worker_rank=options.worker_rank, agent_name=manager.agent_name,
                                        accelerator=accelerator, status=p2p_pb2.SOURCE_STATUS_INITIALIZING,
                                        metadata_endpoint=md_endpoint)
        if options.mode == "p2p":
            self.grpc_server, port = start_worker_server(self.servicer, options.advertise_host, options.worker_port,
                                                         extra_handlers=(self.mx_worker.generic_handler(),))
            worker.worker_grpc_endpoint = endpoint(options.advertise_host, port)
            events.emit("listening", what="worker_grpc", port=port, endpoint=worker.worker_grpc_endpoint)
        elif options.mode == "central":
            worker.nixl_metadata = manager._metadata
            worker.tensor_source.tensors.extend(tensors)
        else:
            raise ValueError(f"source mode {options.mode!r} is not p2p or central")
        self.publisher = Publisher(
            self.client, identity, worker, self.worker_id, warming_gate(manager.is_healthy, options.ready_delay_s),
            options.heartbeat_interval_s,
            events, metrics, on_published=lambda sid: self.servicer.set_manifest(self.manifest.published_as(sid)),
        )

    def start(self) -> None:
        self.publisher.start()

    def grow(self, arena: Arena, checksums: list[str]) -> int:
        """Add ``arena``'s tensors (already registered with the manager: memory first) to the
        manifest and republish it under the same identity (ModelExpress 0.8's grown manifest). The
        manifest is swapped whole, in one step: a reader's manifest request answers either the old
        tensor list or the grown one. Returns the tensors added."""
        added = tensor_descriptors(arena, checksums, self.manager.device_id)
        grown = dataclasses.replace(self.manifest, tensors=(*self.manifest.tensors, *added))
        self.manifest = grown
        self.extra_arenas.append(arena)  # held (and registered) until the manager's shutdown
        worker = p2p_pb2.WorkerMetadata()
        worker.CopyFrom(self.publisher.worker)
        if self.options.mode == "central":  # the record carries the tensors and the agent's blob, now with the new regions
            worker.nixl_metadata = self.manager._metadata
            worker.tensor_source.tensors.extend(added)
        sid = self.publisher.mx_source_id
        if sid is not None:
            self.servicer.set_manifest(grown.published_as(sid))
        sid = self.publisher.republish(worker) or sid
        self.events.emit("manifest_grown", generation=self.refitter.generation + 1, tensors=len(grown.tensors),
                         added=len(added), mx_source_id=sid)
        return len(added)

    def refit(self, mutate: Callable[[], int]) -> bool:
        """A weight update (``Refit``); True when the weights were written."""
        return self.refitter.refit(mutate)

    def close(self) -> None:
        """The teardown order of the module docstring. Never raises."""
        steps: list[tuple[str, Callable[[], object]]] = [
            ("stop_heartbeat", self.publisher.stop),
            ("mark_stale", lambda: self.publisher.mark_stale("shutdown")),
            ("stop_worker_server", self._stop_worker_server),
        ]
        for step, action in steps:
            try:
                detail = action()
                self.events.emit("shutdown_step", step=step, ok=True, detail=detail)
            except Exception as exc:  # noqa: BLE001 - every teardown step runs; each failure is reported
                self.events.emit("shutdown_step", step=step, ok=False, detail=str(exc))
        self.manager.shutdown()
        self.client.close()

    def _stop_worker_server(self) -> None:
        self.servicer.drain()
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=1.0).wait(timeout=3.0)


def wait_for_stop(stop: threading.Event, seconds: float | None) -> None:
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stop.is_set():
        remaining = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
        if remaining <= 0:
            return
        stop.wait(remaining)
