"""The ``modelexpress`` subject: the real ModelExpress 0.7.0 client, driven as an engine would drive it.

Run in the subject's own environment (``harness.subjects.envs``: torch, nixl, modelexpress)::

    <subject python> -m mxref.modelexpress.adapter source|reader --server HOST:PORT --name N --events PATH [model flags]

What runs unmodified, from the published package: the strategy chain
(``run_load_strategy_chain``: RDMA first, then the engine's native loader), the RDMA strategy
(ListSources, selection, GetMetadata, GetTensorManifest, the NIXL handshake over the
source's listener, one READ, release in ``finally``, the 300 s budget unless
``MX_TRANSFER_TIMEOUT``), ``NixlTransferManager`` (agent, registration, transfers, health),
the metadata client, ``publish_metadata_and_ready`` with its worker gRPC server and the
publisher thread (READY, heartbeats, STALE on exit, re-registration after rejections).

What this adapter stands in for (the engine's side of the package's seams):

- ``EngineAdapter`` (``HarnessEngine``): the "model" is the harness's deterministic model
  (``mxref.model``: tensor i from PCG64(seed, i)) as plain CPU torch tensors viewing one
  page-aligned arena; ``load_via_native`` (the disk path) fills it from ``--checkpoint`` when
  given, else from the seed; ``prepare_rdma_target`` / ``reinit_for_retry`` zero it.
- ``AcceleratorBackend`` (``CpuBackend``): the package knows CUDA and XPU; on a CPU-only host
  the tensors are host memory, registered as NIXL ``DRAM`` (the package's own DRAM path
  is what its artifact transfers use).
- ``SourceIdentity``: built as an mxref source builds it (model name, dtype, the content
  reference digest as ``revision``), so MX and mxref peers holding the same model pair.

What the client does is turned into the harness's JSON-lines events (``mxref.events``) by
observing it, never by re-implementing it: a ``logging`` handler on the ``modelexpress``
loggers maps its log lines (``Status -> READY``, ``Source attempt: ...``, ``Receiving N
tensors``, ``RDMA transfer complete``, ``Strategy rdma failed, trying next``, ``Marked STALE
on shutdown``, ...) to ``status_change``, ``attempt_start``, ``transfer_start``,
``transfer_done``, ``fallback`` ...; the strategy that succeeded gives ``load_done``'s path;
``memory_digest`` re-hashes the arena (the harness judges those checksums against its own
model). The client's own metrics (``MX_METRICS_ENABLED=1``: ``mx_p2p_*``, ``mx_nixl_*``) are
served for the harness's scrapes. ``load_done``'s ``integrity`` is the adapter's check against
the reference: the client itself verifies no content (a source serving wrong bytes is loaded). This module must not import ``mxref.mx`` (the client registers the same
``model_express.p2p`` names in the default descriptor pool).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mxref import config
from mxref.events import EventLog, log_to_stderr
from mxref.model import Arena, ModelSpec, Reference, fill_from_seed, load_checkpoint
from mxref.options import parse_known
from mxref.process import StopSignals, free_port

logger = logging.getLogger("mxref.modelexpress.adapter")

EXIT_OK, EXIT_LOAD_FAILED, EXIT_USAGE = 0, 1, 2
SUBJECT_VERSION = "0.7.0"  # the release the adapter was written against; ``installed_version`` says who plays


def installed_version() -> str:
    """The ``modelexpress`` release installed in this environment (``started``'s ``version``): a
    subject environment of another release (``modelexpress@0.8.0.dev...``) plays that release."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modelexpress")
    except PackageNotFoundError:
        return f"{SUBJECT_VERSION} (not installed here)"


# --- the engine's side of the seams ---------------------------------------------------


