"""The metadata server holding a fleet: ListSources latency and heartbeat throughput at 10k sources x 8 ranks.

``python -m mxref.bench.fleet`` runs, in this process, a ``Store`` + ``P2pServicer`` served
over real gRPC on loopback, with its ``Reaper`` thread scanning every ``--reaper-interval``
seconds. The write rate limits are raised (``ServerLimits(publish_rate_per_s=1e9,
publish_burst=10**9)``, and the same per peer address) so that heartbeats are not refused, and ``max_records`` is sized to
the fleet. It then:

1. populates the store directly (``Store.publish``, no RPC: 80k publishes over gRPC would
   take minutes on a small machine and are not what is measured) with ``--sources`` x
   ``--ranks`` READY workers spread over ``--identities`` identities, plus two silent groups
   that the reaper acts on during the run: ``--silent`` READY workers whose last heartbeat is
   just short of the heartbeat timeout (marked STALE a few seconds in) and ``--silent`` STALE
   workers just short of the GC timeout (deleted a few seconds in);
2. measures sequential ListSources latency (one client, its own connection) for one
   identity with ``status_filter=READY``, in three shapes: the whole identity, one rank of
   it (``worker_rank_filter``), the newest ``--limit`` (``limit``); idle first;
3. for ``--seconds``, sends UpdateStatus heartbeats (READY, round robin over the fleet's
   workers) from ``--clients`` connections with ``--window`` calls in flight each, as fast as
   they are answered (the server's ceiling) or, with ``--rate``, on a fixed schedule (as a
   fleet sends them: 80k workers at ModelExpress's 30 s interval send ~2.7k/s) (in this
   process by default; with ``--client-processes N``, from N other processes of
   ``--clients`` connections each, so that the server's process holds the server alone), while the
   ListSources client keeps measuring and RSS is sampled (``/proc/self/status`` VmRSS) every
   0.5 s; and, apart from gRPC, times ``Store.update_status`` alone (the store's share).

``--grpc-impl`` picks the server's gRPC (native, ``mxref.metadata.native``, by default; or grpcio); ``--native-clients``
sends the heartbeats and the listings with ``mxref_native`` from this process, without the GIL
(``NativeLister``, ``native_heartbeat_load``), so the same compiled load measures either server;
``--list-interval`` paces the listings under heartbeats. ``--full-gc-every`` sets the process's full garbage collections
(``mxref.metadata.transport.spread_full_collections``; 10 is Python's default). ``--native-lanes mixed`` serves with two
workers that each take reads and writes in turn (the native server before its read lane), for a
side-by-side figure; the full garbage collections of the heartbeat phase (``gc.callbacks``: how
many, the longest) are reported, as a listing waits for them too.

``--store redis://HOST:PORT[/DB]`` runs the same on ``RedisStore`` (a running redis-server,
e.g. ``python -m harness.subjects.redisd --dir /tmp/r --port 6390``; the database is FLUSHALLed first),
for the side-by-side figure of memory and Redis.

It prints a table, the p99 goal's verdict per shape (``p99_goal``: met by the estimate, settled
when a distribution-free 95 % interval for the p99 lies on one side of it; that takes 368
listings under heartbeats at the least), and one JSON line. The goals: ListSources p99 <= 10 ms at
10k x 8, heartbeats from 10k sources per second sustained with bounded RSS, all while the
reaper runs. All loops are bounded by counts or ``--seconds``; every call has a deadline.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from mxref import config
from mxref.bench.report import quantile_interval
from mxref.metadata.reaper import Reaper
from mxref.metadata.records import READY, STALE
from mxref.metadata.servicer import SERVICE_NAME, P2pServicer
from mxref.metadata.store import SourceStore, Store
from mxref.metadata.transport import (
    DEFAULT_GRPC_IMPL,
    FULL_COLLECTION_EVERY,
    GRPC_IMPLS,
    spread_full_collections,
    start_metadata_server,
)
from mxref.options import parse
from mxref.v1 import p2p_pb2, p2p_pb2_grpc

CALL_TIMEOUT_S = 10.0
RSS_SAMPLE_S = 0.5
_STUB: Callable[[grpc.Channel], Any] = p2p_pb2_grpc.P2pServiceStub


def own_channel(address: str) -> grpc.Channel:
    """A channel with its own connection (channels of one process otherwise share one)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1),
                                                   ("grpc.max_receive_message_length", 64 << 20)])


