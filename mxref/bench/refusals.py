"""How a source's heartbeats fare while a peer without the token floods the metadata server.

``python -m mxref.bench.refusals`` starts a real ``python -m mxref server`` with TLS and a
bearer token on loopback, once per gRPC implementation (``--grpc-impl``, default both),
publishes one source worker with the token, and measures its heartbeats (UpdateStatus, one
connection, sequential, ``--interval`` apart) in alternating windows: idle, then while this
process floods ListSources without a token (``--connections`` TLS connections with
``--window`` calls in flight each, every one refused UNAUTHENTICATED; as fast as answered, or
``--rate`` calls a second: the same flood for both implementations). Heartbeats and flood
are sent by ``mxref_native`` from this process, without the GIL. One JSON line per server::

    {"grpc_impl": "native", "idle_p50_ms": ..., "idle_p99_ms": ..., "flood_p50_ms": ...,
     "flood_p99_ms": ..., "flood_max_ms": ..., "p99_ratio": ..., "refused_per_s": ...,
     "unauthenticated_lines": ..., "refusals_counted": ..., "status": "READY"}

The goal (issue 21): ``p99_ratio`` <= 3 on both. ``status`` is the worker's after the floods
(SOURCE_STATUS_READY: no heartbeat was starved past the reaper's timeout); ``unauthenticated_lines`` the
event lines the refusals cost, ``refusals_counted`` the refusals those lines count.
Credentials: ``--tls-cert/--tls-key/--tls-ca/--token-file``, else a throwaway set
(``mxref.pki``) in the run's temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxref.bench.flood import Server, p99
from mxref.metadata.modelexpress import MX_SERVICE_NAME
from mxref.metadata.servicer import SERVICE_NAME
from mxref.metadata.transport import GRPC_IMPLS
from mxref.options import parse
from mxref.v1 import p2p_pb2

READY = p2p_pb2.SourceStatus.Value("SOURCE_STATUS_READY")
UNAUTHENTICATED = 16
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Creds:
    """The files a server and its clients use."""

    cert: Path
    key: Path
    ca: Path
    token: Path

    def server_flags(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--token-file", str(self.token)]

    def authorization(self) -> str:
        return f"Bearer {self.token.read_text().strip()}"


def publish(address: str, creds: Creds, worker_id: str = "w-heartbeat") -> tuple[str, str, str]:
    """Publish one worker with the token; (mx_source_id, worker_id, owner_secret: what its
    heartbeats must carry, as the record's owner)."""
    import mxref_native

    request = p2p_pb2.PublishMetadataRequest(
        identity=p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="bench/refusals", dtype="float16"),
        worker=p2p_pb2.WorkerMetadata(worker_rank=0, worker_grpc_endpoint="127.0.0.1:1", accelerator="cpu"),
        worker_id=worker_id)
    got = mxref_native.unary_latencies(
        address, [("publish", f"/{SERVICE_NAME}/PublishMetadata", request.SerializeToString())], rounds=1,
        seconds=CALL_TIMEOUT_S, timeout_s=CALL_TIMEOUT_S, ca_pem=creds.ca.read_bytes(),
        authorization=creds.authorization())
    response = p2p_pb2.PublishMetadataResponse.FromString(got["publish"][1])
    if not response.success:
        raise RuntimeError(f"publish refused: {response.message}")
    return response.mx_source_id, worker_id, response.owner_secret


