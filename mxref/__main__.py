"""``python -m mxref server|source|reader|prepare|demo``.

Exit codes: 0 ok; 1 the reader produced no verified load; 2 bad flags or input
(TLS/token files included; a model file whose tensors differ from the checksums recorded in it, and
a model whose digest is not ``--expect-digest``); 3 could not start (bind, NIXL
missing). Every process writes its events to ``--events`` (see ``mxref.events``) and
serves /metrics on ``--metrics-port`` (0 picks a port; the ``listening`` event reports it).

The content reference (``mxref.model.Reference``) of a source, reader or prepare comes
from its model flags, in this order: ``--model-file F`` gives the reference recorded in
F's ``__metadata__`` (written by ``prepare``), or, when F records none, the hashes of
F's tensors; otherwise the synthetic spec (``--tensors`` ...) is the reference. A
reader never takes it from a peer or from its fallback ``--checkpoint``.
``--expect-digest`` pins it: a process whose reference has another digest exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxref import config
from mxref.debug_hooks import LEAK_KINDS, CorruptionToggle, PlantedLeak
from mxref.metrics import ProcessMetrics, ReaderMetrics, SourceMetrics
from mxref.model import (
    Arena,
    Reference,
    TensorSpec,
    add_model_args,
    check_digest_syntax,
    fill_from_seed,
    generate,
    load_checkpoint,
    model_spec,
    save_checkpoint,
)
from mxref.options import (
    DemoFlags,
    ModelFlags,
    PeerFlags,
    PrepareFlags,
    ReaderFlags,
    RoleFlags,
    ServerFlags,
    SourceFlags,
    parse_role,
)
from mxref.process import EXIT_LOAD_FAILED, EXIT_OK, EXIT_STARTUP_FAILED, EXIT_USAGE, Process

if TYPE_CHECKING:
    from mxref.accelerators import AcceleratorBackend
    from mxref.roles.reader import Reader
    from mxref.roles.source import ServeOptions

# Each role's own modules (roles, transfer, accelerators, security, the server, the benches) are
# imported inside the function that runs it, so a process loads only the role it plays: the
# server and prepare skip the reader's and source's stack, about a fifth of their start-up
# (``python -X importtime``); what every role needs is imported above.


def _seconds(text: str) -> float:
    try:
        return config.parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MAX_LEASE_S = 86400.0  # a lease, and a drain that waits for leases, is bounded: a day at most


def _bounded_seconds(text: str) -> float:
    value = _seconds(text)
    if value > MAX_LEASE_S:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_LEASE_S:g} s (a day)")
    return value


def _mib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size in MiB must be finite and >= 0 (0: off)")
    return value


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
    p.add_argument("--mx-version", default=None, metavar="V",
                   help="the identity's mx_version (default: this mxref's version); a source and a reader of "
                   "different versions never match (ModelExpress hashes its client version into a source's id)")
    g = p.add_argument_group("control-plane security (default: plaintext, no token)")
    g.add_argument("--tls-ca", default=None, metavar="PEM",
                   help="dial the metadata server and sources' WorkerService over TLS, verified against this CA")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="serve this process's WorkerService over TLS")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="the --tls-cert certificate's private key")
    g.add_argument("--token-file", default=None, metavar="PATH",
                   help="send (and, serving, require) 'authorization: Bearer <this file's token>' (needs TLS)")


def _add_debug_hooks(p: argparse.ArgumentParser, refit: bool = False) -> None:
    also = ("; SIGHUP asks a refit: drain the tensor read leases (--drain-timeout), rewrite the weights, "
            "admit leases again (drain_started, drain_done or drain_timed_out, refit)") if refit else ""
    p.add_argument("--debug-hooks", action="store_true",
                   help="DEBUG HOOK (tests only): SIGUSR2 toggles corruption of the registered memory (byte 0 "
                        "of every tensor XOR 0xFF; a second SIGUSR2 restores it) and emits debug_corrupt" + also)


def build_parser() -> argparse.ArgumentParser:
    # late: this role's own modules (the note above _seconds)
    from mxref.metadata.main import add_server_args

    parser = argparse.ArgumentParser(prog="python -m mxref", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)

    p = sub.add_parser("server", help="the metadata server (P2pService)")
    _add_common(p, "server")
    add_server_args(p)

    p = sub.add_parser("source", help="hold a model in NIXL-registered memory and advertise it")
    _add_common(p, "source")
    _add_nixl_common(p)
    add_model_args(p)
    p.add_argument("--mode", choices=["p2p", "central"], default="p2p")
    p.add_argument("--nixl-port", type=int, default=0, help="NIXL metadata listener port (0 picks one)")
    p.add_argument("--worker-port", type=int, default=0, help="WorkerService port (0 picks one)")
    p.add_argument("--heartbeat-interval", type=_seconds, default=None,
                   help="[MX_HEARTBEAT_INTERVAL_SECS, 30]")
    p.add_argument("--serve-seconds", type=_seconds, default=None, help="exit after this long (default: until signalled)")
    p.add_argument("--ready-delay", type=_seconds, default=0.0, metavar="SECONDS",
                   help="simulated engine warm-up: publish at once (INITIALIZING) but report READY only this "
                        "long after serving starts (default 0)")
    p.add_argument("--lease-seconds", type=_bounded_seconds, default=None, metavar="SECONDS",
                   help="lifetime of a tensor read lease (PrepareTensorRead) (default ModelExpress's: "
                        "ceil(2*max(120, MX_TRANSFER_TIMEOUT)+30), 1830 s unset; at most a day)")
    p.add_argument("--drain-timeout", type=_bounded_seconds, default=None, metavar="SECONDS",
                   help="how long a refit's drain waits for live leases before it gives up and admits leases "
                        "again (default: a lease lifetime + 1 s; at most a day)")
    _add_debug_hooks(p, refit=True)
    p.add_argument("--grow-tensors", type=int, default=None, metavar="N",
                   help="DEBUG HOOK (tests only), with --debug-hooks and a synthetic model: a refit (SIGHUP) "
                        "adds N tensors (the generator's next ones, registered first) and republishes the grown "
                        "manifest under the same identity (ModelExpress 0.8's republish; manifest_grown), "
                        "instead of rewriting the weights")
    p.add_argument("--data-seed", type=int, default=None, metavar="N",
                   help="DEBUG HOOK (tests only): hold the generator's bytes for seed N while publishing the "
                        "identity and reference digest of the model given (wrong bytes under the same identity); "
                        "the manifest publishes the checksums of the bytes held")
    p.add_argument("--lie-manifest", action="store_true",
                   help="DEBUG HOOK (tests only): with --data-seed, publish the reference's checksums instead "
                        "of those of the bytes held")

    p = sub.add_parser("reader", help="load the model from a READY source, else from the checkpoint")
    _add_common(p, "reader")
    _add_nixl_common(p)
    add_model_args(p)
    p.add_argument("--transfer-timeout", type=_seconds, default=None,
                   help="per-candidate READ budget [MX_TRANSFER_TIMEOUT, 300]")
    p.add_argument("--handshake-timeout", type=_seconds, default=config.DEFAULT_HANDSHAKE_TIMEOUT_S)
    p.add_argument("--read-chunk-mib", type=_mib,
                   default=config.env_float("MXREF_READ_CHUNK_MIB", config.DEFAULT_READ_CHUNK_MIB, allow_zero=True),
                   metavar="MIB",
                   help="split the READ into chunks of this many MiB (2 in flight) and call a window that "
                        "completes nothing within 2*chunk/100MB/s+0.5s a stall, so a frozen source is left in "
                        "about a second; the transfer budget still bounds the whole READ. 0: one READ handle, "
                        "bounded only by the budget (docs/contract.md#read-budget) [MXREF_READ_CHUNK_MIB, 16]")
    p.add_argument("--read-window", type=config.whole_number_arg("chunks in flight", 1, 64), default=config.DEFAULT_READ_WINDOW, metavar="N",
                   help="chunks in flight of a chunked READ (default 2); the stall deadline is the window's "
                        "bytes at half the READ's observed rate (25-100 MB/s) + 0.5 s: at most N*chunk/25MB/s+0.5s")
    p.add_argument("--read-ramp", action=argparse.BooleanOptionalAction, default=True,
                   help="the first window of a chunked READ is one 1 MiB chunk posted alone (its stall deadline "
                        "0.51 s; a source shared by many readers answers it in time), the next ramp up "
                        "(1/N, 2/N, ... of a chunk) (default on; off: the first window is N chunks, 0.84 s)")
    p.add_argument("--hash-while-reading", action=argparse.BooleanOptionalAction, default=True,
                   help="hash each tensor of a chunked READ into host memory as soon as its bytes have landed, "
                        "between the READ's polls, so little is left to verify after it (default on)")
    p.add_argument("--rpc-timeout", type=_seconds, default=config.DEFAULT_RPC_TIMEOUT_S, metavar="SECONDS",
                   help=f"deadline of each metadata-server RPC (default {config.DEFAULT_RPC_TIMEOUT_S:g})")
    p.add_argument("--selector", default=None,
                   help="random | rendezvous_hash | ordinal (the candidates rotated by this reader's ordinal, "
                        "--selector-seed: spreads a fleet's readers evenly) [MX_P2P_SOURCE_SELECTOR, random]")
    p.add_argument("--selector-seed", type=int, default=None,
                   help="seed of the random selector; the reader's ordinal for the ordinal selector")
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
    p.add_argument("--simulate-unguarded-retry", action="store_true",
                   help="SIMULATED BUG: after a failed READ, read the next candidate with the same NIXL agent, "
                        "registration and memory (no late-write guard)")
    p.add_argument("--result", type=Path, default=None, help="also write the result JSON here")
    p.add_argument("--settle-s", type=_seconds, default=0.5, metavar="SECONDS",
                   help="after a load in which a READ was released before it completed (its peer may still "
                        "write late), wait this long and re-hash the memory (memory_digest when=settled); "
                        "0 disables (default 0.5)")
    p.add_argument("--settle-always", action="store_true",
                   help="settle after every load, also one whose READs all completed")
    p.add_argument("--lease", action="store_true",
                   help="take a tensor read lease (ModelExpress's PrepareTensorRead; its manifest is the one "
                        "checked) before each READ and give it back after; no READ without one (P2P sources only)")
    p.add_argument("--accept-growth", action="store_true",
                   help="read a manifest that grew after publishing (ModelExpress 0.8): one holding every tensor "
                        "of the reference unchanged, and more, is read whole and verified against the reference "
                        "and the added tensors' published checksums (reference_grown); without it, a mismatch")
    p.add_argument("--load-loop", action="store_true",
                   help="stay up and load once per line 'load' on standard input, printing each result line "
                        "and giving the load back before the next; exit at end of input or 'quit' "
                        "(mxref.roles.load_loop; the soak's long-lived reader)")
    p.add_argument("--probe-duplicate-registration", action="store_true",
                   help="NIXL PROBE (tests only): after a load over NIXL, register one fresh range twice with its "
                        "agent and deregister both (NIXL #1792); emits duplicate_registration "
                        "(mxref.debug_hooks.duplicate_registration)")
    p.add_argument("--debug-leak", choices=LEAK_KINDS, default=None,
                   help="DEBUG HOOK (tests only), with --load-loop: leak one descriptor (fd) or one NIXL "
                        "registration (registration) per load, for the soak to catch")
    _add_debug_hooks(p)

    p = sub.add_parser("prepare", help="write the safetensors checkpoint of a synthetic model")
    _add_common(p, "prepare")
    add_model_args(p, checkpoint_required=True)
    p.add_argument("--data-seed", type=int, default=None, metavar="N",
                   help="DEBUG HOOK (tests only): write the bytes of seed N but record the reference of the "
                        "model given (a tampered checkpoint)")

    sub.add_parser("bench", add_help=False,
                   help="whole load and READ vs a raw two-process NIXL READ, interleaved (mxref bench --help); "
                        "'bench storm': R readers at once from S sources beside a raw fan-out (mxref bench storm --help)")
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
    p.add_argument("--chunk-mib", type=float, default=config.DEFAULT_READ_CHUNK_MIB,
                   help="chunk size for --compare-chunked-runs")
    return parser


def parse_argv(argv: Sequence[str]) -> RoleFlags:
    """``python -m mxref ROLE ...``'s flags, typed (``mxref.options``); exits 2 on bad flags."""
    return parse_role(build_parser(), argv)