class CpuBackend:
    """The package's ``AcceleratorBackend`` protocol for host memory (NIXL ``DRAM``)."""

    name = "cpu"
    torch_device_type = "cpu"
    nixl_mem_type = "DRAM"

    def set_device(self, device_id: int) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def synchronize(self, device_id: int | None = None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def torch_device(self, device_id: int) -> Any:
        # late: torch and the modelexpress client exist only in the modelexpress subject's env
        import torch

        return torch.device("cpu")

    def is_accel_tensor(self, tensor: Any) -> bool:
        return bool(tensor.device.type == "cpu")

    def supports_rdma_p2p(self) -> bool:
        return True

    def supports_pool_reg(self) -> bool:
        return False

    def supports_vmm(self) -> bool:
        return False

    def supports_gds(self) -> bool:
        return False


def make_engine(spec: ModelSpec, rank: int, identity: Any, checkpoint: Path | None, data_seed: int | None) -> Any:
    """A ``modelexpress.adapter.EngineAdapter`` over the harness model (imported here: the
    subject's environment only)."""
    # late: torch and the modelexpress client exist only in the modelexpress subject's env
    import torch
    from modelexpress.adapter import EngineAdapter

    class HarnessEngine(EngineAdapter):  # type: ignore[misc]
        def __init__(self) -> None:
            self.arena: Arena = Arena(spec.tensor_specs())
            self.tensors = {s.name: torch.from_numpy(self.arena.view(i)) for i, s in enumerate(self.arena.specs)}

        def build_identity(self) -> Any:
            return identity

        def get_worker_rank(self) -> int:
            return rank

        def get_global_rank(self) -> int:
            return rank

        def get_device_id(self) -> int:
            return 0

        def get_target_device(self) -> Any:
            return torch.device("cpu")

        def discover_tensors(self, result: Any) -> dict[str, Any]:
            return dict(self.tensors)

        def load_via_native(self, result: Any) -> Any:
            if checkpoint is not None:
                loaded = load_checkpoint(checkpoint)
                self.arena.buffer[:] = loaded.buffer[: self.arena.nbytes]
            else:
                fill_from_seed(self.arena, spec.seed if data_seed is None else data_seed)
            return result

        def reinit_for_retry(self, result: Any) -> Any:
            self.arena.fill(0)
            return result

        def prepare_rdma_target(self, result: Any) -> Any:
            self.arena.fill(0)
            return result

    return HarnessEngine()


# --- observing the client ---------------------------------------------------------------

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Status -> READY|healthy again, status -> READY"), "ready"),
    (re.compile(r"marked STALE so targets stop selecting it: (?P<reason>.*)"), "stale_unhealthy"),
    (re.compile(r"Marked STALE on shutdown"), "stale_shutdown"),
    (re.compile(r"Published (?:P2P )?metadata to MX server \(mx_source_id=(?P<sid>[0-9a-f]+)"), "published"),
    (re.compile(r"Source selection: .*source_candidates_total=(?P<listed>\d+) source_candidates_rank_matched=(?P<rank>\d+)"
                r"(?: source_candidates_accelerator_matched=(?P<accel>\d+))?"
                r"(?: source_candidates_topology_matched=(?P<topo>\d+))?"), "candidates"),
    # 0.8: MX_P2P_TOPOLOGY_DOMAIN required (the default enforcement) and this node's value unknown after its wait
    (re.compile(r"Topology domain '(?P<domain>[^']*)' is required but unknown for this node"), "topology_blocked"),
    # a source's worker gRPC server answering a reader's manifest (every READ is preceded by one)
    (re.compile(r"(?P<method>GetTensorManifest|PrepareTensorRead) served: (?P<n>\d+) tensors"), "manifest_served"),
    (re.compile(r"Error listing sources, falling through: (?P<error>.*)", re.S), "list_error"),  # a multi-line gRPC error
    (re.compile(r"No RDMA source available, skipping"), "no_source"),
    (re.compile(r"Source attempt: source_attempt_index=(?P<index>\d+) source_worker_id=(?P<wid>\S+) "
                r"mx_source_id=(?P<sid>\S+)"), "attempt"),
    (re.compile(r"Receiving (?P<n>\d+) tensors from source"), "transfer_start"),
    (re.compile(r"RDMA transfer complete: (?P<n>\d+) tensors, [\d.]+ GB, (?P<s>[\d.]+)s"), "transfer_done"),
    (re.compile(r"RDMA source worker (?P<wid>\S+) failed: (?P<error>.*?)\. Trying next candidate", re.S), "attempt_failed"),
    (re.compile(r"Failed to fetch metadata for worker (?P<wid>\S+): (?P<error>.*?)\. Trying next candidate", re.S),
     "metadata_miss"),
    (re.compile(r"Strategy (?P<name>\S+) failed, trying next: (?P<error>.*)", re.S), "strategy_failed"),
    (re.compile(r"Strategy (?P<name>\S+) raised unexpected error, trying next: (?P<error>.*)", re.S), "strategy_failed"),
    (re.compile(r"Trying strategy: (?P<name>\S+)"), "strategy"),
    (re.compile(r"UpdateStatus failed: (?P<message>.*)", re.S), "rejected"),  # each heartbeat the server refused
]


