"""The scale-up storm: R readers load one model at once from S sources, beside a raw NIXL fan-out.

``python -m mxref bench storm --readers 1 4 8 --sources 1 2 --mib 64 --rounds 5`` starts, on this
machine over UCX-over-TCP (``--transport``), a metadata server and, per S, S sources of one
synthetic model (``--mib`` MiB in 8 tensors; ``--mode`` central by default; the ModelExpress
storms read P2P sources started for them) and S raw sources of
the same bytes (``mxref.bench.raw --serve``). Per (R, S) cell, in ``--rounds`` interleaved rounds
(alternating who goes first, so drift in the machine's load hits both alike):

* the storm: R long-lived mxref readers (``mxref reader --load-loop``, started and warmed before
  the first round) are told ``load`` at the same instant (the go); each verified load's result
  line is stamped by this process as it arrives. Meanwhile this process lists the model's
  sources (``ListSources``, every ``--list-interval``) on a connection of its own and times every
  call: the server's ListSources p50/p99 *during* storms, measured here;
* the raw fan-out (the ceiling): R raw readers (``mxref.bench.storm_procs``: one descriptor, one
  handle, tight polling), reader i on raw source i mod S, told ``read`` at one instant.

Then, with S >= 2 and ``--frozen-rounds``, storms in which source 1 is SIGSTOPped mid-storm
(``--freeze-at`` of the healthy storms' median wall time after the go) and thawed when every
reader is done: its readers stall and move on. With ``--mx-python`` (the modelexpress subject's
interpreter, e.g. ``~/.cache/mxchaos/envs/subject-modelexpress-0.7.0/bin/python``; ``mxchaos run``
builds it), the same storm of the real ModelExpress client's readers (``mxref.modelexpress.adapter
reader --start-on-stdin``: one process per reader and round, started and imported before the go)
for the cells ``--mx-readers`` names, a differential row beside mxref's. With ``--baseline PATH``
(another checkout of mxref, e.g. the commit before a change), a second pool of R readers runs
that checkout's code (``PYTHONPATH=PATH``, started in PATH) against the same sources, stormed in
the same interleaved rounds (storm, raw, baseline; the next round the other way round): the row
``baseline`` and, on mxref's, the per-round ratio of the two aggregates (``over_baseline``). With
``--baseline-sources`` too, the baseline arm swaps the sources instead: S sources of PATH's code
serve the same bytes under another model name (``BASELINE_MODEL``, so each arm's readers list only
their own sources), read by a second pool of this tree's readers.

Every figure is summed up and judged by ``mxref.bench.storm_stats`` (each the median over the
rounds with an interval; the goals, as same-run ratios, MET, MISSED or UNDECIDED by their
intervals: aggregate >= 0.8 x raw fan-out, no source over 1.5 x its fair share of READs, p99 <=
2 x p50, no fallback and no stall in a healthy storm, a frozen storm's p99 <= 2 x the healthy
one's); printed as a table and one JSON line (``--json PATH`` also writes it). Every child is
stopped before it returns (SIGCONT, SIGTERM, then SIGKILL), on a Ctrl-C or a SIGTERM too; a frozen
source is thawed when its round ends, however it ends; every child is in the bench's process group
and is SIGKILLed by the kernel if the bench dies (``mxref.bench.storm_procs``); every wait is bounded.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxref import config
from mxref.bench.storm_procs import Freeze, LineChild, deferred_signals
from mxref.bench.storm_stats import StormRound, figure, interval_text, reader_outcome, storm_round, summarize_cell, table
from mxref.options import parse

STARTUP_TIMEOUT_S = 300.0
HEARTBEAT_TIMEOUT_S = 5.0  # the sources heartbeat every second
START_BATCH = 4
LOAD_TIMEOUT_S = 120.0
MAX_READERS = 64
MODEL_TENSORS = 8
MODEL = "mxref/synthetic"
BASELINE_MODEL = "mxref/synthetic-baseline"  # --baseline-sources: the baseline checkout's sources serve it
HERE = Path(__file__).resolve().parents[2]


def _mxref(*args: str) -> list[str]:
    return [sys.executable, "-m", "mxref", *args]


class Storm:
    """One run: a server, per S its sources, reader pools, and the rounds of every cell."""

    def __init__(self, args: StormFlags, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.model = ["--tensors", str(MODEL_TENSORS), "--tensor-mib", f"{args.mib / MODEL_TENSORS:g}",
                      "--transport", args.transport]
        self.nbytes = MODEL_TENSORS * int(args.mib / MODEL_TENSORS * (1 << 20))
        self.children: list[LineChild] = []
        self.address = ""
        self._digests: dict[str, str] = {}  # model name -> its reference's digest (the listing's identity)
        self._named = 0  # source numbers handed out from 100 (``fresh_names``)
        self._generation = 0  # reader pools renewed so far (``renew_readers``)

    def child(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              stdin_quits: bool = True, cwd: Path = HERE) -> LineChild:
        self._events(name).unlink(missing_ok=True)  # a reused --workdir: no event of an earlier run counts
        c = LineChild(name, argv, self.workdir / f"{name}.log", env=env, cwd=cwd, stdin_quits=stdin_quits)
        self.children.append(c)
        return c

    def stop_all(self, children: Sequence[LineChild] | None = None) -> None:
        group = list(self.children if children is None else children)
        for c in reversed(group):
            c.stop()
            if c in self.children:
                self.children.remove(c)

    def _events(self, name: str) -> Path:
        return self.workdir / f"{name}.events.jsonl"

    def start_server(self) -> None:
        server = self.child("server", _mxref("server", "--name", "server", "--events", str(self._events("server")),
                                             "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT_S:g}",
                                             "--reaper-interval", "0.5"), stdin_quits=False)
        self.address = f"127.0.0.1:{_await_event(self._events('server'), 'listening', server)['port']}"

    def start_sources(self, count: int, first: int = 0, mode: str | None = None,
                      checkout: Path | None = None) -> list[LineChild]:
        """Sources ``first`` .. ``first + count - 1``, each READY before this returns; with
        ``checkout``, that checkout's sources of ``BASELINE_MODEL`` (``--baseline-sources``)."""
        names = [f"{'baseline-' if checkout else ''}source-{s}" for s in range(first, first + count)]
        env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
        sources = [self.child(n, _mxref("source", "--name", n, "--events", str(self._events(n)), "--server",
                                        self.address, "--mode", mode or self.args.mode, "--heartbeat-interval", "1",
                                        *self.model_args(checkout)), env=env, cwd=checkout or HERE, stdin_quits=False)
                   for n in names]
        for n, c in zip(names, sources):
            _await_event(self._events(n), "status_change", c, status="READY")
        return sources

    def model_args(self, baseline_sources: Path | None) -> list[str]:
        """The model flags of a source or reader: ``BASELINE_MODEL`` on the baseline sources' side."""
        return [*self.model, "--model-name", BASELINE_MODEL if baseline_sources else MODEL]

    def replace_dead(self, sources: list[LineChild], when: str, checkout: Path | None = None) -> list[str]:
        """Each source of ``sources`` whose process has exited, replaced (``replace_source``) and
        said so; the names of those replaced."""
        gone = []
        for i, c in enumerate(sources):
            if c.popen.poll() is not None:
                print(f"storm: {c.name} exited ({c.popen.returncode}) {when}; see {c.log}; replaced", flush=True)
                gone.append(c.name)
                self.replace_source(sources, i, checkout)
        return gone

    def replace_source(self, sources: list[LineChild], index: int, checkout: Path | None = None) -> None:
        """A fresh source in place of ``sources[index]`` (a frozen and thawed source is not trusted
        to serve again: UCX under SIGSTOP has been seen to abort on the thaw). The new one takes
        a new name; the server drops the old record when its process says STALE on exit."""
        self.stop_all([sources[index]])
        sources[index] = self.start_sources(1, first=self.fresh_names(1), checkout=checkout)[0]

    def fresh_names(self, count: int) -> int:
        """The first of ``count`` source numbers no source of this run has had (from 100), so
        a later source never takes an earlier one's name, log or events file."""
        self._named += count
        return 100 + self._named - count

    def start_raw_sources(self, count: int) -> list[tuple[LineChild, int, int]]:
        from mxref.process import free_port

        out = []
        for s in range(count):
            port = free_port()
            c = self.child(f"raw-source-{s}", [sys.executable, "-m", "mxref.bench.raw", "--serve", str(port), "--bytes",
                                               str(self.nbytes), "--seconds", "86400", "--progress", "pump",
                                               "--transport", self.args.transport], stdin_quits=False)
            _, info = c.expect("addr", STARTUP_TIMEOUT_S)
            out.append((c, port, int(info["addr"])))
        return out

    def start_readers(self, count: int, checkout: Path | None = None,
                      baseline_sources: Path | None = None, generation: int = 0) -> list[LineChild]:
        """``count`` long-lived readers, started ``START_BATCH`` at a time (dozens of NIXL
        start-ups at once on a small machine outlast any sane deadline), each ready; with
        ``checkout``, that checkout's readers (``--baseline``), named ``baseline-reader-i``; with
        ``baseline_sources``, this tree's readers of ``BASELINE_MODEL``, named so too. A
        ``generation`` after the first (``renew_readers``) is in the names (``reader-i.gN``), so
        no earlier reader's log or events are overwritten."""
        readers: list[LineChild] = []
        prefix = "baseline-reader" if checkout or baseline_sources else "reader"

        def prefix_of(i: int) -> str:
            return f"{prefix}-{i}.g{generation}" if generation else f"{prefix}-{i}"

        env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
        for first in range(0, count, START_BATCH):
            batch = [self.child(prefix_of(i), _mxref("reader", "--name", prefix_of(i), "--events",
                                                     str(self._events(prefix_of(i))), "--server", self.address,
                                                        "--load-loop", "--settle-s", "0.05", "--transfer-timeout", "30",
                                                        "--selector", self.args.selector, "--selector-seed", str(i),
                                                        *self.model_args(baseline_sources)),
                                env=env, cwd=checkout or HERE)
                     for i in range(first, min(count, first + START_BATCH))]
            for r in batch:
                _, ready = r.expect("ready", STARTUP_TIMEOUT_S)
                r.says_idle = bool(ready["ready"].get("idle"))  # a --baseline checkout's may not
            readers.extend(batch)
        return readers

    def renew_readers(self, pool: list[LineChild], count: int) -> None:
        """The first ``count`` readers of ``pool`` stopped and started afresh (the next generation):
        a reader whose READ was released mid-flight (a frozen round's stall) keeps that READ's
        memory parked until it exits (the late-write guard, ``mxref.roles.reader``), so a pool
        that kept its readers through many frozen rounds grew by a model per stall (a 64 MiB
        storm's readers reached 1.1 GB each, and the machine ran out of memory)."""
        self._generation += 1
        self.stop_all(pool[:count])
        pool[:count] = self.start_readers(count, generation=self._generation)

    def start_raw_readers(self, count: int) -> list[LineChild]:
        raws = [self.child(f"raw-reader-{i}", [sys.executable, "-m", "mxref.bench.storm_procs", "--transport",
                                               self.args.transport]) for i in range(count)]
        return raws

    def connect_raw(self, raws: Sequence[LineChild], sources: Sequence[tuple[LineChild, int, int]]) -> None:
        for first in range(0, len(raws), START_BATCH):
            batch = list(enumerate(raws))[first:first + START_BATCH]
            for i, r in batch:
                _, port, addr = sources[i % len(sources)]
                r.send(f"connect 127.0.0.1 {port} {addr} {self.nbytes}")
            for _, r in batch:
                r.expect("ready", STARTUP_TIMEOUT_S)

    def round(self, children: Sequence[LineChild], command: str, listings: list[float] | None = None,
              freeze: tuple[LineChild, float] | None = None, model: str = MODEL,
              cpu: Mapping[str, Sequence[LineChild]] | None = None) -> dict[str, Any]:
        """Tell every child ``command`` at once and collect one result from each; with
        ``listings``, ListSources is timed meanwhile; with ``freeze`` (a source, seconds after
        the go), that source is SIGSTOPped then (``Freeze``) and thawed when every result is in,
        or the round ends otherwise, before anything is judged; with ``cpu`` (a role -> its
        processes), each role's CPU seconds from the go to the last result (``cpu_s``)."""
        cpu_at_go = {role: sum(c.cpu_s() for c in group) for role, group in (cpu or {}).items()}
        stop = threading.Event()
        lister = threading.Thread(target=self._list, args=(listings, stop, model), daemon=True) if listings is not None else None
        frost = Freeze(*freeze) if freeze is not None else None
        rnd = StormRound(readers=len(children), go_s=time.monotonic())
        try:
            for c in children:
                c.send(command)
            if lister is not None:
                lister.start()
            if frost is not None:
                frost.start()
            for c in children:
                stamp, line = c.expect("result", LOAD_TIMEOUT_S)
                rnd.outcomes.append(reader_outcome(line["result"], stamp))
        finally:
            stop.set()
            if frost is not None:
                frost.close()  # before anything else: no frozen source outlives its round
            if lister is not None and lister.ident is not None:
                lister.join(15)
        out = storm_round(rnd, self.nbytes)
        out["cpu_s"] = {role: round(sum(c.cpu_s() for c in (cpu or {})[role]) - at_go, 3)
                        for role, at_go in cpu_at_go.items()}
        for c in children:  # every looping reader has given its load back and made its next target:
            if c.says_idle:  # the next round starts each as a fresh reader starts its first load
                c.expect("idle", LOAD_TIMEOUT_S)
        if frost is not None:
            out["freeze_landed"] = frost.landed
        return out

    def _lister(self, model: str = MODEL) -> Any:
        from mxref.bench.fleet import Lister
        from mxref.model import ModelSpec, Reference
        from mxref.roles.source import identity_for
        from mxref.v1 import p2p_pb2

        spec = ModelSpec(name=model, tensors=MODEL_TENSORS, tensor_bytes=self.nbytes // MODEL_TENSORS,
                         dtype="float16", seed=0)
        if model not in self._digests:
            self._digests[model] = Reference.from_spec(spec).digest
        identity = identity_for(spec.name, spec.dtype, revision=self._digests[model])
        return Lister(self.address, {"identity": p2p_pb2.ListSourcesRequest(
            identity=identity, status_filter=p2p_pb2.SOURCE_STATUS_READY)})

    def _list(self, out: list[float], stop: threading.Event, model: str) -> None:
        lister = self._lister(model)
        try:
            out.extend(lister.run(10**6, stop, seconds=LOAD_TIMEOUT_S, interval_s=self.args.list_interval)["identity"])
        finally:
            lister.close()

    def await_listed(self, count: int, timeout_s: float = HEARTBEAT_TIMEOUT_S + 15, model: str = MODEL) -> None:
        """Until the server offers exactly ``count`` READY sources: a source that died without
        saying STALE (UCX aborts it) stays listed until the heartbeat timeout, and a storm that
        found it would count its refusals against the live ones."""
        lister = self._lister(model)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                lister.run(1)
                if lister.sizes.get("identity") == count:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the server still lists {lister.sizes.get('identity')} sources, not {count}, "
                                       f"after {timeout_s:g}s")
                time.sleep(0.25)
        finally:
            lister.close()

    def mx_round(self, count: int, tag: str, listings: list[float]) -> dict[str, Any]:
        """The same storm of ModelExpress client readers: each its own process, imported and
        waiting before the go (``--start-on-stdin``), one load, then gone."""
        env = dict(os.environ, PYTHONPATH=str(HERE))
        python = self.args.mx_python
        if python is None:
            raise ValueError("a ModelExpress storm needs --mx-python")
        readers = [self.child(f"mx-reader-{tag}-{i}", [python, "-m", "mxref.modelexpress.adapter", "reader",
                                                       "--name", f"mx-reader-{tag}-{i}", "--events",
                                                       str(self._events(f"mx-reader-{tag}-{i}")), "--server",
                                                       self.address, "--start-on-stdin", "--transfer-timeout", "30",
                                                       *self.model], env=env)
                   for i in range(count)]
        try:
            for r in readers:
                r.expect("ready", STARTUP_TIMEOUT_S)
            return self.round(readers, "go", listings)
        finally:
            self.stop_all(readers)


