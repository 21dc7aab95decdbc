"""``python -m mxref server|source|reader|prepare|demo``.

Exit codes: 0 ok; 1 the reader produced no verified load; 2 bad flags or input (TLS/token
files included);
3 could not start (bind, NIXL missing). Every process writes its events to
``--events`` (see ``mxref.events``) and serves /metrics on ``--metrics-port``
(0 picks a port; the ``listening`` event reports it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from mxref import config
from mxref.process import EXIT_LOAD_FAILED, EXIT_OK, EXIT_STARTUP_FAILED, EXIT_USAGE, Process


def _seconds(text: str) -> float:
    try:
        return config.parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_common(p: argparse.ArgumentParser, role: str) -> None:
    p.add_argument("--name", default=role, help=f"process name in events and logs (default: {role})")
    p.add_argument("--events", default=os.environ.get("MXREF_EVENTS"), metavar="PATH",
                   help="append JSON-lines events here [MXREF_EVENTS]")


def _add_nixl_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=0, help="/metrics port; 0 picks one (default 0)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics binds (default 127.0.0.1; e.g. a network namespace's address)")
    p.add_argument("--transport", default=os.environ.get("MXREF_TRANSPORT", "ucx-tcp"),
                   choices=sorted(config.TRANSPORT_PROFILES),
                   help="UCX environment profile, applied before NIXL loads [MXREF_TRANSPORT, ucx-tcp]")
    p.add_argument("--server", default=None, help="metadata server host:port [MX_SERVER_ADDRESS]")
    p.add_argument("--rank", type=int, default=0, help="worker rank (default 0)")
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"], help="tensor memory (default cpu)")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--agent-name", default=None,
                   help="exact NIXL agent name (default: NAME-<worker id>, unique per incarnation)")
    p.add_argument("--advertise-host", default="127.0.0.1", help="address peers use to reach this process")
    g = p.add_argument_group("control-plane security (default: plaintext, no token)")
    g.add_argument("--tls-ca", default=None, metavar="PEM",
                   help="dial the metadata server and sources' WorkerService over TLS, verified against this CA")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="serve this process's WorkerService over TLS")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="the --tls-cert certificate's private key")
    g.add_argument("--token-file", default=None, metavar="PATH",
                   help="send (and, serving, require) 'authorization: Bearer <this file's token>' (needs TLS)")


def _add_model(p: argparse.ArgumentParser, checkpoint_required: bool = False) -> None:
    g = p.add_argument_group("model (a synthetic spec, or a safetensors file)")
    g.add_argument("--model-name", default="mxref/synthetic")
    g.add_argument("--tensors", type=int, default=16)
    g.add_argument("--tensor-mib", type=float, default=4.0, help="MiB per tensor (default 4)")
    g.add_argument("--dtype", default="float16")
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic bytes")
    g.add_argument("--model-file", type=Path, default=None, help="serve this safetensors file instead")
    p.add_argument("--checkpoint", type=Path, default=None, required=checkpoint_required,
                   help="safetensors checkpoint (reader: disk fallback; prepare: output)")


def build_parser() -> argparse.ArgumentParser:
    from mxref.server import add_server_args

    parser = argparse.ArgumentParser(prog="python -m mxref", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)

    p = sub.add_parser("server", help="the metadata server (P2pService)")
    _add_common(p, "server")
    add_server_args(p)

    p = sub.add_parser("source", help="hold a model in NIXL-registered memory and advertise it")
    _add_common(p, "source")
    _add_nixl_common(p)
    _add_model(p)
    p.add_argument("--mode", choices=["p2p", "central"], default="p2p")
    p.add_argument("--nixl-port", type=int, default=0, help="NIXL metadata listener port (0 picks one)")
    p.add_argument("--worker-port", type=int, default=0, help="WorkerService port (0 picks one)")
    p.add_argument("--heartbeat-interval", type=_seconds, default=None,
                   help="[MX_HEARTBEAT_INTERVAL_SECS, 30]")
    p.add_argument("--serve-seconds", type=_seconds, default=None, help="exit after this long (default: until signalled)")

    p = sub.add_parser("reader", help="load the model from a READY source, else from the checkpoint")
    _add_common(p, "reader")
    _add_nixl_common(p)
    _add_model(p)
    p.add_argument("--transfer-timeout", type=_seconds, default=None,
                   help="per-candidate READ budget [MX_TRANSFER_TIMEOUT, 300]")
    p.add_argument("--handshake-timeout", type=_seconds, default=config.DEFAULT_HANDSHAKE_TIMEOUT_S)
    p.add_argument("--read-chunk-mib", type=float, default=config.env_float("MXREF_READ_CHUNK_MIB", 0.0) or None,
                   help="split the READ into chunks of this many MiB (2 in flight) and call a window that "
                        "completes nothing within W*chunk/100MB/s+0.5s a stall [MXREF_READ_CHUNK_MIB; "
                        "default: one READ handle, bounded only by the transfer budget]")
    p.add_argument("--rpc-timeout", type=_seconds, default=config.DEFAULT_RPC_TIMEOUT_S, metavar="SECONDS",
                   help=f"deadline of each metadata-server RPC (default {config.DEFAULT_RPC_TIMEOUT_S:g})")
    p.add_argument("--selector", default=None, help="random | rendezvous_hash [MX_P2P_SOURCE_SELECTOR, random]")
    p.add_argument("--selector-seed", type=int, default=None, help="seed of the random selector")
    p.add_argument("--serve-after-load", action="store_true", help="become a source after loading")
    p.add_argument("--serve-seconds", type=_seconds, default=None)
    p.add_argument("--heartbeat-interval", type=_seconds, default=None)
    p.add_argument("--worker-port", type=int, default=0)
    p.add_argument("--mode", choices=["p2p", "central"], default="p2p", help="serving mode after load")
    p.add_argument("--push-metadata", action="store_true",
                   help="EXPERIMENTAL: also push this reader's NIXL metadata to the source's listener, so the "
                        "source holds an endpoint for it with peer error handling (invalidated on release)")
    p.add_argument("--skip-release", action="store_true",
                   help="SIMULATED BUG: never disconnect the source, and exit without NIXL teardown")
    p.add_argument("--result", type=Path, default=None, help="also write the result JSON here")

    p = sub.add_parser("prepare", help="write the safetensors checkpoint of a synthetic model")
    _add_common(p, "prepare")
    _add_model(p, checkpoint_required=True)

    p = sub.add_parser("demo", help="server + source + reader on this machine over UCX-over-TCP")
    _add_common(p, "demo")
    p.add_argument("--tensors", type=int, default=32)
    p.add_argument("--tensor-mib", type=float, default=8.0)
    p.add_argument("--workdir", type=Path, default=None, help="where logs/events go (default: a temp dir)")
    p.add_argument("--transport", default="ucx-tcp", choices=sorted(config.TRANSPORT_PROFILES),
                   help="UCX profile for every process of the demo (default ucx-tcp)")
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"],
                   help="where source and reader keep the tensors (default cpu)")
    p.add_argument("--no-baseline", action="store_true", help="skip the raw NIXL READ comparison")
    p.add_argument("--compare-chunked-runs", type=int, default=0, metavar="N",
                   help="also run N single-handle and N chunked loads, interleaved, and compare GB/s")
    p.add_argument("--chunk-mib", type=float, default=16.0, help="chunk size for --compare-chunked-runs")
    return parser


def model_from_args(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(spec or None, arena) from the model flags."""
    from mxref.model import generate, load_checkpoint

    if getattr(args, "model_file", None):
        arena, _sums = load_checkpoint(args.model_file)
        return None, arena
    spec = model_spec(args)
    return spec, generate(spec)