class ClientObserver(logging.Handler):
    """Turns the client's log lines into harness events (see the module docstring)."""

    def __init__(self, emit: Any, worker_id: str, *, reader: bool) -> None:
        super().__init__(logging.INFO)
        self._emit = emit
        self._reader = reader
        self.worker_id = worker_id
        self.status = "UNKNOWN"
        self.strategy: str | None = None
        self.source_worker: str | None = None
        self.mx_source_id: str | None = None
        self.transfer_started: float | None = None
        self.attempt_index = 0
        self.listed = False  # a "Source selection" line was seen (the list was not empty)
        self.listing_failed = False
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed log record must not break the client
            return
        for pattern, kind in _PATTERNS:
            match = pattern.search(text)
            if match is not None:
                with self._lock:
                    self._on(kind, match)
                return

    def _transfer_failed(self, error: str, worker_id: str | None, outcome: str) -> None:
        """A candidate's transfer ended without completing: ``transfer_timeout`` when the client's
        wait ran out its budget (its message says ``timed out``), else ``transfer_error``."""
        if self.transfer_started is not None:
            seconds = round(time.monotonic() - self.transfer_started, 6)
            if "timed out" in error:
                self._emit("transfer_timeout", index=self.attempt_index, seconds=seconds, error=error)
            else:
                self._emit("transfer_error", index=self.attempt_index, seconds=seconds, error=error)
        self._emit("attempt_outcome", index=self.attempt_index, worker_id=worker_id, outcome=outcome, error=error)
        self.transfer_started = None

    def _status(self, status: str, reason: str) -> None:
        if status != self.status:
            self._emit("status_change", status=status, previous=self.status, reason=reason)
            self.status = status

    def _on(self, kind: str, m: re.Match[str]) -> None:
        if kind == "ready":
            self._emit("heartbeat", status="READY", ok=True, message="")
            self._status("READY", "heartbeat")
        elif kind == "stale_unhealthy":
            self._status("STALE", m["reason"])
        elif kind == "stale_shutdown":
            self._status("STALE", "shutdown")
        elif kind == "published":
            self.mx_source_id = m["sid"]
            self._emit("published", mx_source_id=m["sid"], worker_id=self.worker_id, mode="p2p")
        elif kind == "candidates":
            self.listed = True
            accel = m["accel"] if m["accel"] is not None else m["rank"]
            topology = {} if m["topo"] is None else {"topology_matched": int(m["topo"])}
            self._emit("candidates", listed=int(m["listed"]), rank_matched=int(m["rank"]), accelerator_matched=int(accel),
                       **topology)
        elif kind == "topology_blocked":  # the client lists nothing: no source can be proven in its domain
            self._emit("topology_blocked", domain=m["domain"])
        elif kind == "manifest_served":
            self._emit("manifest_served", method=m["method"], tensors=int(m["n"]))
        elif kind == "list_error":  # the client treats a failed ListSources as "no sources"
            self.listing_failed = True
            self._emit("candidates", listed=0, rank_matched=0, accelerator_matched=0, error=m["error"])
        elif kind == "no_source":
            if not self.listing_failed and not self.listed:  # an empty list (the client logs that at debug)
                self._emit("candidates", listed=0, rank_matched=0, accelerator_matched=0)
        elif kind == "attempt":
            self.source_worker = m["wid"]
            self.attempt_index = int(m["index"])
            self.transfer_started = None
            self._emit("attempt_start", index=self.attempt_index, mx_source_id=m["sid"], worker_id=m["wid"])
        elif kind == "transfer_start":
            self.transfer_started = time.monotonic()
            self._emit("transfer_start", index=self.attempt_index, agent_name="", bytes=0, tensors=int(m["n"]))
        elif kind == "transfer_done":
            self._emit("transfer_done", index=self.attempt_index, bytes=0, seconds=float(m["s"]))
            self._emit("attempt_outcome", index=self.attempt_index, worker_id=self.source_worker, outcome="success",
                       seconds=float(m["s"]))
            self.transfer_started = None
        elif kind == "attempt_failed":
            self._transfer_failed(m["error"], m["wid"], "transfer_retry")
        elif kind == "metadata_miss":  # GetMetadata / the manifest failed: the client moves on, no transfer began
            self._emit("attempt_outcome", index=self.attempt_index, worker_id=m["wid"], outcome="metadata_miss",
                       error=m["error"])
        elif kind == "strategy_failed":
            if m["name"] == "rdma" and self._reader:  # a source booting with no peer to copy is no fallback
                if self.transfer_started is not None:  # the last candidate failed mid-transfer
                    self._transfer_failed(m["error"], self.source_worker, "transfer_fallback")
                self._emit("fallback", reason=m["error"], checkpoint=None)
        elif kind == "strategy":
            self.strategy = m["name"]
        elif kind == "rejected":  # the client re-publishes after two in a row (#658): published follows
            self._emit("heartbeat", status=self.status, ok=False, message=m["message"])


