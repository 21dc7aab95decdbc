"""``mxchaos soak``: transfers to death (``harness.soak``).

``mxchaos soak --transfers 10000 --out DIR`` (or ``--seconds 3600``, or both: whichever comes
first) runs loads between long-lived mxref sources and readers, samples each process between
rounds and writes ``DIR/samples.jsonl`` (as it goes), ``DIR/soak-result.json`` and ``DIR/soak.html``.
Exit 0: no resource grows and every load was verified; 1: a resource grows, a load failed or a
process died; 2: bad options or an ``--out`` holding a soak without ``--resume``; 130: interrupted
(the processes stopped and the outputs written first).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from harness.counts import at_least
from harness.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK
from harness.soak.fleet import FleetSpec
from harness.soak.runner import SoakOptions, run_soak
from harness.soak.verdict import growth_text
from harness.spec import parse_duration
from mxref.debug_hooks import LEAK_KINDS
from mxref.signals import QueuedSignal

__all__ = ["add_parser", "cmd_soak"]



def _seconds(text: str) -> float:
    try:
        value = float(parse_duration(text))
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="transfers to death: load after load between long-lived sources and readers; "
                                    "judge each resource's growth per 1000 transfers")
    p.add_argument("--transfers", type=at_least(1, "a number of transfers"), default=None, metavar="N",
                   help="stop after N transfers (loads), counted over every resumed segment")
    p.add_argument("--seconds", type=_seconds, default=None, metavar="S",
                   help="stop after this long (this invocation), e.g. 3600 or 1h")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="where samples.jsonl, soak-result.json, soak.html and the processes' logs go")
    p.add_argument("--resume", action="store_true", help="continue the soak recorded in --out (new processes)")
    p.add_argument("--sources", type=at_least(1, "a number of sources"), default=2, help="sources (default 2)")
    p.add_argument("--readers", type=at_least(1, "a number of readers"), default=2, help="looping readers (default 2)")
    p.add_argument("--tensors", type=at_least(1, "a number of tensors"), default=4, help="tensors of the model (default 4)")
    p.add_argument("--tensor-mib", type=float, default=0.25, help="MiB per tensor (default 0.25)")
    p.add_argument("--transport", default="ucx-tcp", help="mxref transport profile (default ucx-tcp: UCX_TLS=tcp)")
    p.add_argument("--source-mode", choices=("p2p", "central"), default="p2p",
                   help="p2p (default): readers fetch a source's NIXL metadata from its listener; central: "
                        "from the metadata server")
    p.add_argument("--source-fd-limit", type=at_least(1, "a descriptor limit"), default=None, metavar="N",
                   help="the sources' open-descriptor limit (RLIMIT_NOFILE; default: this process's): a "
                        "descriptor leak then ends in minutes what it ends in days at the usual limit")
    p.add_argument("--sample-every", type=at_least(1, "a number of transfers"), default=20, metavar="N",
                   help="transfers between two samples (default 20)")
    p.add_argument("--warmup", type=int, default=200, metavar="N",
                   help="transfers of each segment left out of the fit (default 200: a reader's RSS climbs over its first ~100-200 loads)")
    p.add_argument("--stop-on-growth", action="store_true", help="stop at the first resource that grows")
    p.add_argument("--leak", choices=LEAK_KINDS, default=None,
                   help="DEBUG: plant a per-transfer leak in the readers (mxref reader --debug-leak)")
    p.add_argument("--leak-readers", type=at_least(1, "a number of readers"), default=None, metavar="K",
                   help="with --leak: only the first K readers leak (default all)")
    p.set_defaults(fn=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    if args.transfers is None and args.seconds is None:
        print("mxchaos soak: give --transfers N, --seconds S or both", file=sys.stderr)
        return EXIT_INVALID
    if args.tensor_mib <= 0 or args.warmup < 0:
        print("mxchaos soak: --tensor-mib must be > 0 and --warmup >= 0", file=sys.stderr)
        return EXIT_INVALID
    spec = FleetSpec(sources=args.sources, readers=args.readers, tensors=args.tensors, tensor_mib=args.tensor_mib,
                     transport=args.transport, source_mode=args.source_mode, leak=args.leak, leak_readers=args.leak_readers,
                     source_fd_limit=args.source_fd_limit)
    options = SoakOptions(out=args.out, transfers=args.transfers, seconds=args.seconds, spec=spec,
                          sample_every=args.sample_every, warmup=args.warmup,
                          stop_on_growth=args.stop_on_growth, resume=args.resume)
    stop = threading.Event()
    # the handler only queues the signal: an Event.set inside it would wait for the lock its own
    # thread may hold mid-wait (mxref.signals); the relay's thread sets the event
    try:
        with QueuedSignal((signal.SIGINT, signal.SIGTERM), lambda _signum: stop.set(), "soak-signals"):
            summary = run_soak(options, lambda line: print(line, flush=True), stop)
    except (FileExistsError, ValueError) as exc:
        print(f"mxchaos soak: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(f"soak {summary['verdict'].upper()}: {summary['transfers']} transfers in {summary['seconds']:g}s "
          f"({summary['transfers_per_s']}/s), {summary['failed_loads']} failed loads")
    for g in summary["growths"]:
        print(f"  {growth_text(g)}")
    if summary.get("error"):
        print(f"  error: {summary['error']}")
    print(f"  page: {args.out / 'soak.html'}; summary: {args.out / 'soak-result.json'}")
    if stop.is_set():
        return EXIT_INTERRUPTED
    return EXIT_FAILED if summary["verdict"] in ("grows", "error", "failed_loads") else EXIT_OK