def model_spec(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import numpy as np

    from mxref.model import ModelSpec

    tensor_bytes = int(args.tensor_mib * (1 << 20))
    tensor_bytes -= tensor_bytes % np.dtype(args.dtype).itemsize
    return ModelSpec(name=args.model_name, tensors=args.tensors, tensor_bytes=tensor_bytes, dtype=args.dtype,
                     seed=args.seed)


def serve_options(args: argparse.Namespace, server: str):  # type: ignore[no-untyped-def]
    """How this process serves as a source (a source, or a reader after its load)."""
    from mxref.source import ServeOptions

    return ServeOptions(
        server=server, worker_rank=args.rank, mode=args.mode, advertise_host=args.advertise_host,
        worker_port=args.worker_port,
        heartbeat_interval_s=args.heartbeat_interval
        or config.env_float("MX_HEARTBEAT_INTERVAL_SECS", config.DEFAULT_HEARTBEAT_INTERVAL_S),
    )


def _serve(service, proc: Process, seconds: float | None) -> None:  # type: ignore[no-untyped-def]
    """Serve until signalled (or ``seconds``), then the source teardown, whatever happened."""
    from mxref.source import wait_for_stop

    service.start()
    try:
        wait_for_stop(proc.stop, seconds)
        proc.note_signal()
    finally:
        service.close()


def run_source(args: argparse.Namespace) -> int:
    import uuid

    from mxref.accelerators import get_backend
    from mxref.metrics import SourceMetrics
    from mxref.nixl_transfer import NixlTransferManager
    from mxref.process import free_port
    from mxref.source import SourceService, identity_for, local_tensors

    metrics = SourceMetrics()
    with Process(args.name, "source", args.events, args.metrics_port, metrics,
                 metrics_host=args.metrics_host) as proc:
        spec, host_arena = model_from_args(args)
        checksums = host_arena.checksums()
        accel = get_backend(args.accelerator)
        arena = accel.to_device(host_arena, args.device_id)
        identity = identity_for(spec.name if spec else args.model_name, arena.specs[0].dtype)
        agent_name = args.agent_name or f"{args.name}-{uuid.uuid4().hex[:8]}"
        nixl_port = args.nixl_port or free_port(args.advertise_host)
        mgr = NixlTransferManager(agent_name, args.device_id, accel, events=proc.events, metrics=metrics.nixl)
        try:
            mgr.create_agent(nixl_port, progress_thread=False)
        except Exception as exc:  # noqa: BLE001 - NIXL raises unrelated types; any failure is a startup failure
            print(f"mxref source: cannot create the NIXL agent: {type(exc).__name__}: {exc}", file=sys.stderr)
            return proc.finish(EXIT_STARTUP_FAILED)
        mgr.register_tensors(local_tensors(arena, args.device_id))
        mgr.start_progress_pump()
        proc.emit("agent_ready", agent_name=agent_name, listen_port=nixl_port, backend="UCX",
                  mem_type=accel.mem_type, regions=len(arena.specs), bytes=sum(s.nbytes for s in arena.specs))
        proc.emit("listening", what="nixl_listener", port=nixl_port, endpoint=f"{args.advertise_host}:{nixl_port}")
        options = serve_options(args, args.server or config.server_address())
        service = SourceService(mgr, arena, checksums, identity, options, accel.name, proc.events, metrics.source)
        _serve(service, proc, args.serve_seconds)
        return proc.finish(EXIT_OK)


def run_reader(args: argparse.Namespace) -> int:
    from mxref.metrics import ReaderMetrics
    from mxref.nixl_transfer import ChunkPolicy
    from mxref.process import free_port
    from mxref.reader import Reader, ReaderOptions
    from mxref.source import SourceService, identity_for, local_tensors

    metrics = ReaderMetrics(serve_after_load=args.serve_after_load)
    with Process(args.name, "reader", args.events, args.metrics_port, metrics,
                 metrics_host=args.metrics_host) as proc:
        spec = model_spec(args)
        budget = args.transfer_timeout if args.transfer_timeout is not None else config.transfer_timeout_seconds()
        options = ReaderOptions(
            server=args.server or config.server_address(), transfer_timeout_s=budget,
            handshake_timeout_s=args.handshake_timeout, rpc_timeout_s=args.rpc_timeout, worker_rank=args.rank,
            accelerator=args.accelerator, device_id=args.device_id,
            selector=args.selector or os.environ.get("MX_P2P_SOURCE_SELECTOR") or "random",
            selector_seed=args.selector_seed, checkpoint=args.checkpoint, agent_name=args.agent_name,
            skip_release=args.skip_release, name=args.name, push_metadata=args.push_metadata,
            chunks=ChunkPolicy(chunk_bytes=int(args.read_chunk_mib * (1 << 20))) if args.read_chunk_mib else None,
        )
        identity = identity_for(spec.name, spec.dtype)
        reader = Reader(options, spec.tensor_specs(), identity, proc.events, metrics)
        result = reader.load()
        line = result.to_json()
        print(line, flush=True)
        if args.result:
            args.result.write_text(line + "\n")
        if args.skip_release:
            # The pre-fix reader: gone without a word to its source (no remove, no invalidate).
            proc.emit("exit", code=EXIT_OK if result.ok else EXIT_LOAD_FAILED, simulated="skip_release")
            os._exit(EXIT_OK if result.ok else EXIT_LOAD_FAILED)
        if not result.ok:
            reader.close()
            print(f"mxref reader: no verified load: {result.error}", file=sys.stderr)
            return proc.finish(EXIT_LOAD_FAILED)
        if metrics.source is not None and not proc.stop.is_set():  # --serve-after-load
            assert reader.arena is not None
            mgr = reader.manager
            if mgr is None:  # loaded from disk: register the loaded tensors with a new agent
                from mxref.nixl_transfer import NixlTransferManager

                mgr = NixlTransferManager(reader.agent_base, args.device_id, reader.accelerator,
                                          events=proc.events, metrics=metrics.nixl)
                mgr.create_agent(free_port(args.advertise_host), progress_thread=False)
                mgr.register_tensors(local_tensors(reader.arena, args.device_id))
            mgr.start_progress_pump()
            serve = serve_options(args, options.server)
            service = SourceService(mgr, reader.arena, reader.arena.checksums(), identity, serve,
                                    reader.accelerator.name, proc.events, metrics.source)
            reader.manager = None
            _serve(service, proc, args.serve_seconds)
        else:
            reader.close()
        return proc.finish(EXIT_OK)


def run_prepare(args: argparse.Namespace) -> int:
    from mxref.metrics import ProcessMetrics
    from mxref.model import generate, save_checkpoint

    with Process(args.name, "prepare", args.events, None, ProcessMetrics("prepare")) as proc:
        spec = model_spec(args)
        arena = generate(spec)
        save_checkpoint(arena, args.checkpoint, spec)
        print(json.dumps({"checkpoint": str(args.checkpoint), "bytes": spec.total_bytes, "tensors": spec.tensors}))
        return proc.finish(EXIT_OK)


def install_credentials(args: argparse.Namespace) -> bool:
    """The process's control-plane credentials from the TLS/token flags (``mxref.security``);
    false, with the reason on stderr, when they cannot be used."""
    from mxref import security

    try:
        client = security.ClientCredentials.from_files(args.tls_ca, args.token_file)
        # the WorkerService requires the token only when it serves TLS (a token never travels in plaintext)
        server = security.ServerCredentials.from_files(
            args.tls_cert, args.tls_key, args.token_file if args.tls_cert else None
        )
    except security.SecurityError as exc:
        print(f"mxref {args.role}: {exc}", file=sys.stderr)
        return False
    security.install(client, server)
    return True


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    args = build_parser().parse_args(argv)
    if hasattr(args, "transport"):
        config.apply_transport_profile(args.transport)
    if args.role == "server":
        from mxref.server import run_server

        return run_server(args)
    if args.role in ("source", "reader") and not install_credentials(args):
        return EXIT_USAGE
    if args.role == "source":
        return run_source(args)
    if args.role == "reader":
        return run_reader(args)
    if args.role == "prepare":
        return run_prepare(args)
    if args.role == "demo":
        from mxref.demo import run_demo

        return run_demo(args)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
