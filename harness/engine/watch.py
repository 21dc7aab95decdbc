"""Watching a run: the monitor, the scraper, the watchdog and stack dumps.

Three daemon threads, started after setup and stopped in teardown:

- the **monitor** drains an events file as soon as it grows (inotify on the folders of the
  events files this machine holds, so an ``await`` and the fault after it see an event within
  a millisecond or so, not up to a poll period late) and, every 50 ms, polls the whole process
  table (every events file, exits recorded) and notices a dead toxiproxy server. Without
  inotify (``wake = "poll"``, or it cannot be had) it only polls;
- the **scraper** scrapes every live process's ``/metrics`` each ``scrape.interval``,
  concurrently, so one frozen process does not delay the others;
- the **watchdog** declares HANG when the run passes ``budgets.run`` or nothing progresses for
  ``budgets.progress``: it dumps stacks and aborts the run's waits.

``Stacks`` writes py-spy dumps of the run's live processes and the harness's own threads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import inotify_simple

from harness.engine.processes import ProcessTable, ProcState
from harness.engine.proxies import RunProxies
from harness.engine.waits import RunClock
from harness.record.timeline import Entry, Timeline
from harness.scenario import Budgets, ScrapeSpec
from harness.scrape import scrape

__all__ = ["MONITOR_PERIOD", "EventsWatch", "Scraper", "Stacks", "Watchers"]

MONITOR_PERIOD = 0.05
STOP_CHECK = 0.05  # the monitor notices ``stop`` within this, whatever MONITOR_PERIOD is
WAKE_MODES = ("inotify", "poll")


class EventsWatch:
    """Which events files grew: inotify on each of them (``MODIFY``), and on their folders
    (``CREATE``) to watch a file as soon as its process creates it. Other files there (the
    processes' logs) never wake it."""

    def __init__(self, files: dict[Path, str]) -> None:
        self._files = dict(files)
        self._by_name = {path.name: path for path in files}  # in its folder -> the file
        self._by_wd: dict[int, str] = {}  # a file's watch -> its process
        self._inotify = inotify_simple.INotify()
        try:
            for folder in {path.parent for path in files}:
                folder.mkdir(parents=True, exist_ok=True)
                self._inotify.add_watch(folder, inotify_simple.flags.CREATE)
            for path in files:  # after the folders: a file created in between is seen either way
                if path.exists():
                    self._watch(path)
        except BaseException:
            self._inotify.close()
            raise

    def _watch(self, path: Path) -> None:
        wd = self._inotify.add_watch(path, inotify_simple.flags.MODIFY)
        self._by_wd[int(wd)] = self._files[path]

    def wait(self, timeout: float) -> set[str]:
        """The processes whose events file grew (or appeared), waiting at most ``timeout``
        seconds for one."""
        grown: set[str] = set()
        for event in self._inotify.read(timeout=max(0, math.ceil(timeout * 1000))):  # never a busy 0 ms wait
            if event.name:  # in a watched folder: a file was created
                path = self._by_name.get(event.name)
                if path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        self._watch(path)
                    grown.add(self._files[path])
            elif event.wd in self._by_wd:
                grown.add(self._by_wd[event.wd])
        return grown

    def close(self) -> None:
        self._inotify.close()


class Stacks:
    """py-spy dumps of the run's live processes plus the harness's threads, into ``stacks/``."""

    def __init__(self, run_dir: Path, table: ProcessTable) -> None:
        self.run_dir = run_dir
        self.table = table
        self.written: dict[str, str] = {}  # what -> path relative to the run folder

    def dump(self, tag: str) -> dict[str, str]:
        folder = self.run_dir / "stacks"
        folder.mkdir(exist_ok=True)
        written: dict[str, str] = {}
        harness_file = folder / f"{tag}-harness.txt"
        harness_file.write_text(_thread_stacks())
        written["harness"] = str(harness_file.relative_to(self.run_dir))
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        live = [(st.name, st.pid, st.host) for st in self.table.live() if st.pid]
        for name, pid, host in live:
            out = folder / f"{tag}-{name}.txt"
            if os.path.exists(pyspy):
                result = host.exec([pyspy, "dump", "--pid", str(pid), "--nonblocking"], env=dict(os.environ), cwd=self.run_dir, timeout=15)
                text = result.stdout + (f"\n[py-spy rc={result.rc}]\n{result.stderr}" if result.rc else "")
            else:
                text = "py-spy is not installed; no stack for this process\n"
            out.write_text(f"# {name} pid {pid}\n{text}")
            written[name] = str(out.relative_to(self.run_dir))
        self.written.update(written)
        return written


class Scraper:
    """Real HTTP scrapes of every live process's ``/metrics`` into the timeline."""

    def __init__(self, spec: ScrapeSpec, table: ProcessTable, timeline: Timeline) -> None:
        self.spec = spec
        self.table = table
        self.timeline = timeline
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="mxchaos-scrape")
        self.closing = False  # teardown began: only its final (waited) scrape runs now

    def scrape_all(self, *, wait: bool) -> None:
        """Scrape every live process concurrently (one scrape per process at a time); ``wait``:
        until they answer or time out. After the final scrape, only ``wait`` scrapes run."""
        if self.closing and not wait:
            return  # teardown took its final scrape; the processes are going away now
        targets = [(st, st.ports.get("metrics")) for st in self.table.live()]
        futures = []
        for st, port in targets:
            if not port:
                continue
            with self._busy_lock:
                if st.name in self._busy:
                    continue
                self._busy.add(st.name)
            futures.append(self._pool.submit(self._tracked, st, port))
        if wait and futures:
            concurrent.futures.wait(futures, timeout=self.spec.timeout + 1.0)

    def _tracked(self, st: ProcState, port: int) -> None:
        try:
            self.scrape_one(st, port)
        finally:
            with self._busy_lock:
                self._busy.discard(st.name)

    def scrape_one(self, st: ProcState, port: int) -> Entry:
        url = f"http://{st.host.address}:{port}/metrics"
        started = time.monotonic()
        try:
            samples = scrape(url, self.spec.timeout)
            value: dict[str, Any] = {"ok": True, "port": port, "samples": samples}
        except (OSError, ValueError) as exc:
            value = {"ok": False, "port": port, "error": f"{type(exc).__name__}: {exc}"}
        value["seconds"] = round(time.monotonic() - started, 4)
        return self.timeline.append("info", st.name, "scrape", value)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class Watchers:
    """The monitor, scraper and watchdog threads of one run."""

    def __init__(
        self,
        *,
        timeline: Timeline,
        clock: RunClock,
        table: ProcessTable,
        proxies: RunProxies,
        scraper: Scraper,
        budgets: Budgets,
        on_hang: Callable[[str], None],
    ) -> None:
        self.timeline = timeline
        self.clock = clock
        self.table = table
        self.proxies = proxies
        self.scraper = scraper
        self.budgets = budgets
        self.on_hang = on_hang
        self.wake = "inotify"  # or "poll" (tests/bench/event_latency.py compares them)
        self.monitor_cpu = 0.0  # CPU seconds the monitor thread used so far
        self.monitor_wakes = 0  # how often it woke (a poll, or events files that grew)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        for target, name in ((self._monitor, "monitor"), (self._scrape_loop, "scraper"), (self._watchdog, "watchdog")):
            thread = threading.Thread(target=target, name=f"mxchaos-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def poll(self) -> None:
        """One monitor pass (also called once more after the threads stopped)."""
        self.table.poll()
        with contextlib.suppress(Exception):
            self.proxies.check_exit()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.scraper.close()

    def _monitor(self) -> None:
        started = time.thread_time()
        watch = self._events_watch()
        try:
            next_poll = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_poll:
                    self.poll()
                    next_poll = now + MONITOR_PERIOD
                self.monitor_wakes += 1
                self.monitor_cpu = time.thread_time() - started
                if watch is None:
                    self._stop.wait(max(0.0, next_poll - time.monotonic()))
                    continue
                grown = watch.wait(min(next_poll - time.monotonic(), STOP_CHECK))
                if grown:
                    self.table.drain(grown)
            self.poll()
        finally:
            if watch is not None:
                watch.close()
            self.monitor_cpu = time.thread_time() - started

    def _events_watch(self) -> EventsWatch | None:
        """inotify on the run's local events files, unless ``wake`` is ``poll`` or inotify
        cannot be had here (then the monitor only polls; recorded)."""
        if self.wake not in WAKE_MODES:
            raise ValueError(f"wake is one of {', '.join(WAKE_MODES)}, not {self.wake!r}")
        files = self.table.local_events_files()
        if self.wake == "poll" or not files:
            return None
        try:
            return EventsWatch(files)
        except OSError as exc:
            self.timeline.append("info", "harness", "monitor_polls", {"error": f"{type(exc).__name__}: {exc}"})
            return None

    def _scrape_loop(self) -> None:
        if not self.scraper.spec.enabled:
            return
        while not self._stop.wait(self.scraper.spec.interval):
            self.scraper.scrape_all(wait=False)

    def _watchdog(self) -> None:
        budgets = self.budgets
        while not self._stop.wait(0.2):
            now = time.monotonic()
            idle_since = max(self.timeline.last_progress, self.clock.quiet_until)
            if now > self.clock.deadline:
                self.on_hang(f"the run exceeded its budget (budgets.run {budgets.run:g}s)")
                return
            if now - idle_since > budgets.progress:
                self.on_hang(f"no progress for {budgets.progress:g}s (budgets.progress)")
                return


def _thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"Thread {names.get(ident, '?')} ({ident}):\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)