class BadInput(Exception):
    """Bad flags or input: the message names the flag or file; the process exits 2."""


def _pin(reference: Reference, args: ModelFlags) -> Reference:
    """``reference``, when ``--expect-digest`` (if given) is its digest; BadInput otherwise."""
    if not args.expect_digest:
        return reference
    try:
        want = check_digest_syntax(args.expect_digest, "--expect-digest")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if reference.digest != want:
        what = f"--model-file {args.model_file}" if args.model_file else "the model flags"
        raise BadInput(f"--expect-digest {want}: {what} give {reference.digest} ({reference.origin})")
    return reference


def _early_target(args: ReaderFlags) -> tuple[AcceleratorBackend | None, list[TensorSpec] | None]:
    """The reader's memory backend and its synthetic model's tensor layout, known before the
    reference is computed; (None, None) for a model file, or flags that make no model or no
    backend (the later, real checks report those)."""
    # late: this role's own modules (the note above _seconds)
    from mxref.accelerators import get_backend

    if args.model_file:
        return None, None
    try:
        return get_backend(args.accelerator), model_spec(args).tensor_specs()
    except Exception:  # noqa: BLE001 - only a head start; the reader's own setup reports the problem
        return None, None


def model_reference(args: ModelFlags) -> Reference:
    """The reference a reader holds its load to (module docstring: precedence). Reads only
    the header of a model file that records its reference."""
    try:
        if args.model_file:
            ref = Reference.recorded(args.model_file) or Reference.from_file(args.model_file)
        else:
            ref = Reference.from_spec(model_spec(args))
    except (OSError, ValueError) as exc:
        raise BadInput(f"model: {exc}") from None
    return _pin(ref, args)


