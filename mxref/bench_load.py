"""Where a load's time goes: whole load vs READ, this tree against a baseline, side by side.

``python -m mxref.bench_load --mib 256 --rounds 5 [--baseline PATH]`` starts a metadata server
and one source (central mode) holding a synthetic model of ``--mib`` MiB, then runs readers to
completion in interleaved rounds (so drift in the machine's load hits every variant alike):

* ``this``: ``python -m mxref reader`` from this tree, its defaults;
* ``baseline`` (with ``--baseline PATH``): the same command from another checkout of mxref
  (``PYTHONPATH=PATH``), e.g. the commit before a change, against the same source;
* ``raw`` (with ``--raw``): a raw two-process NIXL READ of the same size (``mxref.bench``: one
  descriptor, one handle, tight polling; its source pumped every 1 ms), a fresh raw source per
  round: its first READ (cold, as mxref's reader makes one READ on a fresh connection) and
  its second (warm).

``python -m mxref bench [--mib 64 256 ...]`` is this with ``--raw``.

Each reader's result line gives the whole load (``seconds``: ListSources to a verified load)
and the READ (``transfer_seconds``); ``load_done.phases`` says where the rest went. Printed:
a table of medians, the goal terms (whole load <= 1.5 x READ + 0.25 s at 256 MiB, <= 1.1 x READ
at 2 GiB) and one JSON line. Every child is stopped before it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mxref import config
from mxref.demo import STARTUP_TIMEOUT_S, Child
from mxref.process import die_with_parent

READER_TIMEOUT_S = 300.0


def _run_reader(workdir: Path, name: str, addr: str, model: list[str], root: Path) -> dict[str, Any]:
    """One reader of the mxref under ``root`` to completion: its result, its load_done phases and
    its process wall time. It runs in ``root`` (``-m`` puts the working directory first on the path)."""
    events = workdir / f"{name}.events.jsonl"
    env = dict(os.environ, PYTHONPATH=str(root))
    argv = [sys.executable, "-m", "mxref", "reader", "--name", name, "--events", str(events), "--server", addr,
            "--transfer-timeout", "60", "--settle-s", "0.05", *model]
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
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] == "load_done":
            phases = dict(ev.get("phases") or {})
    return {"load_s": result["seconds"], "read_s": result["transfer_seconds"], "wall_s": wall, "phases": phases}


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[256], help="model sizes in MiB (8 tensors each)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="another checkout of mxref to run as the baseline reader (its PYTHONPATH)")
    parser.add_argument("--raw", action="store_true", help="also a raw two-process NIXL READ per round")
    parser.add_argument("--transport", default="ucx-tcp", choices=sorted(config.TRANSPORT_PROFILES),
                        help="UCX profile of every process (default ucx-tcp)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    config.apply_transport_profile(args.transport)  # the raw READ runs in this process; children inherit it
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mxref-bench-load-"))
    variants = {"this": Path(__file__).resolve().parents[1]}
    if args.baseline:
        variants["baseline"] = Path(args.baseline).resolve()
        if not (variants["baseline"] / "mxref" / "__main__.py").is_file():
            parser.error(f"--baseline {args.baseline}: no mxref/__main__.py there")
    report = [_size(args, mib, workdir / f"{mib}MiB", variants) for mib in args.mib]
    print(json.dumps({"bench_load": report if len(report) > 1 else report[0]}))
    print(f"logs and events in {workdir}")
    return 0


def _size(args: argparse.Namespace, mib: int, workdir: Path, variants: dict[str, Path]) -> dict[str, Any]:
    """Every variant at one model size, interleaved rounds; prints its table, returns its summary."""
    from mxref.bench import raw_read

    workdir.mkdir(parents=True, exist_ok=True)
    model = ["--tensors", "8", "--tensor-mib", str(mib / 8), "--transport", args.transport]
    nbytes = 8 * int(mib / 8 * (1 << 20))
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    raw: list[list[float]] = []
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
            order = list(variants) if r % 2 == 0 else list(reversed(variants))  # alternate who goes first
            for v in order:
                rows[v].append(_run_reader(workdir, f"reader-{v}-{r}", addr, model, variants[v]))
            if args.raw:
                raw.append(raw_read(nbytes, repeat=2))  # [cold, warm] GB/s, a fresh raw source
    finally:
        for c in reversed(children):
            c.stop()
    summary: dict[str, Any] = {"mib": mib, "rounds": args.rounds, "variants": {}}
    print(f"{mib} MiB, {args.rounds} interleaved rounds, medians (s):")
    print(f"{'variant':10s} {'load':>7s} {'READ':>7s} {'load/READ':>9s} {'1.5xREAD+0.25':>13s} {'proc wall':>9s}  phases")
    for v, rs in rows.items():
        load, read, wall = _median(rs, "load_s"), _median(rs, "read_s"), _median(rs, "wall_s")
        names = sorted({p for r in rs for p in r["phases"]})
        phases = {p: round(statistics.median(r["phases"].get(p, 0.0) for r in rs), 4) for p in names}
        summary["variants"][v] = {"load_s": round(load, 4), "read_s": round(read, 4), "ratio": round(load / read, 3),
                                  "wall_s": round(wall, 4), "phases": phases,
                                  "load_samples": [round(r["load_s"], 4) for r in rs],
                                  "read_samples": [round(r["read_s"], 4) for r in rs]}
        print(f"{v:10s} {load:7.3f} {read:7.3f} {load / read:9.2f} {1.5 * read + 0.25:13.3f} {wall:9.3f}  "
              + " ".join(f"{p}={s:.3f}" for p, s in phases.items() if s))
    if "baseline" in rows:
        this, base = summary["variants"]["this"], summary["variants"]["baseline"]
        summary["this_over_baseline_load"] = round(this["load_s"] / base["load_s"], 3)
        print(f"whole load, this / baseline: {summary['this_over_baseline_load']:.2f}")
    if raw:
        this_gbps = nbytes / summary["variants"]["this"]["read_s"] / 1e9
        cold, warm = statistics.median(r[0] for r in raw), statistics.median(r[1] for r in raw)
        summary["raw"] = {"cold_gbps": round(cold, 3), "warm_gbps": round(warm, 3), "this_read_gbps": round(this_gbps, 3),
                          "read_over_raw_cold": round(this_gbps / cold, 3), "read_over_raw_warm": round(this_gbps / warm, 3),
                          "samples": [[round(x, 3) for x in r] for r in raw]}
        print(f"raw two-process NIXL READ: cold {cold:.2f} GB/s, warm {warm:.2f} GB/s; mxref READ {this_gbps:.2f} GB/s "
              f"= {this_gbps / cold:.2f} x raw cold, {this_gbps / warm:.2f} x raw warm")
    return summary


if __name__ == "__main__":
    sys.exit(main())
