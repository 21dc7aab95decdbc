"""One soak: start the fleet, load round after round, sample every process between rounds,
write the record as it goes and the summary and page at the end (and every ``WRITE_EVERY_S``).

A round is ``sample_every`` loads shared out over the readers, each reader loading its share one
after another while the others do theirs (a thread per reader); the sample is taken after the
round, when no load is in flight, so a count does not catch a load half way. The soak stops at
``transfers`` (counted over every segment of a resumed soak), after ``seconds`` (this invocation's),
on ``stop`` (SIGINT / SIGTERM), at the first growth with ``stop_on_growth``, or when a process
dies or a load does not answer (``error``). The fleet is stopped in every case.

A soak is a run as ``mxchaos cleanup`` sees one: it gets a run id (``soak-<time>-<hex>``, in
``soak.json``), writes its ledger entry (the soak's pid and start time, its ``--out`` folder) before
the first process starts, and every process joins the run's scope (``harness.soak.fleet``). At the
end, whatever of the scope is left is killed and the scope and entry are removed; a soak that is
SIGKILLed leaves them, and ``mxchaos cleanup`` kills its processes and writes ``CRASHED`` into its folder.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.machine import ledger, procscan, runscope, statedir
from harness.soak.fleet import Fleet, FleetError, FleetSpec, MxProcess
from harness.soak.page import render_page
from harness.soak.probe import ProcessGone, audit_sample, proc_sample
from harness.soak.record import Record, Sample, read_samples
from harness.soak.slope import LIMITS, judge
from harness.soak.verdict import growth_text, series_of, summarize

__all__ = ["SoakOptions", "run_soak", "write_outputs"]

WRITE_EVERY_S = 30.0
STOP_SCOPE_S = 5.0
SUMMARY, PAGE, CONFIG = "soak-result.json", "soak.html", "soak.json"


@dataclass(frozen=True)
class SoakOptions:
    out: Path
    transfers: int | None = None
    seconds: float | None = None
    spec: FleetSpec = field(default_factory=FleetSpec)
    sample_every: int = 20
    warmup: int = 200
    stop_on_growth: bool = False
    resume: bool = False


def write_outputs(out: Path, warmup: int, error: str | None = None) -> dict[str, Any]:
    """``soak-result.json`` and ``soak.html`` from the record as it stands; the summary."""
    samples = read_samples(out)
    summary = summarize(samples, warmup, error=error)
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    (out / PAGE).write_text(render_page(summary, samples, f"mxchaos soak: {out.name}"))
    return summary


def _sample(proc: MxProcess) -> tuple[dict[str, float], dict[str, float]]:
    values = proc_sample(proc.pid)
    made: dict[str, float] = {}
    if proc.role in ("reader", "source") and proc.metrics_url:
        try:
            opened, made = audit_sample(proc.metrics_url)
        except (OSError, ValueError) as exc:
            raise FleetError(f"{proc.name}: its /metrics did not answer ({type(exc).__name__}: {exc})") from exc
        values.update(opened)
    return values, made


class _Soak:
    def __init__(self, options: SoakOptions, say: Callable[[str], None], stop: threading.Event) -> None:
        self.o = options
        self.say = say
        self.stop = stop
        self.record = Record(options.out, options.resume)
        self.run_id = ledger.new_run_id("soak")
        self.fleet = Fleet(options.spec, options.out / f"processes-{self.record.segment}", self.run_id)
        self.transfers = self.record.start_transfers
        self.failed = self.record.start_failed
        self.started = time.monotonic()
        self.samples: list[Sample] = list(self.record.previous)
        self.growing: set[tuple[str, str]] = set()

    def elapsed(self) -> float:
        return self.record.start_elapsed + time.monotonic() - self.started

    def sample(self) -> None:
        for proc in self.fleet.processes:
            if proc.popen.poll() is not None:
                raise FleetError(f"{proc.name} exited ({proc.popen.returncode}); see {proc.log_path}")
            try:
                values, made = _sample(proc)
            except ProcessGone as exc:
                raise FleetError(f"{proc.name}: {exc}; see {proc.log_path}") from exc
            doc = {"segment": self.record.segment, "transfers": self.transfers, "failed": self.failed,
                   "elapsed_s": round(self.elapsed(), 3), "t": round(time.time(), 3), "process": proc.name,
                   "role": proc.role, "pid": proc.pid, "loads": proc.loads, "values": values, "made": made}
            self.record.write(doc)
            self.samples.append(Sample.from_json(doc))

    def round(self, loads: int) -> None:
        readers = self.fleet.readers
        shares = [loads // len(readers) + (1 if i < loads % len(readers) else 0) for i in range(len(readers))]

        def run(reader: MxProcess, n: int) -> None:
            for _ in range(n):
                if self.stop.is_set():
                    return
                result = reader.load()
                if not (result.get("ok") and result.get("path") == "rdma"):
                    self.say(f"soak: {reader.name}: a load failed: {result.get('error')}")

        before = sum(r.loads + r.failed for r in readers)
        with ThreadPoolExecutor(len(readers), thread_name_prefix="soak-load") as pool:
            futures = [pool.submit(run, r, n) for r, n in zip(readers, shares) if n]
            for f in futures:
                f.result()
        self.transfers += sum(r.loads + r.failed for r in readers) - before
        self.failed = self.record.start_failed + sum(r.failed for r in readers)

    def new_growths(self) -> list[str]:
        found = []
        for process, resources in series_of(self.samples).items():
            for resource, points in resources.items():
                if (process, resource) in self.growing:
                    continue
                verdict, slope = judge(points, resource, self.o.warmup)
                if verdict == "grows" and slope is not None:
                    self.growing.add((process, resource))
                    found.append(growth_text({"process": process, "resource": resource, "slope": slope.as_dict(),
                                              "limit_per_1000": LIMITS.get(resource, 1.0), "detected_at": self.transfers}))
        return found

    def done(self) -> bool:
        if self.stop.is_set():
            return True
        if self.o.transfers is not None and self.transfers >= self.o.transfers:
            return True
        return self.o.seconds is not None and time.monotonic() - self.started >= self.o.seconds

    def run(self) -> str | None:
        """The soak's loop; the error that ended it, or None."""
        o = self.o
        (o.out / CONFIG).write_text(json.dumps({"spec": asdict(o.spec), "sample_every": o.sample_every,
                                                "warmup": o.warmup, "segment": self.record.segment,
                                                "run_id": self.run_id}) + "\n")
        last_write = time.monotonic()
        me = os.getpid()
        ledger.write_entry(self.run_id, {"run_id": self.run_id, "kind": "soak", "harness_pid": me,
                                         "harness_start": procscan.proc_start_time(me), "run_dir": str(o.out),
                                         "run_dir_id": statedir.dir_identity(o.out)})
        try:
            self.fleet.start()
            self.say(f"soak: {len(self.fleet.processes)} processes up in {self.fleet.workdir}; "
                     f"segment {self.record.segment} from {self.transfers} transfers")
            self.sample()
            while not self.done():
                left = o.transfers - self.transfers if o.transfers is not None else o.sample_every
                self.round(min(o.sample_every, left))
                self.sample()
                for line in self.new_growths():
                    self.say(f"soak: {line}")
                if self.growing and o.stop_on_growth:
                    break
                if time.monotonic() - last_write >= WRITE_EVERY_S:
                    write_outputs(o.out, o.warmup)
                    last_write = time.monotonic()
                    self.say(f"soak: {self.transfers} transfers, {self.transfers / max(self.elapsed(), 1e-9):.1f}/s")
            return None
        except FleetError as exc:
            return str(exc)
        finally:
            codes = self.fleet.stop()
            self.record.close()
            alive = runscope.kill(self.run_id, wait=STOP_SCOPE_S)  # what a process of the fleet forked and left
            runscope.remove(self.run_id)
            if not alive:
                ledger.remove_entry(self.run_id)  # else `mxchaos cleanup` still finds the run
            self.say(f"soak: processes stopped: {codes}" + (f"; still alive: {alive}" if alive else ""))


def run_soak(options: SoakOptions, say: Callable[[str], None] = print,
             stop: threading.Event | None = None) -> dict[str, Any]:
    """Run one soak (see the module); its summary (also in ``soak-result.json``, the page in ``soak.html``)."""
    soak = _Soak(options, say, stop or threading.Event())
    error = soak.run()
    summary = write_outputs(options.out, options.warmup, error)
    return summary