def model_from_args(args: ModelFlags, emit: Callable[..., Any]) -> tuple[Reference, Arena]:
    """A source's (reference, host arena) from the model flags. A model file is checked against
    the reference recorded in it (``content_check``) and refused (BadInput) when it differs."""
    if args.model_file:
        path = args.model_file
        try:
            arena = load_checkpoint(path)
            recorded = Reference.recorded(path)
        except (OSError, ValueError) as exc:
            emit("content_check", path=str(path), ok=False, tensors=0, bad=[], error=str(exc))
            raise BadInput(f"--model-file {path}: {exc}") from None
        held = Reference.from_arena(arena, "hashed")
        if recorded is None:
            emit("content_check", path=str(path), ok=None, tensors=len(arena.specs), bad=[],
                 error="no recorded reference: serving the hashes of its tensors")
            return _pin(held, args), arena
        bad = recorded.mismatches(held.checksums)
        emit("content_check", path=str(path), ok=not bad, tensors=len(arena.specs), bad=bad[:20], error=None)
        if bad:
            raise BadInput(f"--model-file {path}: {len(bad)} of {len(arena.specs)} tensors differ from the "
                           f"checksums recorded in it ({recorded.digest}): {bad[:5]}; refusing to serve it")
        return _pin(recorded, args), arena
    try:
        spec = model_spec(args)
    except ValueError as exc:
        raise BadInput(f"model: {exc}") from None
    arena = generate(spec)
    return _pin(Reference.from_arena(arena, "spec"), args), arena