def heartbeats(address: str, creds: Creds, record: tuple[str, str, str], seconds: float, interval_s: float,
               timeout_s: float = CALL_TIMEOUT_S) -> tuple[list[float], int]:
    """Each heartbeat's seconds for ``seconds``, and the worker's status after the last (a
    failed heartbeat raises, naming its code)."""
    import mxref_native

    sid, wid, secret = record
    beat = p2p_pb2.UpdateStatusRequest(mx_source_id=sid, worker_id=wid, worker_rank=0, status=READY, owner_secret=secret)
    got = mxref_native.unary_latencies(
        address, [("heartbeat", f"/{SERVICE_NAME}/UpdateStatus", beat.SerializeToString()),
                  ("get", f"/{SERVICE_NAME}/GetMetadata",
                   p2p_pb2.GetMetadataRequest(mx_source_id=sid, worker_id=wid).SerializeToString())],
        rounds=1_000_000, seconds=seconds, timeout_s=timeout_s, interval_s=interval_s,
        ca_pem=creds.ca.read_bytes(), authorization=creds.authorization())
    latencies, _ = got["heartbeat"]
    found = p2p_pb2.GetMetadataResponse.FromString(got["get"][1])
    return latencies, int(found.worker.status) if found.found else -1


def unauthenticated_flood(address: str, creds: Creds, seconds: float, connections: int, window: int,
                          rate: float = 0.0) -> dict[str, float]:
    """ListSources of both packages without a token, closed loop (or ``rate`` calls a second in
    all, on a fixed schedule); the counts by outcome."""
    import mxref_native

    empty = p2p_pb2.ListSourcesRequest().SerializeToString()
    half = max(1, connections // 2)
    counts: dict[str, float] = {}
    results: list[dict[str, float]] = []

    def flood(service: str, n: int) -> None:
        results.append(mxref_native.unary_load(address, f"/{service}/ListSources", [empty], connections=n,
                                               window=window, seconds=seconds, timeout_s=CALL_TIMEOUT_S,
                                               rate=rate / 2, ca_pem=creds.ca.read_bytes()))

    threads = [threading.Thread(target=flood, args=(s, n), daemon=True)
               for s, n in ((SERVICE_NAME, half), (MX_SERVICE_NAME, max(1, connections - half)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + CALL_TIMEOUT_S + 30)
    for result in results:
        for key, value in result.items():
            counts[key] = max(counts.get(key, 0.0), value) if key == "seconds" else counts.get(key, 0.0) + value
    return counts


@dataclass
class FloodWindow:
    """One flood window's outcome: the heartbeats' seconds (or why they failed) and the flood's counts."""

    latencies: list[float]
    status: int
    error: str | None
    flood: dict[str, float]


def flooded(address: str, creds: Creds, record: tuple[str, str, str], seconds: float, interval_s: float,
            connections: int, window: int, ramp_s: float = 0.5, rate: float = 0.0) -> FloodWindow:
    """Heartbeats for ``seconds`` while a flood runs (started ``ramp_s`` before, ending after)."""
    flood: dict[str, float] = {}

    def run() -> None:
        flood.update(unauthenticated_flood(address, creds, seconds + 2 * ramp_s, connections, window, rate))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(ramp_s)
    latencies: list[float] = []
    status, error = -1, None
    try:
        latencies, status = heartbeats(address, creds, record, seconds, interval_s)
    except RuntimeError as exc:
        error = str(exc)
    thread.join(seconds + CALL_TIMEOUT_S + 60)
    return FloodWindow(latencies, status, error, flood)


def server_events(path: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]


def measure(grpc_impl: str, creds: Creds, workdir: Path, args: RefusalsFlags) -> dict[str, Any]:
    server = Server(workdir, f"server-{grpc_impl}", "--port", "0", "--metrics-port", "0", "--grpc-impl", grpc_impl,
                    "--heartbeat-timeout", str(args.heartbeat_timeout), "--reaper-interval", "0.25",
                    *creds.server_flags())
    try:
        record = publish(server.address, creds)
        heartbeats(server.address, creds, record, 1.0, args.interval)  # warm up
        idle: list[float] = []
        flood_lat: list[float] = []
        refused, flood_s, errors, status = 0.0, 0.0, [], READY
        for _ in range(args.rounds):
            lat, status = heartbeats(server.address, creds, record, args.seconds, args.interval)
            idle += lat
            window = flooded(server.address, creds, record, args.seconds, args.interval, args.connections, args.window,
                             rate=args.rate)
            flood_lat += window.latencies
            refused += window.flood.get(f"status:{UNAUTHENTICATED}", 0.0)
            flood_s += window.flood.get("seconds", 0.0)
            if window.error:
                errors.append(window.error)
            status = window.status
        _, status = heartbeats(server.address, creds, record, 0.5, args.interval)
        time.sleep(1.5)  # the last refusals' line
    finally:
        server.close()
    lines = server_events(server.events, "unauthenticated")
    ms = 1000.0
    return {
        "grpc_impl": grpc_impl,
        "flood_rate": args.rate or "closed loop",
        "heartbeats": [len(idle), len(flood_lat)],
        "idle_p50_ms": round(statistics.median(idle) * ms, 3),
        "idle_p99_ms": round(p99(idle) * ms, 3),
        "flood_p50_ms": round(statistics.median(flood_lat) * ms, 3) if flood_lat else None,
        "flood_p99_ms": round(p99(flood_lat) * ms, 3) if len(flood_lat) > 1 else None,
        "flood_max_ms": round(max(flood_lat) * ms, 3) if flood_lat else None,
        "p99_ratio": round(p99(flood_lat) / p99(idle), 2) if len(flood_lat) > 1 else None,
        "refused": int(refused),
        "refused_per_s": round(refused / flood_s, 1) if flood_s else 0.0,
        "heartbeat_errors": errors,
        "status": p2p_pb2.SourceStatus.Name(status) if status >= 0 else "missing",
        "stale_events": len([e for e in server_events(server.events, "source_status") if e["status"] == "STALE"]),
        "unauthenticated_lines": len(lines),
        "refusals_counted": sum(int(e.get("count", 1)) for e in lines),
    }


def throwaway_creds(directory: Path) -> Creds:
    from mxref import pki

    made = pki.generate(directory, tls=True, token=True)
    assert made.server_cert and made.server_key and made.ca_cert and made.token
    return Creds(made.server_cert, made.server_key, made.ca_cert, made.token)


@dataclass(frozen=True, kw_only=True)
class RefusalsFlags:
    """``python -m mxref.bench.refusals``'s flags, typed (``mxref.options``)."""

    grpc_impl: str
    seconds: float
    rounds: int
    interval: float
    connections: int
    window: int
    rate: float
    heartbeat_timeout: float
    tls_cert: str | None
    tls_key: str | None
    tls_ca: str | None
    token_file: str | None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxref.bench.refusals", description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-impl", choices=(*GRPC_IMPLS, "both"), default="both")
    parser.add_argument("--seconds", type=float, default=4.0, help="each idle and each flood window (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="idle/flood alternations (default 2)")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between heartbeats (default 0.02)")
    parser.add_argument("--connections", type=int, default=8, help="flood connections (default 8)")
    parser.add_argument("--window", type=int, default=64, help="flood calls in flight per connection (default 64)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="flood calls a second in all (default 0: closed loop, as fast as answered)")
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0, help="the server's (default 2)")
    for flag in ("--tls-cert", "--tls-key", "--tls-ca", "--token-file"):
        parser.add_argument(flag, default=None, metavar="PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv, RefusalsFlags)
    impls = GRPC_IMPLS if args.grpc_impl == "both" else (args.grpc_impl,)
    with tempfile.TemporaryDirectory(prefix="mxref-bench-refusals-") as tmp:
        given = (args.tls_cert, args.tls_key, args.tls_ca, args.token_file)
        paths = [Path(path) for path in given if path]
        creds = Creds(*paths) if len(paths) == len(given) else throwaway_creds(Path(tmp) / "pki")
        results = []
        for impl in impls:
            results.append(measure(impl, creds, Path(tmp), args))
            print(json.dumps(results[-1]), flush=True)
    for r in results:
        ratio = r["p99_ratio"]
        met = ratio is not None and ratio <= 3.0 and r["status"] == "SOURCE_STATUS_READY"
        print(f"{r['grpc_impl']}: heartbeat p99 under an unauthenticated flood <= 3x idle: "
              f"{'met' if met else 'NOT met'} ({ratio}x; cpus={os.cpu_count()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
