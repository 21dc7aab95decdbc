"""Node-local results: the dispatcher takes a lane's folder back from its node through SLURM.

Where the nodes do not see the dispatcher's folders (``--node-local DIR``), each task writes its
lane's folder on its node (``harness.hosts.slurm_task``). ``Gatherer`` is the dispatcher's side, one
per running task: a thread runs ``srun --overlap --jobid J -w NODE -N1 -n1 --quiet python -m
harness.hosts.slurm_task --gather FOLDER WAIT`` (a step in the task's own allocation, beside its
batch step), reads the tar stream srun carries back into the lane's folder here (every member
checked: nothing outside the folder, no link, no device: ``tarfile``'s ``data`` filter), then runs a
second step (``--taken``) so the task may remove its copy and end, and records what it took (bytes, seconds) or why it could
not. Every wait is bounded: the step waits for the run at most ``wait`` seconds, and the dispatcher
for the step ``JOIN_S`` after the task ended.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.hosts import slurm

__all__ = ["Counted", "Gatherer"]

JOIN_S = 60.0


class Counted:
    """A stream that counts what is read through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return data


@dataclass
class Gatherer:
    job: str
    node: str
    remote: str  # the folder on the node ({node}: its name)
    target: Path  # where it goes here
    conf: Path
    wait: float  # how long the step waits for the run to end
    error: str | None = None
    size: int = 0  # bytes taken
    seconds: float | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        srun = shutil.which("srun")
        if srun is None:
            self.error = "no `srun` here to gather node-local results with"
            return
        self._proc = subprocess.Popen(self._step(srun, "--gather", self.remote, f"{self.wait:g}"),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env={**os.environ, "SLURM_CONF": str(self.conf)}, cwd=os.getcwd())
        self._thread = threading.Thread(target=self._take, name=f"gather-{self.job}", daemon=True)
        self._thread.start()

    def _step(self, srun: str, *args: str) -> list[str]:
        return [srun, "--overlap", f"--jobid={slurm.valid_job_id(self.job)}", f"--nodelist={slurm.valid_node(self.node)}",
                "-N1", "-n1", "--quiet", "--input=none", "--job-name=mxchaos-gather", sys.executable, "-m",
                "harness.hosts.slurm_task", *args]

    def _mark_taken(self) -> None:
        """The second step: the task may remove its copy and end."""
        srun = shutil.which("srun") or "srun"
        try:
            done = subprocess.run(self._step(srun, "--taken", self.remote), capture_output=True, text=True,
                                  timeout=JOIN_S, check=False, env={**os.environ, "SLURM_CONF": str(self.conf)},
                                  stdin=subprocess.DEVNULL, cwd=os.getcwd())
        except subprocess.TimeoutExpired:
            self.error = f"srun --overlap ... --taken did not return within {JOIN_S:g}s"
            return
        if done.returncode != 0:
            self.error = f"srun --overlap ... --taken exited {done.returncode}: {done.stderr.strip()[-300:]}"

    def _take(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        started = None
        counted = Counted(proc.stdout)
        try:
            self.target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=counted, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    if started is None:
                        started = time.monotonic()
                    tar.extract(member, self.target, filter="data")
        except (OSError, tarfile.TarError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        self.size = counted.count
        try:
            rc = proc.wait(timeout=JOIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        err = proc.stderr.read().decode(errors="replace").strip()[-400:] if proc.stderr else ""
        if rc != 0 and self.error is None:
            self.error = f"srun --overlap ... --gather exited {rc}: {err or '(nothing said)'}"
        if self.error is None:
            self._mark_taken()
        if self.error is None and started is not None:
            self.seconds = time.monotonic() - started

    def join(self, timeout: float = JOIN_S) -> None:
        """Wait (bounded) for the step; one still running then is killed and said to be."""
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive() and self._proc is not None:
            self._proc.kill()
            self._thread.join(10.0)
            self.error = self.error or f"the gathering step did not end within {timeout:g}s"

    def describe(self) -> dict[str, object]:
        return {"node": self.node, "job": self.job, "from": self.remote, "bytes": self.size,
                "seconds": None if self.seconds is None else round(self.seconds, 3), "error": self.error}