def serve_options(args: SourceFlags | ReaderFlags, server: str) -> ServeOptions:
    """How this process serves as a source (a source, or a reader after its load)."""
    # late: this role's own modules (the note above _seconds)
    from mxref.roles.source import ServeOptions

    return ServeOptions(
        server=server, worker_rank=args.rank, mode=args.mode, advertise_host=args.advertise_host,
        worker_port=args.worker_port,
        heartbeat_interval_s=args.heartbeat_interval
        or config.env_float("MX_HEARTBEAT_INTERVAL_SECS", config.DEFAULT_HEARTBEAT_INTERVAL_S),
        ready_delay_s=args.ready_delay if isinstance(args, SourceFlags) else 0.0,
        lease_seconds=args.lease_seconds if isinstance(args, SourceFlags) else None,
        drain_timeout_s=args.drain_timeout if isinstance(args, SourceFlags) else None,
    )


def _serve(service, proc: Process, seconds: float | None,  # type: ignore[no-untyped-def]
           before_close: Callable[[], object] = lambda: None) -> None:
    """Serve until signalled (or ``seconds``), then ``before_close`` and the source teardown,
    whatever happened."""
    # late: this role's own modules (the note above _seconds)
    from mxref.roles.source import wait_for_stop

    service.start()
    try:
        wait_for_stop(proc.stop, seconds)
        proc.note_signal()
    finally:
        try:
            before_close()
        finally:
            service.close()