def rss_mib() -> float:
    """This process's resident set, MiB (``VmRSS``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fleet_identity(i: int) -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name=f"fleet/model-{i}", backend_framework=p2p_pb2.VLLM,
                                  tensor_parallel_size=8, dtype="bfloat16")


def fleet_worker(source: int, rank: int) -> p2p_pb2.WorkerMetadata:
    worker = p2p_pb2.WorkerMetadata(worker_rank=rank, agent_name=f"agent-{source}-{rank}",
                                    metadata_endpoint=f"10.0.{source % 250}.{rank}:5555",
                                    worker_grpc_endpoint=f"10.0.{source % 250}.{rank}:6555", accelerator="cuda")
    worker.tensor_source.tensors.extend(
        p2p_pb2.TensorDescriptor(name=f"layer.{t}.weight", size=1 << 20, dtype="bfloat16", shape=[512, 1024])
        for t in range(4)
    )
    return worker


class ShiftedClock:
    """``time.time`` plus an offset the population step sets (to backdate the silent groups)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


def populate(store: SourceStore, clock: ShiftedClock, args: FleetFlags,
             timers: config.ServerTimers) -> list[tuple[str, str, int]]:
    """Publish the fleet; returns the live workers as (mx_source_id, worker_id, rank)."""
    live: list[tuple[str, str, int]] = []
    identities = [fleet_identity(i) for i in range(args.identities)]
    for source in range(args.sources):
        ident = identities[source % args.identities]
        for rank in range(args.ranks):
            wid = f"src-{source}-r{rank}"
            record = store.publish(ident, fleet_worker(source, rank), wid, READY)
            live.append((record.mx_source_id, wid, rank))
    clock.offset_s = -(timers.heartbeat_timeout_s - 3.0)  # marked STALE ~3 s into the run
    for i in range(args.silent):
        store.publish(identities[i % args.identities], fleet_worker(i, 0), f"silent-{i}", READY)
    clock.offset_s = -(timers.gc_timeout_s - 5.0)  # deleted ~5 s into the run
    for i in range(args.silent):
        store.publish(identities[i % args.identities], fleet_worker(i, 0), f"gone-{i}", STALE)
    clock.offset_s = 0.0
    return live


LIST_P99_GOAL_MS = 10.0
"""ListSources p99 under heartbeats, the goal (at 10k x 8, 10k heartbeats/s)."""
P99_FEWEST = math.ceil(math.log(0.025) / math.log(0.99))
"""The fewest listings whose largest bounds the p99 from above at 95 % (0.99^n <= 2.5 %): 368."""


def quantiles_ms(values: list[float]) -> dict[str, Any]:
    """p50, p99 and max in ms, and ``p99_ci_ms``: a distribution-free 95 % interval for the p99
    (``quantile_interval``; None under ``P99_FEWEST`` values, too few to bound it from above)."""
    if len(values) < 2:
        return {"n": len(values), "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"),
                "p99_ci_ms": None}
    q = statistics.quantiles(values, n=100, method="inclusive")
    ci = quantile_interval(values, 0.99)
    return {"n": len(values), "p50_ms": round(q[49] * 1000, 3), "p99_ms": round(q[98] * 1000, 3),
            "max_ms": round(max(values) * 1000, 3),
            "p99_ci_ms": None if ci is None else [round(ci[0] * 1000, 3), round(ci[1] * 1000, 3)]}


def p99_goal(stats: dict[str, Any], goal_ms: float = LIST_P99_GOAL_MS) -> dict[str, Any]:
    """``stats`` (``quantiles_ms``) against a p99 goal: ``met`` by the estimate, ``settled`` when
    the whole 95 % interval is on one side of it."""
    p99, ci = stats["p99_ms"], stats["p99_ci_ms"]
    met = None if math.isnan(p99) else p99 <= goal_ms
    settled = ci is not None and (ci[1] <= goal_ms or ci[0] > goal_ms)
    return {"goal_ms": goal_ms, "p99_ms": p99, "ci_ms": ci, "n": stats["n"], "met": met, "settled": settled}