# --- the processes ----------------------------------------------------------------------


def _add_args(p: argparse.ArgumentParser, role: str) -> None:
    p.add_argument("--name", default=role)
    p.add_argument("--events", default=os.environ.get("MXREF_EVENTS"))
    p.add_argument("--server", default=os.environ.get("MX_SERVER_ADDRESS"))
    p.add_argument("--transport", default=os.environ.get("MXREF_TRANSPORT", "ucx-tcp"))
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--advertise-host", default="127.0.0.1")
    p.add_argument("--model-name", default="mxref/synthetic")
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--tensor-mib", type=float, default=4.0)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=None)
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--heartbeat-interval", type=config.parse_seconds, default=None)
    p.add_argument("--transfer-timeout", type=config.parse_seconds, default=None)
    p.add_argument("--serve-seconds", type=config.parse_seconds, default=None)
    p.add_argument("--serve-after-load", action="store_true")
    p.add_argument("--nixl-port", type=int, default=0)
    p.add_argument("--worker-port", type=int, default=0)
    p.add_argument("--mode", choices=["p2p", "central"], default="p2p", help="central: MX_P2P_METADATA=0 (the full blob)")
    p.add_argument("--metrics-port", type=int, default=0, help="the client's /metrics (MX_METRICS_PORT; 0 picks one)")
    p.add_argument("--metrics-host", default="127.0.0.1", help="the address the harness scrapes it at")
    if role != "reader":
        p.set_defaults(start_on_stdin=False)
    else:
        p.add_argument("--start-on-stdin", action="store_true",
                       help="a storm's reader (mxref.bench.storm): print {\"ready\": ...} once imported and set up, "
                            "load on the line 'go', print the load as {\"result\": ...}")


@dataclass(frozen=True, kw_only=True)
class AdapterFlags:
    """The adapter's flags, typed (``mxref.options``): ``role`` is ``source`` or ``reader``."""

    role: str
    name: str
    events: str | None
    server: str | None
    transport: str
    rank: int
    advertise_host: str
    model_name: str
    tensors: int
    tensor_mib: float
    dtype: str
    seed: int
    data_seed: int | None
    checkpoint: Path | None
    heartbeat_interval: float | None
    transfer_timeout: float | None
    serve_seconds: float | None
    serve_after_load: bool
    nixl_port: int
    worker_port: int
    mode: str
    metrics_port: int
    metrics_host: str
    start_on_stdin: bool  # a reader's only (a source's is always False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mxref.modelexpress.adapter", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("source", "reader"):
        _add_args(sub.add_parser(role), role)
    return parser