def _debug_hooks(args: SourceFlags | ReaderFlags, proc: Process, arena: Any = None) -> CorruptionToggle | None:
    """The SIGUSR2 corruption toggle when ``--debug-hooks`` is given (mxref.debug_hooks)."""
    if not args.debug_hooks:
        return None

    return CorruptionToggle(proc.emit, arena).install()


def run_source(args: SourceFlags) -> int:
    # late: this role's own modules (the note above _seconds)
    from mxref.accelerators import get_backend
    from mxref.roles.source import SourceService, identity_for
    from mxref.transfer.local import local_tensors
    from mxref.transfer.manager import NixlTransferManager

    metrics = SourceMetrics()
    with Process(args.name, "source", args.events, args.metrics_port, metrics,
                 metrics_host=args.metrics_host) as proc:
        try:
            if args.lie_manifest and args.data_seed is None:
                raise BadInput("--lie-manifest needs --data-seed (an honest source's checksums are the reference's)")
            if args.grow_tensors is not None and (args.grow_tensors < 1 or not args.debug_hooks or args.model_file):
                raise BadInput(f"--grow-tensors {args.grow_tensors}: needs a count of at least 1, --debug-hooks "
                               "(a refit grows the model) and a synthetic model (no --model-file)")
            reference, host_arena = model_from_args(args, proc.emit)
        except BadInput as exc:
            print(f"mxref source: {exc}", file=sys.stderr)
            return proc.finish(EXIT_USAGE)
        if args.data_seed is not None:
            fill_from_seed(host_arena, args.data_seed)
        held = Reference.from_arena(host_arena, reference.origin)
        lie = args.lie_manifest
        checksums = [(reference if lie else held).checksums[t.name] for t in reference.tensors]
        proc.emit("reference", digest=reference.digest, origin=reference.origin, tensors=len(reference.tensors),
                  pinned=bool(args.expect_digest), held_digest=held.digest, manifest="reference" if lie else "held")
        accel = get_backend(args.accelerator)
        arena = accel.to_device(host_arena, args.device_id)
        identity = identity_for(args.model_name, arena.specs[0].dtype, revision=reference.digest,
                                mx_version=args.mx_version)
        agent_name = args.agent_name or f"{args.name}-{uuid.uuid4().hex[:8]}"
        mgr = NixlTransferManager(agent_name, args.device_id, accel, events=proc.events, metrics=metrics.nixl)
        try:
            if args.nixl_port:  # pinned by the operator: no second choice
                mgr.create_agent(args.nixl_port, progress_thread=False)
                nixl_port = int(args.nixl_port)
            else:
                nixl_port = mgr.create_agent_on_free_port(progress_thread=False)
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
        hooks = _debug_hooks(args, proc, arena)
        if hooks is not None:
            write = (hooks.rewrite if args.grow_tensors is None
                     else _grower(args, service, mgr, accel, len(arena.specs), args.grow_tensors))
            hooks.on_refit(lambda: service.refit(write))
        try:
            _serve(service, proc, args.serve_seconds)
        finally:
            if hooks is not None:
                hooks.close()
        return proc.finish(EXIT_OK)


def _grower(args: SourceFlags, service: Any, mgr: Any, accel: Any, first: int, count: int) -> Callable[[], int]:
    """A refit's write that grows the model (``--grow-tensors``): each call adds ``count`` tensors,
    the generator's next ones for the model's seed, registers their memory, then swaps the manifest
    and republishes (``SourceService.grow``)."""
    # late: this role's own modules (the note above _seconds)
    from mxref.transfer.local import local_tensors

    held = [first]

    def grow() -> int:
        spec = model_spec(args)
        sizes = spec.sizes or (spec.tensor_bytes,) * spec.tensors
        grown = dataclasses.replace(spec, sizes=(*sizes, *(spec.tensor_bytes,) * (held[0] + count - len(sizes))))
        extra = Arena(grown.tensor_specs()[held[0]:])
        fill_from_seed(extra, spec.seed if args.data_seed is None else args.data_seed, first=held[0])
        checksums = extra.checksums()
        arena = accel.to_device(extra, args.device_id)
        mgr.register_tensors(local_tensors(arena, args.device_id))
        held[0] += count
        return int(service.grow(arena, checksums))

    return grow


