"""Where a load's time goes: whole load vs READ, this tree against a baseline, side by side.

``python -m mxref.bench.load --mib 256 --rounds 9 [--baseline PATH]`` starts a metadata server
and one source (central mode) holding a synthetic model of ``--mib`` MiB, then runs readers to
completion in interleaved rounds (so drift in the machine's load hits every variant alike; odd
rounds run the raw READs first and every list in reverse, and each round records the 1-minute
load average as it starts, ``load_average``):

* ``this``: ``python -m mxref reader`` from this tree, its defaults (a chunked READ);
* ``this-single`` (unless ``--no-single``): the same with ``--read-chunk-mib 0``, the seed's one
  handle, so ``chunked_over_single`` says what chunking costs;
* ``this-nohash`` (unless ``--no-single``): chunked, with ``--no-hash-while-reading``: the default
  reader hashes landed tensors between its polls, so its READ phase holds checksum work
  (``hashing_in_read``, measured) that this one does after the READ. The READ goal terms are
  taken on it, the transfer alone; the default's READ is shown beside them;
* ``baseline`` (with ``--baseline PATH``): the same command from another checkout of mxref
  (``PYTHONPATH=PATH``), e.g. the commit before a change, against the same source;
* ``raw`` (with ``--raw``): a raw two-process NIXL READ of the same size (``mxref.bench.raw``: one
  descriptor, one handle, tight polling), a fresh raw source per round and per source progress
  (``--raw-progress``: pumped every 1 ms, NIXL's own progress thread; both by default): its
  first READ (cold, as mxref's reader makes one READ on a fresh connection) and its second
  (warm). The baseline is the fastest of them; each one's median is reported too;
* the TCP loopback ceiling (``mxref.bench.loopback``, unless ``--no-ceiling``): the same bytes copied
  over 127.0.0.1 inside this process, what any TCP transport could reach here.

``python -m mxref bench [--mib 64 256 ...]`` is this with ``--raw``.

Each reader's result line gives the whole load (``seconds``: ListSources to a verified load)
and the READ (``transfer_seconds``); ``load_done.phases`` says where the rest went, and a chunked
READ's ``transfer_done`` each chunk's post and completion and where its window idled
(``mxref.transfer.chunked.window_idle``: the reader's lag from a completion to the post refilling
its slot, the time the window was not kept full), and ``read_phases`` where the READ's time went
(``mxref.transfer.chunked.ReadClock``: prep, posting, polling, the checksums' share, release, the
loop's own bookkeeping), set beside the raw READ's own (first touch, agent, registration, post,
poll, release) as medians with 95 % intervals over the rounds (``mxref.bench.report.read_phases``). Printed
(``mxref.bench.report``): a table of medians, the goal terms as ratios (mxref READ >= 0.95 x
the fastest raw READ, chunked >= 0.95 x single handle; whole load <= 1.5 x READ + 0.25 s at
256 MiB, <= 1.1 x READ at 2 GiB), raw and mxref over the ceiling, and one JSON line. Absolute
GB/s drift with the machine's load; the ratios, measured in the same rounds, are the figures.
Every child is stopped before it returns, every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxref import config
from mxref.bench.demo import STARTUP_TIMEOUT_S, Child
from mxref.bench.report import NOHASH, SINGLE, summarize, table
from mxref.options import parse
from mxref.process import die_with_parent

READER_TIMEOUT_S = 300.0
# a reader's load_phase -> the READ phase it is (the raw READ's terms, mxref.bench.raw)
TARGET_PHASES = {"allocate": "first_touch_s", "agent": "agent_s", "register": "register_s"}
MAX_MIB = 2048
CEILING_PER_ROUND = 3  # loopback copies per round (cheap: a fraction of a READ each)


def _run_reader(workdir: Path, name: str, addr: str, model: list[str], root: Path,
                extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One reader of the mxref under ``root`` to completion: its result, its load_done phases and
    its process wall time. It runs in ``root`` (``-m`` puts the working directory first on the path)."""
    events = workdir / f"{name}.events.jsonl"
    env = dict(os.environ, PYTHONPATH=str(root))
    argv = [sys.executable, "-m", "mxref", "reader", "--name", name, "--events", str(events), "--server", addr,
            "--transfer-timeout", "60", "--settle-s", "0.05", *model, *extra]
    t0 = time.monotonic()
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, cwd=root, start_new_session=True,
                                preexec_fn=die_with_parent)
        try:
            out, _ = proc.communicate(timeout=READER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RuntimeError(f"{name} did not finish within {READER_TIMEOUT_S:.0f}s; see {workdir}") from None
    wall = time.monotonic() - t0
    lines = [ln for ln in out.decode().splitlines() if ln.startswith('{"result"')]
    if not lines:
        raise RuntimeError(f"{name} printed no result (exit {proc.returncode}); see {workdir / (name + '.log')}")
    result: dict[str, Any] = json.loads(lines[-1])["result"]
    if not (result["ok"] and result["path"] == "rdma" and result["integrity"] == "verified"):
        raise RuntimeError(f"{name} did not load over rdma verified: {result}")
    phases: dict[str, float] = {}
    hashing = 0.0
    window: dict[str, float] = {}
    read_phases: dict[str, float] = {}
    target: dict[str, float] = {}  # the READ target's preparation, on the load's path or beside it
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] == "load_done":
            phases = dict(ev.get("phases") or {})
        elif ev["event"] == "load_phase" and ev.get("phase") in TARGET_PHASES:
            target[TARGET_PHASES[ev["phase"]]] = target.get(TARGET_PHASES[ev["phase"]], 0.0) + float(ev["seconds"])
        elif ev["event"] == "transfer_done":
            hashing = float(ev.get("hashing_s") or 0.0)  # the READ's polls' share of the checksums
            window = dict(ev.get("window") or {})  # where a chunked READ's window idled (one handle: none)
            read_phases = dict(ev.get("read_phases") or {})  # where a chunked READ's time went (one handle: none)
    if read_phases:
        read_phases = {**target, **read_phases, "chunk_wait_s": window.get("chunk_wait_s", 0.0),
                       "post_lag_s": window.get("post_lag_s", 0.0), "underfull_s": window.get("underfull_s", 0.0)}
    return {"load_s": result["seconds"], "read_s": result["transfer_seconds"], "wall_s": wall,
            "phases": {**phases, "hashing_in_read": hashing} if hashing else phases, "window": window,
            "read_phases": read_phases}


