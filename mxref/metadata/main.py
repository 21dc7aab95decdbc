"""The ``server`` role: its flags, and ``run_server``, which wires store, servicer, reaper and
transport into a process that writes lifecycle events, serves /metrics, and stops on
SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from mxref import __version__, config, front_door, security
from mxref.errors import LocalError
from mxref.events import EventLog, log_to_stderr
from mxref.metadata.ownership import MX_WRITES, MxWrites, OwnerBook, WriteGate
from mxref.metadata.reaper import Reaper
from mxref.metadata.records import EventJournal, StoreListener, StoreUnavailable
from mxref.metadata.redis_store import RedisStore
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import SourceStore, Store
from mxref.metadata.transport import DEFAULT_GRPC_IMPL, GRPC_IMPLS, refusal_reporter, start_metadata_server
from mxref.metrics import ServerFamilies, ServerMetrics
from mxref.options import ServerFlags
from mxref.process import EXIT_OK, EXIT_SERVING_ENDED, EXIT_STARTUP_FAILED, EXIT_USAGE, StopSignals
from mxref.rpc import endpoint

logger = logging.getLogger("mxref.metadata")


SHUTDOWN_GRACE_S = 2.0
RUN_LOOP_TICK_S = 0.5

def _seconds(text: str) -> float:
    try:
        return config.parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _integer(low: int, high: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer in ``low..high``; the error names the value and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return parse


_positive_int = _integer(1, sys.maxsize)
_rank = _integer(0, 0xFFFFFFFF, "a worker rank (a uint32)")
_port = _integer(0, 65535, "a port number")


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def _fraction(low: float, high: float, *, low_open: bool = True, high_open: bool = True) -> Callable[[str], float]:
    """An argparse type: a number between ``low`` and ``high`` (each end excluded when open)."""
    span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low) or (
                high_open and value == high):
            raise argparse.ArgumentTypeError(f"{text!r} is outside {span}")
        return value

    return parse


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The ``server`` subcommand's flags (timers: flag over env over default)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=0, help="gRPC port; 0 picks a free one (default 0)")
    parser.add_argument("--metrics-port", type=_port, default=0, help="/metrics port; 0 picks one (default 0)")
    parser.add_argument("--metrics-host", default=None,
                        help="address /metrics binds (default: the --host address, itself 127.0.0.1 by default)")
    parser.add_argument(
        "--heartbeat-timeout", type=_seconds, default=None, metavar="SECONDS",
        help=f"age at which a live record is stale [MX_HEARTBEAT_TIMEOUT_SECS, {config.DEFAULT_HEARTBEAT_TIMEOUT_S:g}]",
    )
    parser.add_argument(
        "--reaper-interval", type=_seconds, default=None, metavar="SECONDS",
        help=f"reaper scan interval [MX_REAPER_SCAN_INTERVAL_SECS, {config.DEFAULT_REAPER_SCAN_INTERVAL_S:g}]",
    )
    parser.add_argument(
        "--gc-timeout", type=_seconds, default=None, metavar="SECONDS",
        help=f"age at which a STALE record is deleted [MX_GC_TIMEOUT_SECS, {config.DEFAULT_GC_TIMEOUT_S:g}]",
    )
    parser.add_argument("--store", default="memory", metavar="URL",
                        help="where records live: 'memory' (default) or redis://HOST:PORT[/DB] "
                             "(ModelExpress's Redis key layout; mxref.metadata.redis_store)")
    parser.add_argument("--store-timeout", type=_seconds, default=1.0, metavar="SECONDS",
                        help="bound on one Redis socket operation (default 1; one retry)")
    parser.add_argument("--grpc-impl", choices=GRPC_IMPLS, default=DEFAULT_GRPC_IMPL,
                        help=f"native: gRPC framed in Rust (mxref_native), several times grpcio's calls per "
                             f"second (docs/mxref.md: Server at fleet scale); or grpcio, Python's (default {DEFAULT_GRPC_IMPL})")
    add_tls_server_args(parser)
    limits = parser.add_argument_group("limits (docs/mxref.md: Server limits)")
    default = config.ServerLimits()
    limits.add_argument("--max-message-bytes", type=_positive_int, default=default.max_message_bytes, metavar="N",
                        help=f"largest request gRPC accepts (default {default.max_message_bytes})")
    limits.add_argument("--max-blob-bytes", type=_positive_int, default=default.max_blob_bytes, metavar="N",
                        help=f"largest worker.nixl_metadata (default {default.max_blob_bytes})")
    limits.add_argument("--max-name-bytes", type=_positive_int, default=default.max_name_bytes, metavar="N",
                        help=f"longest model/worker/agent name or source id, UTF-8 (default {default.max_name_bytes})")
    limits.add_argument("--max-tensors", type=_positive_int, default=default.max_tensors, metavar="N",
                        help=f"most tensor descriptors in one list (default {default.max_tensors})")
    limits.add_argument("--max-worker-rank", type=_rank, default=default.max_worker_rank, metavar="N",
                        help=f"highest worker_rank accepted (default {default.max_worker_rank})")
    limits.add_argument("--publish-rate", type=_rate, default=default.publish_rate_per_s, metavar="PER_S",
                        help="PublishMetadata + UpdateStatus calls per second per client connection "
                             f"(default {default.publish_rate_per_s:g})")
    limits.add_argument("--publish-burst", type=_positive_int, default=default.publish_burst, metavar="N",
                        help=f"writes a client may send back to back (default {default.publish_burst})")
    limits.add_argument("--max-records", type=_positive_int, default=default.max_records, metavar="N",
                        help=f"worker records the store holds (default {default.max_records})")
    limits.add_argument("--max-record-bytes", type=_positive_int, default=default.max_record_bytes, metavar="N",
                        help=f"largest PublishMetadata request, the record it stores (default {default.max_record_bytes})")
    limits.add_argument("--max-store-bytes", type=_positive_int, default=default.max_store_bytes, metavar="N",
                        help=f"bytes of all records together, each its publish's size (default {default.max_store_bytes})")
    limits.add_argument("--peer-publish-rate", type=_rate, default=default.peer_publish_rate_per_s, metavar="PER_S",
                        help="writes per second per peer address, all its connections together "
                             f"(default {default.peer_publish_rate_per_s:g})")
    limits.add_argument("--peer-publish-burst", type=_positive_int, default=default.peer_publish_burst, metavar="N",
                        help=f"writes one peer address may send back to back (default {default.peer_publish_burst})")
    limits.add_argument("--peer-share", type=_fraction(0.0, 1.0, high_open=False), default=default.peer_share,
                        metavar="FRACTION",
                        help="the part of --max-records and of --max-store-bytes the records published from one "
                             f"peer address (an IPv6 /64) may hold (default {default.peer_share:g})")
    limits.add_argument("--new-peer-headroom", type=_fraction(0.0, 1.0, low_open=False),
                        default=default.new_peer_headroom, metavar="FRACTION",
                        help="the part of both budgets kept for peers that hold no record yet "
                             f"(default {default.new_peer_headroom:g}; docs/security.md)")
    limits.add_argument("--mx-writes", choices=MX_WRITES, default=MxWrites.TRUSTED.value,
                        help="model_express.p2p writes, which carry no owner secret: trusted (first come; never "
                             "over an mxref publisher's record) or refused (docs/security.md; default trusted)")


def server_limits(args: ServerFlags) -> config.ServerLimits:
    """The ``ServerLimits`` of the parsed flags; ``ValueError`` naming an inconsistent pair."""
    return config.ServerLimits(
        max_message_bytes=args.max_message_bytes,
        max_blob_bytes=args.max_blob_bytes,
        max_name_bytes=args.max_name_bytes,
        max_tensors=args.max_tensors,
        max_worker_rank=args.max_worker_rank,
        publish_rate_per_s=args.publish_rate,
        publish_burst=args.publish_burst,
        max_records=args.max_records,
        max_record_bytes=args.max_record_bytes,
        max_store_bytes=args.max_store_bytes,
        peer_publish_rate_per_s=args.peer_publish_rate,
        peer_publish_burst=args.peer_publish_burst,
        peer_share=args.peer_share,
        new_peer_headroom=args.new_peer_headroom,
    )


def add_tls_server_args(parser: argparse.ArgumentParser) -> None:
    """``--tls-cert``/``--tls-key``/``--token-file``: a server's credentials (default: plaintext)."""
    g = parser.add_argument_group("control-plane security (default: plaintext, no token)")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate (chain)")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's private key")
    g.add_argument("--token-file", default=None, metavar="PATH",
                   help="refuse calls without 'authorization: Bearer <this file's token>' (needs TLS)")
    g.add_argument("--reader-token-file", default=None, metavar="PATH",
                   help="also accept this file's token, for reads only: its PublishMetadata and UpdateStatus "
                        "are PERMISSION_DENIED (needs --token-file)")