def run_reader(args: ReaderFlags) -> int:
    # late: this role's own modules (the note above _seconds)
    from mxref.roles.reader import Reader, ReaderOptions
    from mxref.roles.source import identity_for
    from mxref.transfer.chunked import ChunkPolicy
    from mxref.transfer.read_target import NixlWarmup

    metrics = ReaderMetrics(serve_after_load=args.serve_after_load)
    with Process(args.name, "reader", args.events, args.metrics_port, metrics,
                 metrics_host=args.metrics_host) as proc:
        # NIXL's one-time start-up and the READ target's memory, beside the reference's computation
        warmup = NixlWarmup(*_early_target(args), args.device_id)
        try:
            reference = model_reference(args)
        except BadInput as exc:
            print(f"mxref reader: {exc}", file=sys.stderr)
            warmup.release_arena()  # waits: never exit while the warm-up thread is inside NIXL
            return proc.finish(EXIT_USAGE)
        proc.emit("reference", digest=reference.digest, origin=reference.origin, tensors=len(reference.tensors),
                  pinned=bool(args.expect_digest))
        hooks = _debug_hooks(args, proc)
        budget = args.transfer_timeout if args.transfer_timeout is not None else config.transfer_timeout_seconds()
        options = ReaderOptions(
            server=args.server or config.server_address(), transfer_timeout_s=budget,
            handshake_timeout_s=args.handshake_timeout, rpc_timeout_s=args.rpc_timeout, worker_rank=args.rank,
            accelerator=args.accelerator, device_id=args.device_id,
            selector=args.selector or os.environ.get("MX_P2P_SOURCE_SELECTOR") or "random",
            selector_seed=args.selector_seed, checkpoint=args.checkpoint, agent_name=args.agent_name,
            skip_release=args.skip_release, name=args.name, push_metadata=args.push_metadata, lease=args.lease,
            accept_growth=args.accept_growth,
            unguarded_retry=args.simulate_unguarded_retry, hash_while_reading=args.hash_while_reading,
            chunks=(ChunkPolicy(chunk_bytes=int(args.read_chunk_mib * (1 << 20)), window=args.read_window, ramp=args.read_ramp)
                    if args.read_chunk_mib > 0 else None),
        )
        identity = identity_for(args.model_name, reference.tensors[0].dtype, revision=reference.digest,
                                mx_version=args.mx_version)
        reader = Reader(options, reference, identity, proc.events, metrics, warmup=warmup)
        try:
            if args.load_loop:
                return _load_loop(args, proc, reader)
            return _read(args, proc, metrics, reader, hooks)
        finally:
            if hooks is not None:
                hooks.close()


def _load_loop(args: ReaderFlags, proc: Process, reader: Reader) -> int:
    """``--load-loop``: a load per line of standard input (``mxref.roles.load_loop``), then close."""
    # late: this role's own modules (the note above _seconds)
    from mxref.roles.load_loop import load_loop

    leak = PlantedLeak(args.debug_leak, proc.emit) if args.debug_leak else None
    try:
        load_loop(reader, sys.stdin, sys.stdout, proc.stop, args.settle_s, leak)
    finally:
        reader.drop_load()
        reader.close()
    return proc.finish(EXIT_OK)


def _read(args: ReaderFlags, proc: Process, metrics: ReaderMetrics, reader: Reader,
          hooks: CorruptionToggle | None) -> int:
    """The reader after its setup: load, report, settle, then exit or serve."""
    # late: this role's own modules (the note above _seconds)
    from mxref.roles.source import SourceService
    from mxref.transfer.local import local_tensors

    options = reader.options
    identity = reader.identity
    result = reader.load()
    line = result.to_json()
    print(line, flush=True)
    if args.result:
        args.result.write_text(line + "\n")
    if result.ok and hooks is not None:
        hooks.set_arena(reader.arena)
    if result.ok:
        reader.settle(args.settle_s, proc.stop, always=args.settle_always)
    if result.ok and args.probe_duplicate_registration:
        from mxref.debug_hooks import duplicate_registration

        duplicate_registration(reader.manager.agent if reader.manager is not None else None, proc.emit)
    if args.skip_release:
        reader.report_memory("exit")
        # The pre-fix reader: gone without a word to its source (no remove, no invalidate).
        proc.emit("exit", code=EXIT_OK if result.ok else EXIT_LOAD_FAILED, simulated="skip_release")
        os._exit(EXIT_OK if result.ok else EXIT_LOAD_FAILED)
    if not result.ok:
        reader.close()
        print(f"mxref reader: no verified load: {result.error}", file=sys.stderr)
        return proc.finish(EXIT_LOAD_FAILED)
    reference = reader.reference
    if metrics.source is not None and not proc.stop.is_set():  # --serve-after-load
        assert reader.arena is not None
        mgr = reader.manager
        if mgr is None:  # loaded from disk: register the loaded tensors with a new agent
            # late: this role's own modules (the note above _seconds)
            from mxref.transfer.manager import NixlTransferManager

            mgr = NixlTransferManager(reader.agent_base, args.device_id, reader.accelerator,
                                      events=proc.events, metrics=metrics.nixl)
            mgr.create_agent_on_free_port(progress_thread=False)
            mgr.register_tensors(local_tensors(reader.arena, args.device_id))
        mgr.start_progress_pump()
        serve = serve_options(args, options.server)
        # it publishes the reference it verified its load against, not whatever its memory holds now
        checksums = [reference.checksums[t.name] for t in reference.tensors]
        service = SourceService(mgr, reader.arena, checksums, identity, serve,
                                reader.accelerator.name, proc.events, metrics.source)
        reader.manager = None
        _serve(service, proc, args.serve_seconds, before_close=lambda: reader.report_memory("exit"))
    else:
        reader.report_memory("exit")
        reader.close()
    return proc.finish(EXIT_OK)