def cpu_figures(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An arm's CPU over its rounds (``Storm.round``'s ``cpu_s``): its readers' and its sources'
    CPU seconds per round, and the sources' over the readers' within each round."""
    cpu = [x["cpu_s"] for x in rounds if x.get("cpu_s")]
    return {"readers_s": figure([c["readers"] for c in cpu]), "sources_s": figure([c["sources"] for c in cpu]),
            "sources_over_readers": figure([c["sources"] / c["readers"] for c in cpu if c["readers"] > 0])}


def _await_event(path: Path, name: str, child: LineChild, timeout_s: float = STARTUP_TIMEOUT_S,
                 **where: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                ev = json.loads(line) if line.strip() else {}
                if ev.get("event") == name and all(ev.get(k) == v for k, v in where.items()):
                    return ev
        if child.popen.poll() is not None:
            raise RuntimeError(f"{child.name} exited ({child.popen.returncode}) before {name}; see {child.log}")
        time.sleep(0.05)
    raise TimeoutError(f"{child.name}: no {name} {where or ''} within {timeout_s:g}s; see {child.log}")


def run(args: StormFlags, workdir: Path) -> list[dict[str, Any]]:
    storm = Storm(args, workdir)
    cells: list[dict[str, Any]] = []
    most = max(args.readers)
    try:
        storm.start_server()
        readers = storm.start_readers(most)
        base_sourced = args.baseline if args.baseline_sources else None  # the baseline arm's sources
        base = (storm.start_readers(most, baseline_sources=base_sourced) if base_sourced
                else storm.start_readers(most, args.baseline) if args.baseline else [])
        raws = storm.start_raw_readers(most)
        for s in args.sources:
            sources = storm.start_sources(s)
            base_sources = storm.start_sources(s, checkout=base_sourced) if base_sourced else []
            raw_sources = storm.start_raw_sources(s)
            storm.connect_raw(raws, raw_sources)
            for r in args.readers:
                cells.extend(_cell(storm, args, readers[:r], raws[:r], sources, base[:r], base_sources,
                                   [c for c, _, _ in raw_sources]))
                if frozen_rounds(args, s):  # its stalled readers hold parked memory: fresh ones
                    storm.renew_readers(readers, r)
            storm.stop_all([c for c, _, _ in raw_sources])
            storm.stop_all(base_sources)
            storm.stop_all(sources)
    finally:
        with deferred_signals():  # a second Ctrl-C does not cut the stopping short
            storm.stop_all()
    return cells


def frozen_rounds(args: StormFlags, sources: int) -> int:
    """How many frozen rounds a cell of ``sources`` sources has: ``--frozen-rounds``, none with one
    source (its readers would have nowhere to move on to)."""
    return args.frozen_rounds if sources >= 2 else 0


def _cell(storm: Storm, args: StormFlags, readers: list[LineChild], raws: list[LineChild],
          sources: list[LineChild], base: list[LineChild], base_sources: list[LineChild],
          raw_sources: list[LineChild]) -> list[dict[str, Any]]:
    """One (R, S) cell; ``base_sources``: the baseline checkout's sources (``--baseline-sources``), or none.
    Each arm's rounds also count its readers' and its sources' CPU seconds (``cpu_figures``)."""
    r, s = len(readers), len(sources)
    base_model = BASELINE_MODEL if base_sources else MODEL
    storm.replace_dead(sources, f"before cell {r}x{s}")  # UCX aborted one in the last cell: replaced, not stormed
    storm.replace_dead(base_sources, f"before cell {r}x{s}", args.baseline)
    storm.await_listed(s)
    if base_sources:
        storm.await_listed(s, model=BASELINE_MODEL)
    storms: list[dict[str, Any]] = []
    rawr: list[dict[str, Any]] = []
    listings: list[float] = []
    based: list[dict[str, Any]] = []
    base_listings: list[float] = []
    # each round: (who, the command, where its result goes, its ListSources times, the model listed,
    # its sources); odd rounds backwards
    arms: list[tuple[list[LineChild], str, list[dict[str, Any]], list[float] | None, str, list[LineChild]]] = [
        (readers, "load", storms, listings, MODEL, sources), (raws, "read", rawr, None, MODEL, raw_sources)]
    if base:
        arms.append((base, "load", based, base_listings, base_model, base_sources or sources))
    for k in range(args.rounds):
        for children, command, results, times, model, feeding in arms if k % 2 == 0 else reversed(arms):
            results.append(storm.round(children, command, times, model=model,
                                       cpu={"readers": children, "sources": feeding}))
    frozen: list[dict[str, Any]] = []
    if frozen_rounds(args, s):
        wall = sorted(x["wall_s"] for x in storms)[len(storms) // 2]
        for k in range(frozen_rounds(args, s)):
            frozen.append(storm.round(readers, "load", freeze=(sources[1], args.freeze_at * wall)))
            storm.replace_source(sources, 1)
            # a reader that released a READ on a live source (a stall called on a queued first window)
            # can make that source abort in UCX (NIXL 1.5.1): counted, replaced before the next round
            frozen[-1]["sources_lost"] = storm.replace_dead(sources, f"in frozen round {k + 1} of {r}x{s}")
            storm.await_listed(s)  # the replaced ones no longer offered (one UCX aborted is listed until its heartbeats run out)
    cell = summarize_cell(r, s, storm.nbytes, storms, rawr, frozen, listings)
    cell["subject"] = "mxref"
    if frozen:
        cell["frozen_sources_lost"] = [x["sources_lost"] for x in frozen]  # per frozen round, besides the frozen one
    cell["cpu"] = cpu_figures(storms)
    cell["raw_cpu"] = cpu_figures(rawr)
    out = [cell]
    if base:
        base_cell = summarize_cell(r, s, storm.nbytes, based, rawr, (), base_listings)
        base_cell["subject"] = "baseline"
        base_cell["cpu"] = cpu_figures(based)
        cell["figures"]["over_baseline"] = figure([n / d for n, d in zip(cell["aggregate_rounds"],
                                                                          base_cell["aggregate_rounds"]) if d > 0])
        out.append(base_cell)
    print("\n".join(table(out)), flush=True)
    for name, fig in (("mxref", cell["cpu"]), ("raw fan-out", cell["raw_cpu"]),
                      *((("baseline", base_cell["cpu"]),) if base else ())):
        print(f"  CPU s per round {r}x{s}, {name}: readers {interval_text(fig['readers_s'])}, sources "
              f"{interval_text(fig['sources_s'])} ({interval_text(fig['sources_over_readers'])} of the readers')",
              flush=True)
    if base:
        print(f"  mxref / baseline aggregate {r}x{s}, per round: {interval_text(cell['figures']['over_baseline'])}",
              flush=True)
    lost = sum(len(x) for x in cell.get("frozen_sources_lost", ()))
    if lost:
        print(f"  mxref {r}x{s} frozen rounds: {lost} live sources exited besides the frozen one (see 'exited' above)",
              flush=True)
    if args.mx_python and r in args.mx_readers:
        # the ModelExpress client takes a central source's dtype ('float16') for a mismatch with its
        # own spelling ('torch.float16') and falls back: its storms read P2P sources, started for them
        storm.stop_all(sources)
        mx_sources = storm.start_sources(s, first=storm.fresh_names(s), mode="p2p")
        mx_listings: list[float] = []
        try:
            storm.await_listed(s)
            mx = [storm.mx_round(r, f"{r}x{s}-{k}", mx_listings) for k in range(args.mx_rounds)]
        finally:
            storm.stop_all(mx_sources)
            sources[:] = storm.start_sources(s, first=storm.fresh_names(s))
        mx_cell = summarize_cell(r, s, storm.nbytes, mx, rawr, (), mx_listings)
        mx_cell["subject"] = "modelexpress"
        mx_cell["goals"].pop("aggregate_over_raw", None)  # its raw rounds ran beside mxref's storms, not its own
        mx_cell["figures"].pop("storm_over_raw", None)
        mx_cell["over_mxref_aggregate"] = round(mx_cell["aggregate_gbps"] / cell["aggregate_gbps"], 3)
        print("\n".join(table([mx_cell])), flush=True)
        out.append(mx_cell)
    return out


@dataclass(frozen=True, kw_only=True)
class StormFlags:
    """``python -m mxref bench storm``'s flags, typed (``mxref.options``)."""

    readers: list[int]
    sources: list[int]
    mib: int
    rounds: int
    frozen_rounds: int
    freeze_at: float
    selector: str
    mode: str
    list_interval: float
    mx_python: str | None
    mx_readers: list[int]
    mx_rounds: int
    transport: str
    baseline: Path | None
    baseline_sources: bool
    workdir: Path | None
    json: Path | None


def build_parser() -> argparse.ArgumentParser:
    readers = config.whole_number_arg("readers", 1, MAX_READERS)
    parser = argparse.ArgumentParser(prog="python -m mxref bench storm", description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=readers, nargs="+", default=[1, 4, 8],
                        help=f"readers per storm, 1..{MAX_READERS} (default 1 4 8)")
    parser.add_argument("--sources", type=config.whole_number_arg("sources", 1, 16), nargs="+", default=[1, 2],
                        help="sources of the model, 1..16 (default 1 2)")
    parser.add_argument("--mib", type=config.whole_number_arg("a model size", 8, 1024, "MiB"), default=64,
                        help="model size in MiB, 8 tensors (default 64)")
    parser.add_argument("--rounds", type=config.whole_number_arg("rounds", 1, 99), default=5,
                        help="interleaved storm/raw rounds per cell (default 5; 2 or more give each figure an interval, "
                             "6 or more one of 95%% that can decide a goal)")
    parser.add_argument("--frozen-rounds", type=config.whole_number_arg("frozen rounds", 0, 99), default=2,
                        help="storms per cell with S >= 2 in which source 1 is frozen mid-storm (default 2; 7 or more, "
                             "with as many --rounds, can decide the frozen goal)")
    parser.add_argument("--freeze-at", type=float, default=0.3, metavar="FRACTION",
                        help="when the freeze lands, as a fraction of the healthy storms' median wall time (default 0.3)")
    parser.add_argument("--selector", choices=["ordinal", "random", "rendezvous_hash"], default="ordinal",
                        help="the mxref readers' selector; reader i is given --selector-seed i (its ordinal) "
                             "(default ordinal)")
    parser.add_argument("--mode", choices=["central", "p2p"], default="central",
                        help="the mxref sources' mode (default central); the ModelExpress storms read P2P sources")
    parser.add_argument("--list-interval", type=float, default=0.01, metavar="SECONDS",
                        help="pause between the bench's ListSources calls during a storm (default 0.01)")
    parser.add_argument("--mx-python", default=None, metavar="PATH",
                        help="the modelexpress subject's python: also storms of ModelExpress client readers")
    parser.add_argument("--mx-readers", type=readers, nargs="+", default=[1, 4, 8],
                        help="the cells' R that get a ModelExpress row (default 1 4 8)")
    parser.add_argument("--mx-rounds", type=config.whole_number_arg("rounds", 1, 99), default=3)
    parser.add_argument("--transport", default="ucx-tcp", choices=sorted(config.TRANSPORT_PROFILES))
    parser.add_argument("--baseline", type=Path, default=None, metavar="PATH",
                        help="another checkout of mxref: also a pool of its readers (PYTHONPATH=PATH), stormed in "
                             "the same interleaved rounds; a 'baseline' row and mxref / baseline per round")
    parser.add_argument("--baseline-sources", action="store_true",
                        help="with --baseline: the baseline arm is PATH's sources (of another model name) read by "
                             "this tree's readers, not PATH's readers of this tree's sources")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON record here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv, StormFlags)
    if not 0 < args.freeze_at < 1:
        parser.error(f"--freeze-at {args.freeze_at}: must be strictly between 0 and 1")
    if args.baseline and not (args.baseline / "mxref" / "__main__.py").is_file():
        parser.error(f"--baseline {args.baseline}: no mxref/__main__.py there")
    if args.baseline_sources and not args.baseline:
        parser.error("--baseline-sources needs --baseline PATH")
    if args.mx_python and not Path(args.mx_python).is_file():
        parser.error(f"--mx-python {args.mx_python}: no such file")
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <pid>: where a long run waits
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops the children as a Ctrl-C does
    config.apply_transport_profile(args.transport)  # children inherit it
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mxref-bench-storm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    cells = run(args, workdir)
    record = {"bench_storm": {"mib": args.mib, "bytes": cells[0]["bytes"] if cells else 0, "mode": args.mode,
                              "selector": args.selector, "argv": sys.argv[1:] if argv is None else argv,
                              "transport": args.transport, "cpus": os.cpu_count(),
                              "load_avg_1m": round(os.getloadavg()[0], 2),
                              "seconds": round(time.monotonic() - started, 1), "cells": cells}}
    print("storm table (all cells):")
    print("\n".join(table(cells)))
    print(json.dumps(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    print(f"logs and events in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