@dataclass(frozen=True, kw_only=True)
class BenchFlags:
    """``python -m mxref bench``'s flags (``mxref.bench.load``), typed (``mxref.options``)."""

    mib: list[int]
    rounds: int
    baseline: str | None
    single: bool
    variant: list[str]
    raw: bool
    raw_progress: list[str]
    ceiling: bool
    transport: str
    workdir: Path | None


def build_parser() -> argparse.ArgumentParser:
    from mxref.bench.raw import SOURCE_PROGRESS

    parser = argparse.ArgumentParser(prog="python -m mxref.bench.load", description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=config.whole_number_arg("a model size", 1, MAX_MIB, "MiB"), nargs="+", default=[64, 256],
                        help=f"model sizes in MiB, 1..{MAX_MIB} (8 tensors each; default 64 256)")
    parser.add_argument("--rounds", type=config.whole_number_arg("rounds", 1), default=9,
                        help="interleaved rounds per size (default 9: the fewest whose 95%% interval for a ratio's "
                             "median leaves out the lowest and the highest round)")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="another checkout of mxref to run as the baseline reader (its PYTHONPATH)")
    parser.add_argument("--single", action=argparse.BooleanOptionalAction, default=True,
                        help="also this tree's reader with one READ handle (--read-chunk-mib 0), and chunked "
                             "but hashing only after the READ (--no-hash-while-reading) (default on)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="also this tree's reader with these extra flags, e.g. "
                             "'c8w4=--read-chunk-mib 8 --read-window 4' (repeatable)")
    parser.add_argument("--raw", action="store_true", help="also a raw two-process NIXL READ per round")
    parser.add_argument("--raw-progress", nargs="+", choices=SOURCE_PROGRESS, default=list(SOURCE_PROGRESS),
                        help="the raw source's progress variants; the fastest is the baseline (default: all)")
    parser.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=True,
                        help="also the in-process TCP loopback ceiling per round (default on)")
    parser.add_argument("--transport", default="ucx-tcp", choices=sorted(config.TRANSPORT_PROFILES),
                        help="UCX profile of every process (default ucx-tcp)")
    parser.add_argument("--workdir", type=Path, default=None)
    return parser