def run_prepare(args: PrepareFlags) -> int:
    with Process(args.name, "prepare", args.events, None, ProcessMetrics("prepare")) as proc:
        try:
            if args.model_file:
                raise BadInput("prepare writes a synthetic model: --model-file is not for prepare")
            spec = model_spec(args)
            arena = generate(spec)
            reference = _pin(Reference.from_arena(arena, "spec"), args)
        except (BadInput, ValueError) as exc:
            print(f"mxref prepare: {exc}", file=sys.stderr)
            return proc.finish(EXIT_USAGE)
        if args.data_seed is not None:
            fill_from_seed(arena, args.data_seed)  # the debug hook: other bytes, the spec's reference
        save_checkpoint(arena, args.checkpoint, spec, reference=reference)
        print(json.dumps({"checkpoint": str(args.checkpoint), "bytes": spec.total_bytes, "tensors": spec.tensors,
                          "digest": reference.digest}))
        return proc.finish(EXIT_OK)


def install_credentials(args: SourceFlags | ReaderFlags) -> bool:
    """The process's control-plane credentials from the TLS/token flags (``mxref.security``);
    false, with the reason on stderr, when they cannot be used."""
    # late: this role's own modules (the note above _seconds)
    from mxref import security

    try:
        serves = isinstance(args, SourceFlags) or args.serve_after_load
        if serves and args.token_file and not args.tls_cert:
            # A source (and a reader that serves after its load) serves its WorkerService: with a token but
            # no TLS it would serve plaintext with no token check, so it refuses, as the server does.
            raise security.SecurityError("--token-file needs --tls-cert and --tls-key on a process that serves "
                                         "its WorkerService: it would otherwise serve plaintext with no token check")
        client = security.ClientCredentials.from_files(args.tls_ca, args.token_file)
        # a reader that does not serve: its token is a client's (it travels only over TLS: --tls-ca)
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["bench", "storm"]:  # its own flags (mxref.bench.storm)
        from mxref.bench.storm import main as storm

        return storm(argv[2:])
    if argv[:1] == ["bench"]:  # its own flags (mxref.bench.load)
        # late: this role's own modules (the note above _seconds)
        from mxref.bench.load import main as bench

        return bench(["--raw", *argv[1:]])
    args = parse_argv(argv)
    if isinstance(args, PeerFlags | DemoFlags):
        config.apply_transport_profile(args.transport)
    if isinstance(args, ServerFlags):
        # late: this role's own modules (the note above _seconds)
        from mxref.metadata.main import run_server
        from mxref.metadata.transport import spread_full_collections

        spread_full_collections()  # this process is the server: its records are most of its objects
        return run_server(args)
    if isinstance(args, SourceFlags | ReaderFlags) and not install_credentials(args):
        return EXIT_USAGE
    if isinstance(args, SourceFlags):
        return run_source(args)
    if isinstance(args, ReaderFlags):
        return run_reader(args)
    if isinstance(args, PrepareFlags):
        return run_prepare(args)
    # late: this role's own modules (the note above _seconds)
    from mxref.bench.demo import run_demo

    return run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
