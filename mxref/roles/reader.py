"""A reader ("target"): the load flow of docs/contract.md#load-strategy, ending in one result.

The reader holds a ``Reference`` (``mxref.model``) that its operator gave it (its model
spec or model file, optionally pinned by ``--expect-digest``); nothing a peer or a file
says replaces it. Its digest is our identity's ``revision``, so only sources claiming
the same content are listed.

1. List READY sources for our identity; keep our rank, then compatible
   accelerators; order with the selector; try at most ``MAX_SOURCE_RETRIES``.
   A metadata miss costs a candidate.
2. Per candidate: GetMetadata; in P2P mode prefetch the manifest from the
   source's WorkerService with a worker-id check (a reused endpoint is a miss);
   with ``lease`` the manifest comes with a tensor read lease instead, held until the
   attempt ends and required for its READ (``mxref.roles.lease``).
   A manifest that disagrees with the reference (a tensor's name, dtype, size,
   shape or checksum; an empty checksum claims nothing) is ``reference_mismatch``:
   the source is never read from. Then a fresh target (memory + NIXL agent), the
   handshake (P2P listener fetch or centralized blob), one bounded (by default chunked)
   READ of every tensor, and the release of the source in ``finally``; then every tensor's bytes
   are checked against the reference: a difference is ``integrity_mismatch``.
3. A failed candidate is rolled back and the next one is tried. When none
   succeeds: the safetensors checkpoint on disk, its tensors hashed and checked
   against the reference (not against what the file records).

The late-write guard (docs/nixl-facts.md#late-writes-after-a-released-stall: ``release_xfer_handle`` does not cancel
a GET on the wire; a stalled source that resumes writes its late replies into the
ranges it was asked for, 89 of 89 bare-NIXL trials). A rollback shuts the
attempt's NIXL agent down (its registrations and endpoints go with it) and, when a
READ was posted and did not complete (a stall, a timeout, a transfer error: the
peer may still answer), *parks* the attempt's memory: it stays allocated, unused,
until the reader exits, so the allocator cannot hand its pages to the next
attempt. Every attempt reads into a fresh registration of freshly allocated
memory that overlaps no parked region (``target_region`` says which, and
``region_parked`` which region was set aside). A completed load that followed such a released
READ is hashed again after a settle window in which the agent keeps making progress
(``memory_digest`` ``settled``); a load in which every posted READ completed has no late writer
to wait for and settles only when asked to (``--settle-always``).

Fixed costs are kept off the load's path (``mxref.transfer.read_target``): NIXL's one-time start-up
and, for a synthetic model, the first target's memory are paid in a thread from the process's
start (``NixlWarmup``); the first target's agent and registration while the control plane is
asked (``TargetPrestart``). Neither was ever read into, so the guard holds. A ``load_phase``
event per phase says where the time went; ``overlapped`` marks work beside the path.

The READ is chunked by default (``mxref.transfer.chunked``): a window that completes nothing within
one deadline (0.84 s with 16 MiB chunks, 2 in flight) is a stall, well before the budget.

After a load, ``memory_digest`` events report what the reader's memory holds (it is
re-hashed each time): ``loaded`` at once, ``settled`` after a settle window,
``exit`` before the memory is released.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from mxref import config
from mxref.accelerators import compatible, get_backend
from mxref.errors import IntegrityError, ReadFailure, TransferStalled, TransferTimeout
from mxref.events import EventLog
from mxref.metrics import ReaderMetrics
from mxref.model import Arena, LandingChecksums, Reference, load_checkpoint
from mxref.roles.client import MxClient, fetch_tensor_manifest
from mxref.roles.growth import grown_reference
from mxref.roles.lease import LeaseHolder, LeaseRefused
from mxref.roles.reader_options import ReaderOptions as ReaderOptions  # re-exported: where callers import it from
from mxref.roles.selection import Target, get_selector
from mxref.transfer.chunked import ChunkTime, ReadClock, window_idle
from mxref.transfer.manager import NixlTransferManager
from mxref.transfer.read_target import NixlWarmup, ReadTarget, TargetPrestart, prepare_target
from mxref.v1 import p2p_pb2

logger = logging.getLogger("mxref.roles.reader")

@dataclass
class Attempt:
    index: int
    worker_id: str
    mx_source_id: str
    outcome: str = ""
    agent_name: str = ""
    error: str | None = None
    seconds: float = 0.0


@dataclass
class LoadResult:
    path: str  # rdma | disk | none
    ok: bool
    source: str | None = None  # the source's agent name (rdma) or the checkpoint path (disk)
    worker_id: str | None = None
    mx_source_id: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    bytes: int = 0
    tensors: int = 0
    seconds: float = 0.0
    transfer_seconds: float = 0.0
    gbps: float = 0.0
    integrity: str = "unverified"  # verified | failed | unverified
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({"result": asdict(self)}, default=str)


class Reader:
    def __init__(
        self,
        options: ReaderOptions,
        reference: Reference,
        identity: p2p_pb2.SourceIdentity,
        events: EventLog,
        metrics: ReaderMetrics,
        warmup: NixlWarmup | None = None,
    ) -> None:
        """``warmup``: NIXL's one-time initialisation, started earlier (at the process's start)."""
        self.options = options
        self._warmup = warmup
        self.reference = reference
        self.base = reference  # the operator's; an attempt may read it grown (``accept_growth``)
        self.specs = list(reference.tensors)
        self.identity = identity
        self.events = events
        self.metrics = metrics
        self.accelerator = get_backend(options.accelerator)
        self.selector = get_selector(options.selector, options.selector_seed)
        self.policy = self.selector.name
        self.worker_id = uuid.uuid4().hex[:8]
        self.agent_base = options.agent_name or f"{options.name}-{self.worker_id}"
        self.manager: NixlTransferManager | None = None
        self.arena: Arena | None = None
        self._last_error: str | None = None
        self._parked: list[Arena] = []  # memory a stalled READ may still write: held until close()
        self._read_posted = False  # the current attempt posted a READ (its peer may answer late)
        # a READ was released before it completed (a stall, a timeout, a transfer error): its peer
        # may still write late replies, so the load settles before it is trusted (``settle``)
        self.released_mid_read = False
        self._agents_made = 0  # READ targets prepared so far (each has a fresh agent and name)
        self._warmup_reported = False
        self._prestart: TargetPrestart | None = None
        self._prestart_waited: TargetPrestart | None = None  # the prestart whose wait the load has told
        self._agent_lock = threading.Lock()  # an agent is made (and registered) or shut down, not both at once
        self._phases: dict[str, float] = {}  # seconds per load phase, summed over attempts
        self.leases = LeaseHolder(events, options.manifest_timeout_s) if options.lease else None

    # ------------------------------------------------------------------ flow
    def load(self) -> LoadResult:
        start = time.monotonic()
        result = LoadResult(path="none", ok=False)
        self._phases = {}
        if self._prestarts and self._prestart is None:
            self._prestart = TargetPrestart(self._new_target)  # none made ahead (``prepare_next``)
        try:
            self._load(result)
        finally:
            if self._prestart is not None:  # no attempt reached a READ: drop what was prepared
                self._prestart.discard()
                self._prestart = None
            if self._warmup is not None:
                self._warmup.release_arena()
        result.seconds = time.monotonic() - start
        if result.ok:  # what it holds is reported before it says it loaded: a reader that departs
            self.report_memory("loaded")  # right after load_done has still told what it held
        self._finish(result)
        return result

    def _load(self, result: LoadResult) -> None:
        with MxClient(self.options.server, self.options.rpc_timeout_s) as client:
            t0 = time.perf_counter()
            candidates = self._find_sources(client)
            self._load_phase("list", t0, None, True)
            if candidates and self._prestart is not None:
                # The first attempt starts once its memory is ready (made since the load began, beside the
                # listing): its clock, and whoever acts on attempt_start, then count only the source's share.
                waited = self._prestart.ready()
                self._record_phase("wait_target", "prepare", waited, "ok", None)
                self._prestart_waited = self._prestart  # its wait is told: the first attempt's take does not tell it again
            for index, ref in enumerate(candidates[: config.MAX_SOURCE_RETRIES]):
                has_next = index + 1 < min(len(candidates), config.MAX_SOURCE_RETRIES)
                attempt = Attempt(index=index, worker_id=ref.worker_id, mx_source_id=ref.mx_source_id)
                result.attempts.append(attempt)
                if self._try(client, ref, attempt, has_next, result):
                    break
        if not result.ok:
            self._follow(self.base, None)  # the checkpoint holds the operator's model
            t0 = time.perf_counter()
            self._fall_back(result, "no source succeeded" if candidates else "no source available")
            self._load_phase("fallback", t0, None, result.ok)

    def report_memory(self, when: str) -> Reference | None:
        """Emit ``memory_digest`` for what our memory holds now (re-hashed); None when we hold nothing."""
        if self.arena is None:
            return None
        held = Reference.from_arena(self.arena)
        self.events.emit("memory_digest", when=when, digest=held.digest, checksums=held.checksums)
        return held

    def settle(self, seconds: float, stop: threading.Event, *, always: bool = False) -> Reference | None:
        """After a load in which a READ was released before it completed (``released_mid_read``),
        or after any load when ``always``: wait ``seconds`` (cut short by ``stop``), then report
        ``settled``; 0 disables it. None when it did not settle.

        Our agent keeps making progress meanwhile (it has no progress thread: only a READ's
        polling drives it), so a late reply still queued for it lands inside the window and
        the ``settled`` digest sees it, instead of landing unseen once something polls again.
        Without a released READ no late reply can come (a completed READ was answered in full),
        so the window would only delay the reader (0.5 s by default)."""
        if seconds <= 0 or not (always or self.released_mid_read):
            return None
        if self.manager is not None:
            self.manager.start_progress_pump()
        t0 = time.perf_counter()
        if stop.wait(seconds):
            return None
        held = self.report_memory("settled")
        self._load_phase("settle", t0, None, held is not None)
        return held

    def _find_sources(self, client: MxClient) -> list[p2p_pb2.SourceInstanceRef]:
        try:
            listed = client.list_sources(identity=self.identity, status_filter=p2p_pb2.SOURCE_STATUS_READY)
        except Exception as exc:  # noqa: BLE001 - as in ModelExpress: any listing failure means "no source"
            logger.warning("listing sources failed, falling through: %s", exc)
            self.metrics.reader.list_sources.labels(self.policy, "error").inc()
            self.events.emit("candidates", listed=0, rank_matched=0, accelerator_matched=0,
                             selector=self.policy, order=[], error=str(exc))
            return []
        self.metrics.reader.list_sources.labels(self.policy, "ok" if listed else "empty").inc()
        rank_matched = [r for r in listed if r.worker_rank == self.options.worker_rank]
        eligible = [r for r in rank_matched if compatible(self.accelerator.name, r.accelerator)]
        t0 = time.perf_counter()
        target = Target(self.identity.model_name, self.worker_id, self.options.worker_rank)
        ordered = self.selector.order(eligible, target)
        self.metrics.reader.selection_seconds.labels(self.policy).observe(time.perf_counter() - t0)
        for stage, n in (("listed", len(listed)), ("rank_matched", len(rank_matched)),
                         ("accelerator_matched", len(eligible))):
            self.metrics.reader.candidates.labels(self.policy, stage).observe(n)
        self.events.emit("candidates", listed=len(listed), rank_matched=len(rank_matched),
                         accelerator_matched=len(eligible), selector=self.policy,
                         order=[r.worker_id for r in ordered])
        return ordered

    def _try(self, client: MxClient, ref: p2p_pb2.SourceInstanceRef, attempt: Attempt, has_next: bool,
             result: LoadResult) -> bool:
        """One candidate. True when it produced a verified load. Its lease, if any, is given back."""
        try:
            return self._attempt(client, ref, attempt, has_next, result)
        finally:
            if self.leases is not None:
                self.leases.release(attempt.index)

    def _attempt(self, client: MxClient, ref: p2p_pb2.SourceInstanceRef, attempt: Attempt, has_next: bool,
                 result: LoadResult) -> bool:
        self.events.emit("attempt_start", index=attempt.index, mx_source_id=ref.mx_source_id, worker_id=ref.worker_id)
        t0 = time.perf_counter()
        try:
            worker = self._fetch_worker_metadata(client, ref, attempt.index)
        except LeaseRefused as exc:
            self._phase("metadata", t0, "error", attempt.index)
            return self._outcome(attempt, "lease_refused", str(exc))
        except Exception as exc:  # noqa: BLE001 - as in ModelExpress: any metadata failure moves on to the next candidate
            self.metrics.reader.metadata_failures.labels(self.policy).inc()
            self._phase("metadata", t0, "error", attempt.index)
            return self._outcome(attempt, "metadata_miss", f"{type(exc).__name__}: {exc}")
        self._phase("metadata", t0, "ok", attempt.index)
        if worker is None:
            return self._outcome(attempt, "metadata_miss", "metadata not found or empty")
        if not compatible(self.accelerator.name, worker.accelerator):
            return self._outcome(attempt, "skipped", f"accelerator {worker.accelerator!r} is not {self.accelerator.name!r}")
        attempt.agent_name = worker.agent_name
        tensors = list(worker.tensor_source.tensors or worker.tensors)
        if self.options.accept_growth:
            self._follow(grown_reference(self.base, tensors), attempt.index)
        disagreement = self._manifest_disagreement(tensors)
        if disagreement is not None:
            self.metrics.reader.reference_mismatches.labels("manifest").inc()
            return self._outcome(attempt, "reference_mismatch", disagreement)
        self.metrics.reader.selections.labels(self.policy).inc()
        t_transfer = time.perf_counter()
        try:
            nbytes, seconds = self._load_as_target(worker, attempt.index, has_next)
        except IntegrityError as exc:  # the READ completed, but with bytes that are not the reference's
            elapsed = time.perf_counter() - t_transfer
            self.metrics.reader.transfer_seconds.labels(self.policy, "retry" if has_next else "fallback").observe(elapsed)
            self.metrics.reader.reference_mismatches.labels("read").inc()
            self._rollback(attempt.index)
            return self._outcome(attempt, "integrity_mismatch", f"{type(exc).__name__}: {exc}", elapsed)
        except Exception as exc:  # noqa: BLE001 - as in ModelExpress: any transfer failure moves on (retry or fallback)
            elapsed = time.perf_counter() - t_transfer
            self.metrics.reader.transfer_seconds.labels(self.policy, "retry" if has_next else "fallback").observe(elapsed)
            self._rollback(attempt.index)
            return self._outcome(attempt, "transfer_retry" if has_next else "transfer_fallback",
                                 f"{type(exc).__name__}: {exc}", elapsed)
        elapsed = time.perf_counter() - t_transfer
        self.metrics.reader.transfer_seconds.labels(self.policy, "success").observe(elapsed)
        result.ok = True
        result.path = "rdma"
        result.source = worker.agent_name
        result.worker_id = ref.worker_id
        result.mx_source_id = ref.mx_source_id
        result.bytes = nbytes
        result.tensors = len(self.specs)
        result.transfer_seconds = seconds
        result.gbps = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        result.integrity = "verified"
        self._outcome(attempt, "success", None, elapsed)
        return True

    def _outcome(self, attempt: Attempt, outcome: str, error: str | None, seconds: float = 0.0) -> bool:
        attempt.outcome, attempt.error, attempt.seconds = outcome, error, round(seconds, 6)
        if outcome != "skipped":
            self.metrics.reader.attempts.labels(self.policy, outcome).inc()
        self.events.emit("attempt_outcome", index=attempt.index, worker_id=attempt.worker_id, outcome=outcome,
                         error=error, seconds=attempt.seconds)
        if error:
            logger.warning("source attempt %d (%s): %s: %s", attempt.index, attempt.worker_id, outcome, error)
        return outcome == "success"

    def _follow(self, reference: Reference, index: int | None) -> None:
        """Read (and verify) as ``reference`` from now on: the prestarted target, laid out for the
        previous one, is dropped (never read into)."""
        if reference.digest == self.reference.digest:
            return
        self.reference, self.specs = reference, list(reference.tensors)
        if self._prestart is not None:
            self._prestart.discard()
            self._prestart = None
        if reference is not self.base:
            self.events.emit("reference_grown", index=index, tensors=len(self.specs),
                             added=len(self.specs) - len(self.base.tensors), digest=reference.digest)

    def _manifest_disagreement(self, tensors: list[p2p_pb2.TensorDescriptor]) -> str | None:
        """Why a source's manifest is not our reference's model, or None. An empty checksum
        claims nothing (the bytes are still checked after the READ)."""
        by_name = {t.name: t for t in tensors}
        bad: list[str] = []
        for spec in self.specs:
            d = by_name.get(spec.name)
            if (d is None or d.size != spec.nbytes or (d.dtype and d.dtype.removeprefix("torch.") != spec.dtype)
                    or (d.shape and tuple(d.shape) != tuple(spec.shape))
                    or (d.checksum and d.checksum != self.reference.checksums[spec.name])):
                bad.append(spec.name)
        extra = sorted(set(by_name) - {s.name for s in self.specs})
        if not bad and not extra:
            return None
        parts = [f"{len(bad)} of {len(self.specs)} tensors differ from or are missing in it: {bad[:5]}"] if bad else []
        if extra:
            parts.append(f"it has {len(extra)} tensors the reference lacks: {extra[:5]}")
        return f"manifest disagrees with the reference {self.reference.digest}: " + "; ".join(parts)

    def _fetch_worker_metadata(self, client: MxClient, ref: p2p_pb2.SourceInstanceRef,
                               index: int) -> p2p_pb2.WorkerMetadata | None:
        resp = client.get_metadata(ref.mx_source_id, ref.worker_id)
        if not resp.found:
            return None
        worker = resp.worker
        has_tensors = bool(worker.tensor_source.tensors or worker.tensors)
        if self.leases is not None:  # the lease's manifest, and no other, is checked and read from
            manifest = self.leases.acquire(index, worker, ref.mx_source_id, ref.worker_id)
        elif not has_tensors and not worker.worker_grpc_endpoint:
            return None
        elif worker.worker_grpc_endpoint and (ref.worker_id or not has_tensors):
            manifest = fetch_tensor_manifest(worker.worker_grpc_endpoint, ref.mx_source_id, ref.worker_id,
                                             self.options.manifest_timeout_s)
        else:
            return worker
        worker.tensor_source.ClearField("tensors")
        worker.tensor_source.tensors.extend(manifest.tensors)
        worker.metadata_endpoint = worker.metadata_endpoint or manifest.metadata_endpoint
        worker.agent_name = worker.agent_name or manifest.agent_name
        return worker

    def _load_as_target(self, worker: p2p_pb2.WorkerMetadata, index: int, has_next: bool = False) -> tuple[int, float]:
        """Prepare a fresh target, handshake, READ, release, verify. Returns (bytes, READ seconds)."""
        self._read_posted = False
        if self.options.unguarded_retry and self.manager is not None and self.arena is not None:
            mgr, arena = self.manager, self.arena  # SIMULATED BUG: the failed attempt's agent and memory
            arena.fill(0)
            self._emit_region(index, mgr.agent_name, arena, fresh=False)
        else:
            target = self._take_target(index)
            self.manager, self.arena = mgr, arena = target.manager, target.arena
            clash = self._overlaps_parked(arena)
            if clash is not None:  # cannot happen while parked regions stay allocated; never read into one
                raise RuntimeError(f"fresh target memory {clash} overlaps a region a stalled READ may still write")
            self._emit_region(index, target.agent_name, arena, fresh=True)
        source_tensors = list(worker.tensor_source.tensors or worker.tensors)
        remote: str | None = None
        try:
            t0 = time.perf_counter()
            if worker.worker_grpc_endpoint:
                host, port = worker.metadata_endpoint.rsplit(":", 1)
                remote = worker.agent_name  # claimed before the dial: a half-done fetch is still released
                try:
                    mgr.fetch_remote_and_wait(remote, host.strip("[]"), int(port), self.options.handshake_timeout_s)
                except Exception as exc:
                    self._phase("handshake", t0, "error", index)
                    self.events.emit("handshake", index=index, mode="p2p", agent_name=remote,
                                     seconds=round(time.perf_counter() - t0, 6), ok=False, error=str(exc))
                    raise
                mode = "p2p"
            else:
                remote = mgr.add_remote_agent(worker.nixl_metadata)
                mode = "central"
            pushed = False
            if self.options.push_metadata and worker.metadata_endpoint:
                host, port = worker.metadata_endpoint.rsplit(":", 1)
                mgr.push_local_metadata(remote, host.strip("[]"), int(port))
                pushed = True
            self._phase("handshake", t0, "ok", index)
            self.events.emit("handshake", index=index, mode=mode, agent_name=remote,
                             seconds=round(time.perf_counter() - t0, 6), ok=True, pushed=pushed)
            total = sum(s.nbytes for s in self.specs)
            budget = self.options.transfer_timeout_s
            chunks = self.options.chunks
            lease_id = self.leases.lease_for_read() if self.leases is not None else None  # none held: no READ
            self.events.emit("transfer_start", index=index, agent_name=remote, bytes=total, lease_id=lease_id,
                             tensors=len(source_tensors), timeout_s=budget,
                             chunk_bytes=chunks.chunk_bytes if chunks else None,
                             stall_s=round(chunks.stall_s, 3) if chunks else None,
                             first_stall_s=round(chunks.first_deadline(total), 3) if chunks else None)
            # a host target's checksums are taken as its chunks land (the guard makes them final)
            landing = (LandingChecksums(arena) if chunks is not None and self.options.hash_while_reading
                       and isinstance(arena, Arena) else None)
            trace: list[ChunkTime] = []  # each chunk's post and completion (the bench reads them)
            clock = ReadClock()  # where a chunked READ's time went (the bench sets it beside a raw READ's)
            t0 = time.perf_counter()
            self._read_posted = True
            try:
                nbytes, _count, _res = mgr.receive_from_source(
                    worker.nixl_metadata, source_tensors, budget, remote, require_exact_match=True, chunks=chunks,
                    on_suspect=self._next_target_early(index) if has_next else None, landing=landing, trace=trace,
                    clock=clock,
                )
            except TransferTimeout as exc:
                seconds = time.perf_counter() - t0
                self._phase("read", t0, "error", index)
                self.events.emit("transfer_timeout", index=index, seconds=round(seconds, 6), budget_s=budget,
                                 stalled=exc.failure is ReadFailure.STALLED,
                                 chunks_done=exc.chunks_done if isinstance(exc, TransferStalled) else None,
                                 read_phases=clock.fields() if chunks is not None else None,
                                 error=str(exc), **mgr.audit.open_fields())
                raise
            except Exception as exc:
                self._phase("read", t0, "error", index)
                self.events.emit("transfer_error", index=index, seconds=round(time.perf_counter() - t0, 6),
                                 error=f"{type(exc).__name__}: {exc}", **mgr.audit.open_fields())
                raise
            seconds = time.perf_counter() - t0
            self._phase("read", t0, "ok", index)
            self.events.emit("transfer_done", index=index, bytes=nbytes, seconds=round(seconds, 6),
                             gbps=round(nbytes / seconds / 1e9, 3) if seconds > 0 else None,
                             hashing_s=round(landing.hashing_s, 6) if landing is not None else None,
                             read_phases=clock.fields() if chunks is not None else None,
                             window=window_idle(trace, chunks.window) if chunks is not None else None,
                             chunk_ms=[[t.nbytes, round(t.posted_s * 1e3, 2), round(t.done_s * 1e3, 2)] for t in trace])
        finally:
            if remote is not None and not self.options.skip_release:
                t0 = time.perf_counter()
                mgr.remove_remote_agent(remote)
                self._phase("release", t0, "ok", index)
        t0 = time.perf_counter()
        self._read_posted = False  # completed: every GET was answered, nothing is left to land
        try:
            self._verify(arena, landing)
        except IntegrityError:
            self._phase("verify", t0, "error", index)
            raise
        self._phase("verify", t0, "ok", index)
        return nbytes, seconds

    @property
    def _prestarts(self) -> bool:
        """Whether READ targets are made ahead (``--prestart``); never with the simulated bug that
        reads a retry into the failed attempt's target (``unguarded_retry``)."""
        return self.options.prestart and not self.options.unguarded_retry

    def _new_target(self, ahead: bool = False) -> ReadTarget:
        """Fresh memory registered with a fresh agent (its own name: ``base``, ``base.1``, ...).
        ``ahead``: made before any load waits for it (``prepare_next``), as the first is."""
        n = self._agents_made
        self._agents_made += 1
        return prepare_target(self.accelerator, self.specs, self.options.device_id,
                              self.agent_base if n == 0 else f"{self.agent_base}.{n}",
                              events=self.events, metrics=self.metrics.nixl, initial_error=self._last_error,
                              manager_cls=NixlTransferManager, warmup=self._warmup, agent_lock=self._agent_lock,
                              hurry=n > 0 and not ahead)  # a later one is awaited by a rollback

    def prepare_next(self) -> None:
        """Start the next load's READ target now, in a thread (``TargetPrestart``): what a reader
        that loads again (``--load-loop``) does once it has given its last load back, so its next
        load starts as a fresh reader's first does, with its target made during its start-up
        (``NixlWarmup``) rather than beside its listing. Never read into (the guard holds);
        dropped by ``close`` when no load takes it."""
        if self._prestarts and self._prestart is None:
            self._prestart = TargetPrestart(functools.partial(self._new_target, ahead=True))
            self.events.emit("target_prestart", index=0, reason="between loads: the next load's target, made as a "
                             "fresh reader makes its first during its start-up")

    def _next_target_early(self, index: int) -> Callable[[], None] | None:
        """What a READ that has gone quiet for half its stall deadline calls: prepare the next
        attempt's target (fresh memory, a fresh agent: never read into, so the guard holds) in a
        thread while the deadline runs out, instead of after it. A READ that completes after all
        leaves it unused (dropped with the load)."""
        if not self._prestarts:
            return None

        def start() -> None:  # runs on the polling thread; the target is made in its own thread
            if self._prestart is None:
                self._prestart = TargetPrestart(self._new_target)
                self.events.emit("target_prestart", index=index + 1, reason="READ quiet for half its stall deadline (or half its budget)")

        return start

    def _take_target(self, index: int) -> ReadTarget:
        """The prestarted target when there is one (no READ was ever posted into it), else a new one."""
        target: ReadTarget | None = None
        prestart, self._prestart = self._prestart, None
        if prestart is not None:
            target, waited = prestart.take()
            if prestart is not self._prestart_waited:
                self._record_phase("wait_target", "prepare", waited, "ok", index)
        overlapped = target is not None
        if target is None:
            target = self._new_target()
        else:  # prepared beside an attempt that failed since: health stays down until a transfer succeeds
            target.manager.carry_error(self._last_error)
        if self._warmup is not None and self._warmup.seconds and not self._warmup_reported:
            self._warmup_reported = True  # it ran beside the reference's computation, before the load
            self._record_phase("warmup", None, self._warmup.seconds, "error" if self._warmup.error else "ok",
                               index, overlapped=True)
        metric = {"allocate": "prepare", "warmup_wait": "register", "agent": "register", "register": "register"}
        for phase, seconds in target.phases.items():
            self._record_phase(phase, metric[phase], seconds, "ok", index, overlapped=overlapped)
        return target

    def _emit_region(self, index: int, agent_name: str, arena: Arena, fresh: bool) -> None:
        """Which memory (and agent) attempt ``index`` reads into: the late-write guard made visible."""
        lo, hi = _span(arena)
        self.events.emit("target_region", index=index, agent_name=agent_name, addr=hex(lo), bytes=hi - lo,
                         fresh=fresh, parked=len(self._parked))

    def _overlaps_parked(self, arena: Arena) -> str | None:
        lo, hi = _span(arena)
        for parked in self._parked:
            plo, phi = _span(parked)
            if lo < phi and plo < hi:
                return f"[{lo:#x}, {hi:#x}) overlaps parked [{plo:#x}, {phi:#x})"
        return None

    def _verify(self, arena: Arena, landing: LandingChecksums | None = None) -> None:
        """Every tensor's bytes against the reference (never against what a source or file claims);
        with ``landing``, the checksums taken as the READ landed them, finished now."""
        sums = landing.finish() if landing is not None else arena.checksums()
        held = dict(zip((s.name for s in arena.specs), sums))
        bad = self.reference.mismatches(held)
        self.events.emit("integrity", ok=not bad, tensors=len(arena.specs), bad=bad[:20],
                         hashed_during_read=landing.during_read if landing is not None else 0)
        if bad:
            raise IntegrityError(f"{len(bad)} of {len(arena.specs)} tensors differ from the reference "
                                 f"{self.reference.digest}: {bad[:5]}")

    def _rollback(self, index: int) -> None:
        """Undo a failed attempt: shut its agent down; park its memory when a READ into it was
        posted and not completed (the peer may still answer), else release it."""
        if self._read_posted:
            self.released_mid_read = True
        if self.options.unguarded_retry and self._read_posted:
            return  # SIMULATED BUG: the next attempt reuses this agent, registration and memory
        if self.manager is not None:  # never while the next attempt's agent is being made (only
            self._last_error = self.manager.data_plane_error  # that: its memory's allocation goes on)
            with self._agent_lock:
                self.manager.shutdown()
            self.manager = None
        if self.arena is not None:
            if self._read_posted:
                lo, hi = _span(self.arena)
                self._parked.append(self.arena)
                self.events.emit("region_parked", index=index, addr=hex(lo), bytes=hi - lo, parked=len(self._parked))
            else:
                self.arena.release()
            self.arena = None
        self._read_posted = False

    def _fall_back(self, result: LoadResult, reason: str) -> None:
        checkpoint = self.options.checkpoint
        self.events.emit("fallback", reason=reason, checkpoint=str(checkpoint) if checkpoint else None)
        self.metrics.reader.fallbacks.labels("no_source_available" if reason == "no source available" else "no_source_succeeded").inc()
        if checkpoint is None:
            result.error = f"{reason}, and no checkpoint to fall back to"
            return
        t0 = time.perf_counter()
        try:
            arena = load_checkpoint(checkpoint)
        except Exception as exc:  # noqa: BLE001 - an unreadable checkpoint (any cause) is a failed load, reported
            result.error = f"{reason}; checkpoint {checkpoint}: {type(exc).__name__}: {exc}"
            return
        layout = self.reference.layout_mismatch(arena.specs)
        if layout is not None:
            arena.release()
            self.metrics.reader.reference_mismatches.labels("disk").inc()
            result.error = f"{reason}; checkpoint {checkpoint} holds a different model than this reader's: {layout}"
            result.integrity = "failed"
            return
        try:
            self._verify(arena)
        except IntegrityError as exc:
            arena.release()
            self.metrics.reader.reference_mismatches.labels("disk").inc()
            result.error = f"{reason}; checkpoint {checkpoint}: {exc}"
            result.integrity = "failed"
            return
        arena = self.accelerator.to_device(arena, self.options.device_id)
        seconds = time.perf_counter() - t0
        self.arena = arena
        result.ok, result.path, result.source = True, "disk", str(checkpoint)
        result.bytes = sum(s.nbytes for s in arena.specs)
        result.tensors = len(arena.specs)
        result.transfer_seconds = seconds
        result.gbps = result.bytes / seconds / 1e9 if seconds > 0 else 0.0
        result.integrity = "verified"

    def _finish(self, result: LoadResult) -> None:
        if result.ok:
            self.metrics.reader.loads.labels(result.path, result.integrity).inc()
            self.metrics.reader.load_seconds.labels(result.path).observe(result.seconds)
            self.metrics.reader.loaded_bytes.labels(result.path).inc(result.bytes)
            self.events.emit("load_done", path=result.path, source=result.source, worker_id=result.worker_id,
                             bytes=result.bytes, seconds=round(result.seconds, 6), gbps=round(result.gbps, 3),
                             integrity=result.integrity, attempts=len(result.attempts),
                             phases={k: round(v, 6) for k, v in self._phases.items()})
        else:
            self.events.emit("load_failed", error=result.error)

    # load phases: the event's name -> ModelExpress's phase label of mx_p2p_source_attempt_phase_seconds
    _METRIC_PHASE = {"metadata": "metadata", "handshake": "handshake", "read": "receive", "release": "release",
                     "verify": "finalize"}

    def _phase(self, phase: str, t0: float, outcome: str, index: int) -> None:
        """One attempt phase since ``t0``: the metric (ModelExpress's label) and a ``load_phase`` event."""
        self._record_phase(phase, self._METRIC_PHASE[phase], time.perf_counter() - t0, outcome, index)

    def _record_phase(self, phase: str, metric_phase: str | None, seconds: float, outcome: str, index: int | None,
                      overlapped: bool = False) -> None:
        """``metric_phase`` None: no attempt phase of ModelExpress's (the process's NIXL warm-up)."""
        if metric_phase is not None:
            self.metrics.reader.phase_seconds.labels(self.policy, metric_phase, outcome).observe(seconds)
        self._emit_phase(phase, seconds, index, outcome == "ok", overlapped)

    def _load_phase(self, phase: str, t0: float, index: int | None, ok: bool) -> None:
        """A phase of the load outside any attempt (list, fallback, settle): event only."""
        self._emit_phase(phase, time.perf_counter() - t0, index, ok, False)

    def _emit_phase(self, phase: str, seconds: float, index: int | None, ok: bool, overlapped: bool) -> None:
        if not overlapped:  # time the load spent on it (overlapped work ran beside another phase)
            self._phases[phase] = self._phases.get(phase, 0.0) + seconds
        self.events.emit("load_phase", phase=phase, index=index, seconds=round(seconds, 6), ok=ok,
                         overlapped=overlapped)

    def drop_load(self) -> None:
        """Give back what the last load holds (its agent and its memory), as a reader that loads
        again does before its next load (``--load-loop``); parked regions stay parked until ``close``."""
        if self.manager is not None:
            with self._agent_lock:
                self.manager.shutdown()
            self.manager = None
        if self.arena is not None:
            self.arena.release()
            self.arena = None
        self.released_mid_read = False

    def await_prepared(self) -> float:
        """Wait (bounded) until the target ``prepare_next`` started is made (or failed); the
        seconds waited, 0 when none is being made."""
        return self._prestart.ready() if self._prestart is not None else 0.0

    def close(self) -> None:
        if self._prestart is not None:  # made ahead for a load that never came
            self._prestart.discard()
            self._prestart = None
        if self.manager is not None:
            self.manager.shutdown()
            self.manager = None
        for parked in self._parked:  # the process is leaving: no later attempt can be handed this memory
            parked.release()
        self._parked = []


def _span(arena: Arena) -> tuple[int, int]:
    """The address range [lo, hi) an arena's registered regions cover."""
    regions = arena.regions()
    return min(a for a, _ in regions), max(a + n for a, n in regions)