def reader_variants(args: BenchFlags, parser: argparse.ArgumentParser) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Reader variant -> (the mxref checkout it runs from, its extra reader flags)."""
    here = Path(__file__).resolve().parents[2]
    variants: dict[str, tuple[Path, tuple[str, ...]]] = {"this": (here, ())}
    if args.single:
        variants[SINGLE] = (here, ("--read-chunk-mib", "0"))
        variants[NOHASH] = (here, ("--no-hash-while-reading",))
    for text in args.variant:
        name, sep, flags = text.partition("=")
        if not sep or not name.strip() or name.strip() in variants:
            parser.error(f"--variant {text!r}: write NAME=FLAGS with a new name, e.g. 'c8w4=--read-chunk-mib 8 --read-window 4'")
        variants[name.strip()] = (here, tuple(flags.split()))
    if args.baseline:
        base = Path(args.baseline).resolve()
        if not (base / "mxref" / "__main__.py").is_file():
            parser.error(f"--baseline {args.baseline}: no mxref/__main__.py there")
        variants["baseline"] = (base, ())
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv, BenchFlags)
    variants = reader_variants(args, parser)
    config.apply_transport_profile(args.transport)  # the raw READ runs in this process; children inherit it
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mxref-bench-load-"))
    report = [_size(args, mib, workdir / f"{mib}MiB", variants) for mib in args.mib]
    print(json.dumps({"bench_load": report if len(report) > 1 else report[0]}))
    print(f"logs and events in {workdir}")
    return 0


def _size(args: BenchFlags, mib: int, workdir: Path,
          variants: dict[str, tuple[Path, tuple[str, ...]]]) -> dict[str, Any]:
    """Every variant at one model size, interleaved rounds; prints its table, returns its summary."""
    from mxref.bench.loopback import loopback_gbps
    from mxref.bench.raw import raw_read

    workdir.mkdir(parents=True, exist_ok=True)
    model = ["--tensors", "8", "--tensor-mib", str(mib / 8), "--transport", args.transport]
    nbytes = 8 * int(mib / 8 * (1 << 20))
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    raw: dict[str, list[list[float]]] = {k: [] for k in args.raw_progress} if args.raw else {}
    raw_phases: dict[str, list[dict[str, float]]] = {k: [] for k in raw}  # per round: its cold READ's phases
    ceiling: list[float] = []
    loads: list[float] = []  # the 1-minute load average at each round's start
    children: list[Child] = []
    try:
        server = Child(workdir, "server", "server", "--heartbeat-timeout", "60")
        children.append(server)
        port = server.wait_event("listening", STARTUP_TIMEOUT_S, what="grpc")["port"]
        addr = f"127.0.0.1:{port}"
        source = Child(workdir, "source", "source", "--server", addr, "--mode", "central", "--heartbeat-interval",
                       "5", *model)
        children.append(source)
        source.wait_event("status_change", STARTUP_TIMEOUT_S * 2, status="READY")
        for r in range(args.rounds):
            loads.append(round(os.getloadavg()[0], 2))  # the machine's load as the round starts
            forward = r % 2 == 0  # alternate who goes first: the readers or the raw READs, and within each
            readers = [(v, None) for v in (variants if forward else reversed(variants))]
            raws = [(None, k) for k in (list(raw) if forward else reversed(list(raw)))]
            for v, k in readers + raws if forward else raws + readers:
                if v is not None:
                    rows[v].append(_run_reader(workdir, f"reader-{v}-{r}", addr, model, *variants[v]))
                elif k is not None:
                    reads: list[dict[str, float]] = []
                    raw[k].append(raw_read(nbytes, repeat=2, progress=k, phases=reads))  # [cold, warm] GB/s, a fresh raw source
                    raw_phases[k].append(reads[0])
            if args.ceiling:
                ceiling.extend(loopback_gbps(nbytes) for _ in range(CEILING_PER_ROUND))
    finally:
        for c in reversed(children):
            c.stop()
    summary = summarize(mib, nbytes, rows, raw, ceiling, raw_phases=raw_phases)
    summary["load_average"] = loads
    print(f"load average (1 min) at each round's start: {' '.join(f'{x:.2f}' for x in loads)}")
    for line in table(summary):
        print(line)
    return summary


if __name__ == "__main__":
    sys.exit(main())