def _environment(args: AdapterFlags, server: str) -> None:
    """The client's configuration, through its own environment variables."""
    env = os.environ
    env["MX_SERVER_ADDRESS"] = server
    env.pop("MODEL_EXPRESS_URL", None)  # it would win over MX_SERVER_ADDRESS
    env["MX_WORKER_HOST"] = args.advertise_host
    # three listeners, three ports: a port free_port released may be handed out again at once
    taken: set[int] = set()

    def distinct(given: int) -> str:
        port = given or free_port()
        for _ in range(100):
            if port not in taken:
                break
            port = free_port()
        taken.add(port)
        return str(port)

    env["MX_METADATA_PORT"] = distinct(args.nixl_port)
    env["MX_WORKER_GRPC_PORT"] = distinct(args.worker_port)
    env["MX_P2P_METADATA"] = "0" if args.mode == "central" else "1"
    # the client's own metrics (mx_p2p_*, mx_nixl_*), served for the harness's scrapes
    env["MX_METRICS_ENABLED"] = "1"
    env["MX_METRICS_PORT"] = distinct(args.metrics_port)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if args.heartbeat_interval is not None:  # the client counts whole seconds
        env["MX_HEARTBEAT_INTERVAL_SECS"] = str(max(1, round(args.heartbeat_interval)))
    if args.transfer_timeout is not None:
        env["MX_TRANSFER_TIMEOUT"] = f"{args.transfer_timeout:g}"
    applied = config.apply_transport_profile(args.transport)
    if "UCX_TLS" in env:  # the client drops a global UCX_TLS=tcp and takes NIXL_UCX_TLS instead
        env.setdefault("NIXL_UCX_TLS", env["UCX_TLS"])
    logger.info("transport %s: %s", args.transport, applied)


def _identity(args: AdapterFlags, reference: Reference) -> Any:
    # late: torch and the modelexpress client exist only in the modelexpress subject's env
    from modelexpress import p2p_pb2

    return p2p_pb2.SourceIdentity(
        mx_version="0.1.0", mx_source_type=0, model_name=args.model_name, backend_framework=1,
        tensor_parallel_size=1, pipeline_parallel_size=1, expert_parallel_size=0, dtype=args.dtype,
        revision=reference.digest,
    )


def run(args: AdapterFlags) -> int:
    """Run the role; the ``exit`` event is written at interpreter exit, after the client's own
    atexit hooks (registered later, so run earlier: STALE on shutdown, NIXL teardown)."""
    events = EventLog(args.events, args.name, args.role)
    outcome = {"code": EXIT_LOAD_FAILED}

    def emit(event: str, **fields: Any) -> None:
        log_to_stderr(events.emit(event, **fields))

    def at_exit() -> None:
        emit("exit", code=outcome["code"])
        events.close()

    atexit.register(at_exit)
    with StopSignals() as signals:
        emit("started", argv=sys.argv, version=f"modelexpress {installed_version()}", env=config.logged_env())
        outcome["code"] = _run(args, emit, signals.stop)
    return outcome["code"]