def goal_text(name: str, goal: dict[str, Any]) -> str:
    if goal["met"] is None:
        return f"{name}: no listings"
    ci = goal["ci_ms"]
    interval = (f"95% interval {ci[0]:g}-{ci[1]:g}" if ci is not None
                else f"no interval under {P99_FEWEST} listings, {goal['n']} here")
    return (f"{name} {goal['p99_ms']:g} ms ({interval}): {'met' if goal['met'] else 'MISSED'}, "
            f"{'settled' if goal['settled'] else 'not settled'}")


class Lister:
    """Sequential ListSources calls in the given shapes, round robin, until stopped or ``calls`` done."""

    def __init__(self, address: str, requests: dict[str, p2p_pb2.ListSourcesRequest]) -> None:
        self._channel = own_channel(address)
        self._stub = _STUB(self._channel)
        self._requests = requests
        self.sizes: dict[str, int] = {}

    def run(self, calls: int, stop: threading.Event | None = None, seconds: float = 600.0,
            interval_s: float = 0.0) -> dict[str, list[float]]:
        """Up to ``calls`` rounds, ``interval_s`` apart, until ``stop`` is set (``seconds``: for
        ``NativeLister``, which cannot watch ``stop``)."""
        out: dict[str, list[float]] = {name: [] for name in self._requests}
        for i in range(calls):
            if stop is not None and (stop.wait(interval_s) if i and interval_s else stop.is_set()):
                break
            for name, request in self._requests.items():
                started = time.perf_counter()
                response = self._stub.ListSources(request, timeout=CALL_TIMEOUT_S)
                out[name].append(time.perf_counter() - started)
                self.sizes[name] = len(response.instances)
        return out

    def close(self) -> None:
        self._channel.close()


class NativeLister:
    """``Lister``'s calls sent by ``mxref_native`` (``--native-clients``): a compiled client on a
    connection of its own, without the GIL and without parsing the answers in Python, so the
    latency is the server's as a compiled reader would see it."""

    def __init__(self, address: str, requests: dict[str, p2p_pb2.ListSourcesRequest]) -> None:
        self._address = address
        self._calls = [(name, f"/{SERVICE_NAME}/ListSources", r.SerializeToString()) for name, r in requests.items()]
        self.sizes: dict[str, int] = {}

    def run(self, calls: int, stop: threading.Event | None = None, seconds: float = 600.0,
            interval_s: float = 0.0) -> dict[str, list[float]]:
        import mxref_native

        got = mxref_native.unary_latencies(self._address, self._calls, rounds=calls, seconds=seconds,
                                           timeout_s=CALL_TIMEOUT_S, interval_s=interval_s)
        for name, (_, last) in got.items():
            self.sizes[name] = len(p2p_pb2.ListSourcesResponse.FromString(last).instances)
        return {name: got[name][0] if name in got else [] for name, _, _ in self._calls}

    def close(self) -> None:
        pass


ACCEPTED_PREFIX = p2p_pb2.UpdateStatusResponse(success=True).SerializeToString()
"""How an accepted heartbeat's answer begins (``success = true`` is field 1, first on the wire)."""


def native_heartbeat_load(address: str, live: list[tuple[str, str, int]], args: FleetFlags) -> dict[str, Any]:
    """``heartbeat_load`` sent by ``mxref_native`` from this process (``--native-clients``): the
    same connections, window, rate and round robin, the counts in the same shape."""
    import mxref_native

    requests = [p2p_pb2.UpdateStatusRequest(mx_source_id=sid, worker_id=wid, worker_rank=rank,
                                            status=READY).SerializeToString() for sid, wid, rank in live]
    counts = mxref_native.unary_load(address, f"/{SERVICE_NAME}/UpdateStatus", requests, connections=args.clients,
                                     window=args.window, seconds=args.seconds, rate=args.rate,
                                     timeout_s=CALL_TIMEOUT_S, accepted=ACCEPTED_PREFIX)
    seconds = counts.pop("seconds")
    ok, rejected = int(counts.pop("ok", 0)), int(counts.pop("refused", 0))
    codes = {code.value[0]: code.name for code in grpc.StatusCode}  # the names heartbeat_load counts by
    failed = {codes.get(int(k.split(":")[1]), k) if k.startswith("status:") else k: int(v) for k, v in counts.items()}
    return {"ok": ok, "rejected": rejected, **failed, "seconds": round(seconds, 2), "per_s": round(ok / seconds, 1)}