def run_server(args: ServerFlags, stop: threading.Event | None = None) -> int:
    """Run the metadata server until SIGTERM/SIGINT (or ``stop`` is set); returns the exit code.

    ``args``: the flags of ``add_server_args``, typed (``mxref.options.ServerFlags``).
    Exit codes (``mxref.process``): 0 after a clean stop, 2 when the credentials cannot be used,
    3 when an address cannot be bound.
    """
    events = EventLog(args.events, args.name, "server")
    try:
        return _run(args, events, stop)
    finally:
        events.close()


def _run(args: ServerFlags, events: EventLog, stop: threading.Event | None) -> int:
    def emit(event: str, **fields: Any) -> None:
        log_to_stderr(events.emit(event, **fields))

    timers = config.ServerTimers.resolve(args.heartbeat_timeout, args.reaper_interval, args.gc_timeout)
    try:
        limits = server_limits(args)
    except ValueError as exc:  # an inconsistent pair of limit flags
        logger.error("%s", exc)
        emit("exit", code=EXIT_USAGE, error=str(exc))
        return EXIT_USAGE
    emit("started", argv=sys.argv, version=__version__, env=config.logged_env(), timers=dataclasses.asdict(timers))
    try:
        credentials = security.ServerCredentials.from_files(
            args.tls_cert, args.tls_key, args.token_file, args.reader_token_file,
        )
    except security.SecurityError as exc:
        logger.error("%s", exc)
        emit("exit", code=EXIT_USAGE, error=str(exc))
        return EXIT_USAGE
    logger.info("limits: %s", dataclasses.asdict(limits))
    metrics = ServerMetrics()
    try:
        store_url = args.store
        store = open_store(store_url, EventJournal(events), limits.max_records,
                           args.store_timeout, metrics.server)
    except ValueError as exc:
        logger.error("%s", exc)
        emit("exit", code=EXIT_USAGE, error=str(exc))
        return EXIT_USAGE
    emit("store", url=store_url, reachable=store_reachable(store))
    owners = OwnerBook(MxWrites(args.mx_writes), max_entries=2 * limits.max_records)
    servicer = P2pServicer(store, timers, metrics=metrics.server, limits=limits, owners=owners,
                           write_gate=WriteGate(credentials.reader_token))
    reaper = Reaper(store, timers, metrics=metrics.server, on_deleted=servicer.forget)
    code, error = EXIT_OK, ""
    grpc_impl = args.grpc_impl
    refusals = refusal_reporter(emit, metrics.server)
    with StopSignals(stop) as signals:
        try:
            server, port = start_metadata_server(servicer, args.host, args.port, credentials=credentials,
                                                 on_refused=refusals.report, grpc_impl=grpc_impl)
        except LocalError as exc:
            refusals.close()
            logger.error("%s", exc)
            emit("exit", code=EXIT_STARTUP_FAILED, error=str(exc))
            return EXIT_STARTUP_FAILED
        try:
            emit("listening", what="grpc", port=port, endpoint=endpoint(args.host, port), grpc_impl=grpc_impl)
            metrics_host = args.metrics_host or args.host
            try:
                metrics_port = metrics.serve(args.metrics_port, metrics_host)
            except OSError as exc:
                error = f"metrics: cannot bind {endpoint(metrics_host, args.metrics_port)}: {exc}"
                logger.error("%s", error)
                code = EXIT_STARTUP_FAILED
            else:
                emit("listening", what="metrics", port=metrics_port, endpoint=endpoint(metrics_host, metrics_port))
                reaper.start()
                while not signals.stop.wait(RUN_LOOP_TICK_S):
                    failure = front_door.serving_failure(server)
                    if failure is not None:
                        error, code = f"the gRPC server stopped serving: {failure}", EXIT_SERVING_ENDED
                        logger.error("%s", error)
                        break
                if signals.received is not None:
                    emit("signal", signum=signals.received, name=signal.Signals(signals.received).name)
        finally:
            reaper.stop()
            metrics.close()
            stopped = server.stop(SHUTDOWN_GRACE_S).wait(SHUTDOWN_GRACE_S + 3.0)
            refusals.close()
            emit("shutdown_step", step="stop_server", ok=stopped, detail=f"grace {SHUTDOWN_GRACE_S:g}s")
    emit("exit", code=code, **({"error": error} if error else {}))
    return code


def open_store(
    url: str, listener: StoreListener, max_records: int | None, timeout_s: float, metrics: ServerFamilies
) -> SourceStore:
    """``memory`` (the default: ``Store``) or ``redis://HOST:PORT[/DB]`` (``RedisStore``, whose
    failures count in ``mxref_server_store_errors_total`` and ``mxref_server_store_up``).
    ``ValueError`` naming the value when it is neither."""
    if url == "memory":
        return Store(listener=listener, max_records=max_records)
    def failed(op: str, exc: Exception) -> None:
        metrics.store_errors.labels(op).inc()
        metrics.store_up.set(0)

    return RedisStore(url, listener=listener, max_records=max_records, timeout_s=timeout_s,
                      on_error=failed, on_ok=lambda: metrics.store_up.set(1))


def store_reachable(store: SourceStore) -> bool:
    """One full read at startup (also primes the counts); false when the backend fails."""
    try:
        store.snapshot()
    except StoreUnavailable as exc:
        logger.warning("the store is unreachable at startup (the server runs, answering negatively): %s", exc)
        return False
    return True