def _line(record: dict[str, Any]) -> None:
    """One JSON line on standard output in one write (a log line of another thread cannot land inside it)."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _run(args: AdapterFlags, emit: Any, stop: threading.Event) -> int:
    if not args.server:
        emit("load_failed", error="no metadata server (--server or MX_SERVER_ADDRESS)")
        return EXIT_USAGE
    _environment(args, args.server)
    # late: torch and the modelexpress client exist only in the modelexpress subject's env
    import torch
    from modelexpress.client import MxClient
    from modelexpress.load_strategy import LoadContext, run_load_strategy_chain
    from modelexpress.metrics import enable_metrics

    if enable_metrics():  # as every engine loader does on construction
        port = int(os.environ["MX_METRICS_PORT"])
        emit("listening", what="metrics", port=port, endpoint=f"{args.metrics_host}:{port}")

    tensor_bytes = int(args.tensor_mib * (1 << 20))
    tensor_bytes -= tensor_bytes % np.dtype(args.dtype).itemsize
    spec = ModelSpec(name=args.model_name, tensors=args.tensors, tensor_bytes=tensor_bytes, dtype=args.dtype,
                     seed=args.seed)
    reference = Reference.from_spec(spec)
    emit("reference", digest=reference.digest, origin="spec", tensors=len(reference.tensors))
    worker_id = uuid.uuid4().hex[:8]
    outcomes: list[str] = []

    def observed(event: str, **fields: Any) -> None:
        if event == "attempt_outcome":
            outcomes.append(str(fields.get("outcome", "")))
        emit(event, **fields)

    observer = ClientObserver(observed, worker_id, reader=args.role == "reader")
    mx_logger = logging.getLogger("modelexpress")
    mx_logger.setLevel(logging.INFO)
    mx_logger.addHandler(observer)
    engine = make_engine(spec, args.rank, _identity(args, reference), args.checkpoint, args.data_seed)
    client = MxClient(server_url=args.server)
    ctx = LoadContext(
        model_config=None, load_config=None, target_device=torch.device("cpu"), global_rank=args.rank,
        worker_rank=args.rank, local_rank=0, device_id=0, identity=engine.build_identity(), mx_client=client,
        worker_id=worker_id, mx_server_url=args.server, adapter=engine, accelerator_backend=CpuBackend(),
    )
    model = torch.nn.Module()
    storm = args.start_on_stdin
    if storm:
        _line({"ready": {"pid": os.getpid()}})
        if sys.stdin.readline().strip() != "go":
            emit("load_failed", error="--start-on-stdin: standard input ended before 'go'")
            return EXIT_USAGE
    started = time.monotonic()
    try:
        run_load_strategy_chain(model, ctx)
    except RuntimeError as exc:
        emit("load_failed", error=str(exc))
        return EXIT_LOAD_FAILED
    path = "rdma" if observer.strategy == "rdma" else "disk"
    held = {s.name: engine.arena.checksum(i) for i, s in enumerate(engine.arena.specs)}
    bad = reference.mismatches(held)
    emit("integrity", ok=not bad, tensors=len(held), bad=bad[:20])
    held_ref = Reference.from_arena(engine.arena)
    emit("memory_digest", when="loaded", digest=held_ref.digest, checksums=held)
    if ctx.nixl_manager is not None:
        emit("agent_ready", agent_name=ctx.nixl_manager.agent_name, listen_port=ctx.nixl_manager.listen_port or 0,
             backend="UCX", mem_type="DRAM", regions=len(engine.tensors), bytes=engine.arena.nbytes)
    if args.role == "reader":
        emit("load_done", path=path, source=observer.source_worker if path == "rdma" else None,
             worker_id=observer.source_worker if path == "rdma" else None, seconds=round(time.monotonic() - started, 6),
             integrity=not bad)
        if storm:
            _line({"result": {
                "ok": not bad, "path": path, "source": observer.source_worker if path == "rdma" else None,
                "integrity": "failed" if bad else "verified", "bytes": engine.arena.nbytes,
                "seconds": round(time.monotonic() - started, 6), "attempts": [{"outcome": o} for o in outcomes]}})
        if not args.serve_after_load:
            return EXIT_OK if not bad else EXIT_LOAD_FAILED
    # A source (or a reader asked to serve) keeps serving: the client's publisher thread
    # heartbeats until this process exits, when its atexit hooks mark STALE and shut down.
    deadline = None if args.serve_seconds is None else time.monotonic() + args.serve_seconds
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        stop.wait(0.5)
    emit("memory_digest", when="exit", digest=held_ref.digest,
         checksums={s.name: engine.arena.checksum(i) for i, s in enumerate(engine.arena.specs)})
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args, unknown = parse_known(build_parser(), argv, AdapterFlags)
    if unknown:
        logger.warning("ignoring options the modelexpress subject does not take: %s", " ".join(unknown))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