class Pacer:
    """Sends at ``per_s`` on a fixed schedule (open loop): ``wait`` sleeps until the next send is
    due. A schedule more than ``MAX_BEHIND_S`` behind starts again from now (no catch-up burst).
    ``mxref_native.unary_load`` (``--native-clients``) keeps the same rule in Rust."""

    MAX_BEHIND_S = 1.0

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = 1.0 / per_s
        self._clock = clock
        self._next = clock()

    def wait(self, stop: threading.Event) -> bool:
        """Sleep until the next send is due; False if ``stop`` was set meanwhile."""
        now = self._clock()
        if now - self._next > self.MAX_BEHIND_S:
            self._next = now
        delay = self._next - now
        self._next += self._interval
        return not (stop.wait(delay) if delay > 0 else stop.is_set())


def heartbeat_load(address: str, live: list[tuple[str, str, int]], args: FleetFlags,
                   stop: threading.Event) -> dict[str, Any]:
    """UpdateStatus from ``--clients`` connections, ``--window`` in flight each, until ``stop``;
    counts and the achieved rate."""
    lock = threading.Lock()
    counts: dict[str, int] = {"ok": 0, "rejected": 0}
    next_index = [0]

    def take() -> tuple[str, str, int]:
        with lock:
            i = next_index[0]
            next_index[0] = i + 1
        return live[i % len(live)]

    def client() -> None:
        with own_channel(address) as channel:
            stub = _STUB(channel)
            slots = threading.Semaphore(args.window)

            def done(future: grpc.Future) -> None:
                exc = future.exception()
                if exc is None:
                    key = "ok" if future.result().success else "rejected"
                else:
                    code = exc.code() if isinstance(exc, grpc.Call) else None
                    key = code.name if code is not None else type(exc).__name__
                    if key not in counts and isinstance(exc, grpc.Call):
                        print(f"heartbeat {key}: {exc.details()}", file=sys.stderr)
                with lock:
                    counts[key] = counts.get(key, 0) + 1
                slots.release()

            pace = Pacer(args.rate / (args.clients * max(1, args.client_processes))) if args.rate else None
            while not stop.is_set():
                if pace is not None and not pace.wait(stop):
                    break
                if not slots.acquire(timeout=0.5):
                    continue
                sid, wid, rank = take()
                request = p2p_pb2.UpdateStatusRequest(mx_source_id=sid, worker_id=wid, worker_rank=rank, status=READY)
                stub.UpdateStatus.future(request, timeout=CALL_TIMEOUT_S).add_done_callback(done)
            for _ in range(args.window):  # the calls in flight finish (each has a deadline)
                slots.acquire(timeout=CALL_TIMEOUT_S + 1)

    threads = [threading.Thread(target=client, name=f"hb-{i}") for i in range(args.clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    stop.wait(args.seconds)
    stop.set()
    for thread in threads:
        thread.join(CALL_TIMEOUT_S + 5)
    elapsed = time.perf_counter() - started
    return {**counts, "seconds": round(elapsed, 2), "per_s": round(counts["ok"] / elapsed, 1)}


def _heartbeat_process(address: str, live: list[tuple[str, str, int]], args: FleetFlags,
                       results: Any) -> None:
    """A heartbeat client process (``--client-processes``): its ``heartbeat_load`` into ``results``."""
    results.put(heartbeat_load(address, live, args, threading.Event()))


def heartbeat_processes(address: str, live: list[tuple[str, str, int]], args: FleetFlags,
                        stop: threading.Event) -> dict[str, Any]:
    """``heartbeat_load`` from ``--client-processes`` processes (each its ``--clients``
    connections, a share of the fleet's workers), so that the server's process holds the server
    alone; their counts summed, ``stop`` set when they are done. Every child is joined or killed."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process running gRPC threads
    results = ctx.Queue()
    n = args.client_processes
    children = [ctx.Process(target=_heartbeat_process, args=(address, live[i::n], args, results), daemon=True)
                for i in range(n)]
    try:
        for child in children:
            child.start()
        parts = [results.get(timeout=args.seconds + CALL_TIMEOUT_S + 60) for _ in children]
    finally:
        stop.set()
        for child in children:
            if child.pid is None:  # its start failed: nothing to join (the error goes on up)
                continue
            child.join(CALL_TIMEOUT_S)
            if child.is_alive():
                child.kill()
                child.join(5)
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key not in ("seconds", "per_s"):
                total[key] = total.get(key, 0) + value
    total["seconds"] = max(part["seconds"] for part in parts)
    total["per_s"] = round(sum(part["per_s"] for part in parts), 1)
    total["processes"] = n
    return total


class FullCollections:
    """The full (generation 2) garbage collections while ``on``: how many, and the longest, ms."""

    def __init__(self) -> None:
        self.on = False
        self._started = 0.0
        self.pauses_ms: list[float] = []

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on or info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._started) * 1000)

    def summary(self) -> dict[str, float]:
        return {"n": len(self.pauses_ms), "max_ms": round(max(self.pauses_ms, default=0.0), 1)}


def store_heartbeat_rate(store: SourceStore, live: list[tuple[str, str, int]], seconds: float) -> float:
    """``Store.update_status`` calls per second from one thread, no RPC (the store's own cost)."""
    n = 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        for sid, wid, rank in live[n % len(live): n % len(live) + 1000]:
            store.update_status(sid, wid, rank, READY)
            n += 1
    return n / (time.perf_counter() - started)


@dataclass(frozen=True, kw_only=True)
class FleetFlags:
    """``python -m mxref.bench.fleet``'s flags, typed (``mxref.options``)."""

    sources: int
    ranks: int
    identities: int
    silent: int
    limit: int
    idle_calls: int
    seconds: float
    clients: int
    window: int
    grpc_impl: str
    native_lanes: str
    full_gc_every: int
    native_clients: bool
    list_interval: float
    rate: float
    client_processes: int
    reaper_interval: float
    heartbeat_timeout: float
    gc_timeout: float
    label: str
    store: str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxref.bench.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--identities", type=int, default=16, help="identities the sources spread over")
    parser.add_argument("--silent", type=int, default=2000, help="workers in each silent group (reaped mid-run)")
    parser.add_argument("--limit", type=int, default=16, help="the limit of the 'newest' list shape")
    parser.add_argument("--idle-calls", type=int, default=200, help="ListSources rounds while idle")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the heartbeat phase")
    parser.add_argument("--clients", type=int, default=4, help="heartbeat connections")
    parser.add_argument("--window", type=int, default=6,
                        help="heartbeats in flight per connection (the server allows 8 streams per connection)")
    parser.add_argument("--grpc-impl", choices=GRPC_IMPLS, default=DEFAULT_GRPC_IMPL,
                        help=f"the server's gRPC: native (mxref.metadata.native) or grpcio (default {DEFAULT_GRPC_IMPL})")
    parser.add_argument("--native-lanes", choices=("split", "mixed"), default="split",
                        help="native server: a worker for the reads and one for the writes, the writer yielding "
                             "to open reads (split, the default), or two workers of both kinds (mixed, as before)")
    parser.add_argument("--full-gc-every", type=int, default=FULL_COLLECTION_EVERY, metavar="N",
                        help="young collections between two full ones in this process, as the server sets it "
                             f"(default {FULL_COLLECTION_EVERY}; Python's own: 10)")
    parser.add_argument("--native-clients", action="store_true",
                        help="send the heartbeats and the listings with mxref_native from this process (no GIL): "
                             "the same compiled load against either --grpc-impl")
    parser.add_argument("--list-interval", type=float, default=0.0, metavar="SECONDS",
                        help="pause between ListSources rounds under heartbeats (default 0: back to back, "
                             "the most listing load; a fleet lists when readers start)")
    parser.add_argument("--rate", type=float, default=0.0, metavar="PER_S",
                        help="heartbeats per second in all, on a fixed schedule (open loop, as a fleet sends "
                             "them); default 0: as fast as the server answers (closed loop, its ceiling)")
    parser.add_argument("--client-processes", type=int, default=0, metavar="N",
                        help="send the heartbeats from N processes of --clients connections each, so the "
                             "server's process holds the server alone (default 0: in this process)")
    parser.add_argument("--reaper-interval", type=float, default=1.0)
    parser.add_argument("--heartbeat-timeout", type=float, default=120.0)
    parser.add_argument("--gc-timeout", type=float, default=240.0)
    parser.add_argument("--label", default="", help="a name for this run in the JSON (before/after)")
    parser.add_argument("--store", default="memory", metavar="URL",
                        help="memory (default) or redis://HOST:PORT[/DB] (FLUSHALLed first)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv, FleetFlags)
    for flag in ("sources", "ranks", "identities", "clients", "window"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)}: must be >= 1")
    if args.full_gc_every < 1:
        parser.error(f"--full-gc-every {args.full_gc_every}: must be >= 1")
    if args.client_processes < 0 or args.silent < 0 or args.rate < 0 or args.list_interval < 0:
        parser.error("--client-processes, --silent, --rate and --list-interval must be >= 0")
    if args.native_clients and args.client_processes:
        parser.error("--native-clients sends from this process without the GIL: no --client-processes")

    timers = config.ServerTimers(heartbeat_timeout_s=args.heartbeat_timeout,
                                 reaper_scan_interval_s=args.reaper_interval, gc_timeout_s=args.gc_timeout)
    limits = config.ServerLimits(publish_rate_per_s=1e9, publish_burst=10**9,
                                 peer_publish_rate_per_s=1e9, peer_publish_burst=10**9,
                                 max_records=args.sources * args.ranks + 2 * args.silent + 1,
                                 peer_share=1.0, new_peer_headroom=0.0)  # the whole fleet publishes from here
    clock = ShiftedClock()
    store: SourceStore
    if args.store == "memory":
        store = Store(clock, max_records=limits.max_records)
    else:
        from mxref.metadata.redis_store import RedisStore

        store = RedisStore(args.store, clock, max_records=limits.max_records, timeout_s=CALL_TIMEOUT_S)
        store.flushall()
    rss_start = rss_mib()
    t = time.perf_counter()
    live = populate(store, clock, args, timers)
    populate_s = time.perf_counter() - t
    rss_populated = rss_mib()
    servicer = P2pServicer(store, timers, limits=limits)
    server: Any
    if args.grpc_impl == "native" and args.native_lanes == "mixed":
        from mxref.metadata.native import MIXED_LANES, NativeMetadataServer

        server = NativeMetadataServer(servicer, "127.0.0.1", 0, lanes=MIXED_LANES)
        port = server.port
    else:
        server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl=args.grpc_impl)
    spread_full_collections(args.full_gc_every)
    address = f"127.0.0.1:{port}"
    reaper = Reaper(store, timers)
    ident = fleet_identity(0)
    shapes = {
        "identity": p2p_pb2.ListSourcesRequest(identity=ident, status_filter=READY),
        "identity+rank": p2p_pb2.ListSourcesRequest(identity=ident, status_filter=READY, worker_rank_filter=3),
        f"identity+limit{args.limit}": p2p_pb2.ListSourcesRequest(identity=ident, status_filter=READY,
                                                                  limit=args.limit),
    }
    lister: Lister | NativeLister = NativeLister(address, shapes) if args.native_clients else Lister(address, shapes)
    collections = FullCollections()
    try:
        lister.run(10)  # warm up
        reaper.start()
        idle = lister.run(args.idle_calls)
        stop = threading.Event()
        gc.callbacks.append(collections)
        collections.on = True
        loaded: dict[str, list[float]] = {}
        rss: list[float] = []

        def list_under_load() -> None:
            loaded.update(lister.run(10**9, stop, seconds=args.seconds, interval_s=args.list_interval))

        def sample_rss() -> None:
            while not stop.wait(RSS_SAMPLE_S):
                rss.append(rss_mib())

        side = [threading.Thread(target=list_under_load), threading.Thread(target=sample_rss)]
        for thread in side:
            thread.start()
        if args.native_clients:
            heartbeats = native_heartbeat_load(address, live, args)
            stop.set()
        elif args.client_processes:
            heartbeats = heartbeat_processes(address, live, args, stop)
        else:
            heartbeats = heartbeat_load(address, live, args, stop)
        for thread in side:
            thread.join(CALL_TIMEOUT_S + 5)
        collections.on = False
        reaped = {"stale": store.count(STALE), "records": len(store)}
        store_rate = store_heartbeat_rate(store, live, 2.0)
        t = time.perf_counter()
        store.reap(timers)  # one scan with (almost) nothing left to do: what each interval costs
        reap_scan_ms = (time.perf_counter() - t) * 1000
    finally:
        if collections in gc.callbacks:
            gc.callbacks.remove(collections)
        lister.close()
        assert reaper.stop(10)
        server.stop(1).wait(5)
    result: dict[str, Any] = {
        "label": args.label, "store": args.store, "grpc_impl": args.grpc_impl,
        "native_lanes": args.native_lanes if args.grpc_impl == "native" else None,
        "full_gc_every": args.full_gc_every,
        "clients": "native" if args.native_clients else "python", "heartbeat_rate": args.rate or "closed loop", "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "records": args.sources * args.ranks, "identities": args.identities, "populate_s": round(populate_s, 2),
        "list_sizes": lister.sizes,
        "list_idle": {name: quantiles_ms(v) for name, v in idle.items()},
        "list_under_heartbeats": {name: quantiles_ms(v) for name, v in loaded.items()},
        "heartbeats_grpc": heartbeats,
        "heartbeats_store_only_per_s": round(store_rate),
        "full_gc_under_heartbeats": collections.summary(),
        "reap_scan_ms": round(reap_scan_ms, 2),
        "rss_mib": {"start": round(rss_start), "populated": round(rss_populated),
                    "during_min": round(min(rss)) if rss else None, "during_max": round(max(rss)) if rss else None},
        "after_run": reaped,
    }
    result["goals"] = {name: p99_goal(stats) for name, stats in result["list_under_heartbeats"].items()}
    lanes = f" ({args.native_lanes} lanes)" if args.grpc_impl == "native" else ""
    print(f"fleet on {args.store}, server gRPC {args.grpc_impl}{lanes}, {result['clients']} clients: {result['records']} workers over {args.identities} identities, reaper every "
          f"{args.reaper_interval:g}s; cpus={result['cpus']} load={result['load_avg_1m']}")
    print(f"{'ListSources shape':<22}{'refs':>7}{'idle p50':>10}{'idle p99':>10}{'load p50':>10}{'load p99':>10}"
          f"{'load n':>8}")
    for name in shapes:
        i, lo = result["list_idle"][name], result["list_under_heartbeats"].get(name, quantiles_ms([]))
        print(f"{name:<22}{lister.sizes.get(name, 0):>7}{i['p50_ms']:>10}{i['p99_ms']:>10}{lo['p50_ms']:>10}"
              f"{lo['p99_ms']:>10}{lo['n']:>8}")
    if result["goals"]:
        print(f"ListSources p99 under heartbeats, goal <= {LIST_P99_GOAL_MS:g} ms: "
              + "; ".join(goal_text(name, goal) for name, goal in result["goals"].items()))
    target = f"at a target of {args.rate:g}/s" if args.rate else "closed loop (as fast as answered)"
    print(f"heartbeats over gRPC, {target}: {heartbeats['per_s']}/s sustained for {heartbeats['seconds']}s "
          f"({', '.join(f'{k} {v}' for k, v in heartbeats.items() if k not in ('seconds', 'per_s'))}); "
          f"Store.update_status alone: {result['heartbeats_store_only_per_s']}/s; one reaper scan: {result['reap_scan_ms']} ms; "
          f"full garbage collections meanwhile: {collections.summary()}")
    print(f"RSS MiB: start {result['rss_mib']['start']}, populated {result['rss_mib']['populated']}, "
          f"during heartbeats {result['rss_mib']['during_min']}..{result['rss_mib']['during_max']}; "
          f"after the run: {reaped}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
