"""Groups of runs as one SLURM job array: submit, watch, cancel, and the record cleanup reads.

A *group* is one ``mxchaos run`` (its argv, its environment, the folder it writes). ``submit``
writes the groups into a manifest (``<spool>/groups.json``; task i runs group i through
``python -m harness.hosts.slurm_task``, so the array's command line carries no scenario text) and
queues them as ONE ``sbatch --array`` job, every task ``--exclusive`` (a node of its own: an
``alone`` scenario's rule, and a lane's neighbour is never another lane) and ``--no-requeue``
(SLURM does not run a task again by itself: a task that SLURM ended is the dispatcher's to
resubmit, once). Before ``sbatch`` is called the dispatch is recorded in the harness's state dir
(``slurm/<token>.json``: job name, controller configuration, dispatcher pid and start time; the
job ids are added as they are known), so ``mxchaos cleanup`` finds the jobs of a dispatcher that
died (``sweep_dead``) and cancels them by name.

``poll`` reads every task of the array in one bounded ``scontrol -o show job <array>`` (it gives
the exit code, the node and the reason, and each started task's own job id; ``squeue`` gives no
exit code; an ended task's end is then read from accounting, ``harness.hosts.slurm_acct``), and
``state_of`` turns SLURM's state into the dispatcher's:

- ``COMPLETED`` / ``FAILED``: DONE with the task's exit code (the group's ``mxchaos run``; its
  folder says the rest, and is judged again by the dispatcher);
- ``TIMEOUT``, ``NODE_FAIL``, ``PREEMPTED``, ``BOOT_FAIL``, ``OUT_OF_MEMORY``, ``DEADLINE``,
  ``REVOKED`` and ``CANCELLED`` that we did not ask for: INFRA (not the tests' doing);
- ``PENDING`` and the like: waiting; ``RUNNING``, ``COMPLETING``...: running.

``cancel`` is ``scancel --name <job name>`` (every task of every submission of the dispatch),
then a bounded wait until none is pending or running. What SLURM returns is input from
elsewhere: job ids and node names are checked (``harness.hosts.slurm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.hosts import slurm
from harness.hosts.slurm_leftover import sweep_node_local
from harness.machine import procscan, statedir

__all__ = ["DONE", "INFRA", "INFRA_STATES", "PENDING", "RUNNING", "Dispatch", "Group", "TaskState", "cancel_name",
           "parse_tasks", "partition_nodes", "records", "state_of", "sweep_dead"]

PENDING, RUNNING, DONE, INFRA = "PENDING", "RUNNING", "DONE", "INFRA"
INFRA_STATES = frozenset({"TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE", "REVOKED",
                          "CANCELLED"})
DONE_STATES = frozenset({"COMPLETED", "FAILED"})
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"})
CMD_TIMEOUT_S = 20.0
RECORDS = "slurm"  # the state dir's folder of dispatch records
_NAME_RE = re.compile(r"^mxchaos-[A-Za-z0-9_.-]{1,80}$")
_NODELIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.,\[\]-]{0,1000}$")
_TASKS_RE = re.compile(r"^(\d{1,7})(?:-(\d{1,7}))?(?::\d+)?$")


@dataclass(frozen=True)
class Group:
    """One ``mxchaos run`` of a dispatch: ``name`` (``lane-1``, ``alone-<scenario>``), its argv
    and environment, and the folder it writes (which the dispatcher must see)."""

    name: str
    argv: tuple[str, ...]
    folder: Path
    env: Mapping[str, str] = field(default_factory=dict)
    remote: str | None = None  # node-local results: the folder the task writes on its node ({node}: its name)


@dataclass(frozen=True)
class TaskState:
    """One array task as the dispatcher sees it."""

    index: int
    job: str  # the task's own job id (``scontrol``'s JobId), or ``<array>_<i>`` while pending
    state: str  # PENDING | RUNNING | DONE | INFRA
    slurm_state: str
    node: str
    rc: int | None = None
    reason: str = ""
    nodelist: str = ""  # all its nodes, as SLURM writes them (h[1-2]); checked as a node list

    def describe(self) -> str:
        return f"SLURM job {self.job} (task {self.index}) on node {self.node or '(none)'} ended {self.slurm_state}" + (
            f" ({self.reason})" if self.reason and self.reason != "None" else "")


def state_of(slurm_state: str, *, cancelled_by_us: bool) -> str:
    """SLURM's job state -> PENDING / RUNNING / DONE / INFRA (module docstring)."""
    word = slurm_state.split()[0].rstrip("+") if slurm_state.strip() else "UNKNOWN"
    if word in DONE_STATES:
        return DONE
    if word == "CANCELLED" and cancelled_by_us:
        return DONE
    if word in INFRA_STATES:
        return INFRA
    if word in WAITING_STATES:
        return PENDING
    return RUNNING


def _task_indices(text: str) -> list[int]:
    """``ArrayTaskId`` of a record: ``3``, or for the pending rest ``0-2,5`` (``%N`` limits dropped)."""
    out: list[int] = []
    for part in text.split("%")[0].split(","):
        match = _TASKS_RE.match(part.strip())
        if match is None:
            continue
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        out += range(low, min(high, low + 10000) + 1)
    return out


def parse_tasks(text: str, *, cancelled_by_us: bool = False) -> dict[int, TaskState]:
    """``scontrol -o show job <array>``'s lines -> task index -> its state."""
    out: dict[int, TaskState] = {}
    for line in text.splitlines():
        record = slurm.parse_record(line)
        if not record or "ArrayTaskId" not in record:
            continue
        raw = record.get("JobState", "UNKNOWN")
        node = record.get("BatchHost") or record.get("NodeList") or ""
        node = "" if node in ("(null)", "None") else node
        try:
            node = slurm.valid_node(node) if node else ""
        except slurm.SlurmError:
            node = ""  # not a host name: never on a command line (--exclude) nor in a verdict
        code = re.match(r"^(\d+):(\d+)$", record.get("ExitCode", ""))
        rc = int(code.group(1)) if code else None
        for index in _task_indices(record["ArrayTaskId"]):
            job = record.get("JobId", "") if "-" not in record["ArrayTaskId"] and "," not in record["ArrayTaskId"] else (
                f"{record.get('ArrayJobId', '')}_{index}")
            nodelist = record.get("NodeList", "")
            nodelist = nodelist if _NODELIST_RE.match(nodelist) and nodelist != "(null)" else ""
            out[index] = TaskState(index, job, state_of(raw, cancelled_by_us=cancelled_by_us), raw, node, rc,
                                   record.get("Reason", ""), nodelist)
    return out


def _client(tool: str) -> str:
    exe = shutil.which(tool)
    if exe is None:
        raise slurm.SlurmUnavailable(f"SLURM: no `{tool}` here (install the slurm-client package)")
    return exe


def _call(argv: Sequence[str], conf: Path, timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([_client(argv[0]), *argv[1:]], capture_output=True, text=True, errors="replace",
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                              env={**os.environ, "SLURM_CONF": str(conf)})
    except subprocess.TimeoutExpired:
        raise slurm.SlurmUnavailable(f"SLURM: `{' '.join(argv)}` did not return within {timeout:g}s "
                                     f"(controller {slurm.controller(conf)})") from None


def _records_dir(create: bool = True) -> Path | None:
    return statedir.subdir(RECORDS, create=create)


def _write_record(token: str, record: Mapping[str, Any]) -> None:
    folder = _records_dir()
    assert folder is not None
    statedir.replace(folder / f"{token}.json", json.dumps(dict(record)).encode())


def _remove_record(token: str) -> None:
    with contextlib.suppress(OSError, statedir.StateDirError):
        folder = _records_dir(create=False)
        if folder is not None:
            (folder / f"{token}.json").unlink()


def records() -> dict[str, dict[str, Any]]:
    """Every dispatch recorded in the state dir: token -> its record (unreadable ones skipped)."""
    folder = _records_dir(create=False)
    out: dict[str, dict[str, Any]] = {}
    if folder is None or not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(statedir.read_owned(path))
        except (OSError, ValueError, statedir.StateDirError):
            continue
        if isinstance(record, dict) and _NAME_RE.match(str(record.get("name", ""))):
            out[path.stem] = record
    return out


def cancel_name(name: str, conf: Path, *, wait: float = 30.0) -> list[str]:
    """``scancel --name NAME``, then wait (bounded) until none of its tasks is pending or running;
    the tasks still pending or running at the end (empty: all gone)."""
    if not _NAME_RE.match(name):
        raise slurm.SlurmError(f"SLURM: {name!r} is not a job name of this harness")
    _call(["scancel", "--name", name], conf)
    deadline = time.monotonic() + wait
    left: list[str] = []
    while True:
        done = _call(["squeue", "-h", "-n", name, "-t", "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED",
                      "-o", "%i"], conf)
        left = done.stdout.split() if done.returncode == 0 else ["(squeue failed)"]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


def partition_nodes(conf: Path, partition: str | None) -> int:
    """How many nodes the partition (default: SLURM's default one) has: ``sinfo -h -o %D``."""
    argv = ["sinfo", "-h", "-o", "%D"] + ([f"--partition={partition}"] if partition else [])
    done = _call(argv, conf)
    return sum(int(w) for w in done.stdout.split() if w.isdigit()) if done.returncode == 0 else 1


class Dispatch:
    """One dispatch: its groups, its spool (the manifest, each task's output) and its submissions."""

    def __init__(self, groups: Sequence[Group], spool: Path, conf: Path, *, partition: str | None = None,
                 time_limit: str | None = None, label: str = "run", nodes: int = 1, embed: bool = False,
                 local: str | None = None) -> None:
        self.groups = list(groups)
        self.embed = embed  # the nodes do not see the spool: the manifest goes in the batch script, output nowhere
        self.nodes = nodes  # sbatch --nodes of every task
        self.local = local  # node-local results: the dispatch's root on each node ({node}: its name)
        self.local_nodes: set[str] = set()  # the nodes its tasks ran on (what cleanup sweeps if we die)
        self.spool = spool
        self.conf = conf
        self.partition = partition
        self.time_limit = time_limit
        self.token = secrets.token_hex(4)
        self.name = f"mxchaos-{re.sub(r'[^A-Za-z0-9_.-]', '-', label)[:40]}-{self.token}"
        self.arrays: list[str] = []  # array job ids, one per submission
        self.cancelled = False
        self.submitted_at: dict[int, float] = {}  # task index -> when its latest submission was queued (monotonic)
        self.array_of: dict[int, str] = {}  # task index -> the array of its latest submission
        self.submitted_wall: dict[int, float] = {}  # the same, wall clock (a task's task.json says when it started)

    def _record(self) -> None:
        me = os.getpid()
        _write_record(self.token, {"name": self.name, "conf": str(self.conf), "arrays": self.arrays,
                                   "spool": str(self.spool), "pid": me, "start": procscan.proc_start_time(me),
                                   **({"local": self.local, "local_nodes": sorted(self.local_nodes)} if self.local else {})})

    def manifest(self) -> Path:
        path = self.spool / "groups.json"
        statedir.replace(path, self._manifest_text().encode(), 0o644)  # a task starting now reads it whole
        return path

    def _manifest_text(self) -> str:
        return json.dumps([{"name": g.name, "argv": list(g.argv), "folder": g.remote or str(g.folder),
                            "local": g.remote is not None, "env": dict(g.env), "cwd": os.getcwd()}
                           for g in self.groups], indent=1)

    def _script(self, manifest: Path) -> str:
        """The array's batch script: the task reading the manifest's file, or (``embed``) the
        manifest itself, a here-document in the script SLURM carries to the node."""
        if not self.embed:
            return f"exec {sys.executable} -m harness.hosts.slurm_task {manifest}"
        text = self._manifest_text()
        assert "\nMXCHAOS_MANIFEST\n" not in f"\n{text}\n"  # JSON never has the terminator as a line
        return f"exec {sys.executable} -m harness.hosts.slurm_task - <<'MXCHAOS_MANIFEST'\n{text}\nMXCHAOS_MANIFEST"

    def submit(self, indices: Sequence[int], exclude: Sequence[str] = ()) -> str:
        """Queue ``indices`` of the groups as one array (recorded first); its array job id."""
        self.spool.mkdir(parents=True, exist_ok=True)
        manifest = self.manifest()
        self._record()
        argv = ["sbatch", "--parsable", "--no-requeue", "--exclusive", f"--job-name={self.name}",
                f"--array={','.join(str(i) for i in indices)}",
                f"--output={'/dev/null' if self.embed else f'{self.spool}/%A_%a.out'}",
                f"--chdir={os.getcwd()}", f"--nodes={self.nodes}", "--ntasks-per-node=1"]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.time_limit:
            argv.append(f"--time={self.time_limit}")
        if exclude:
            argv.append(f"--exclude={','.join(slurm.valid_node(n) for n in exclude)}")
        argv.append(f"--wrap={self._script(manifest)}")
        queued, wall = time.monotonic(), time.time()
        done = _call(argv, self.conf)
        array = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not array.isdigit():
            # sbatch may fail yet queue the job: cancel whatever carries our name before saying so
            cancel_name(self.name, self.conf, wait=5.0)
            raise slurm.SlurmError(f"SLURM: sbatch of {len(indices)} task(s) failed (rc {done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip()[:400]}")
        self.arrays.append(slurm.valid_job_id(array))
        self._record()
        for i in indices:
            self.submitted_at[i], self.submitted_wall[i] = queued, wall
            self.array_of[i] = array
        return array

    def cancel_task(self, job: str) -> None:
        """``scancel`` one task (it stayed pending or running past the dispatcher's bound)."""
        _call(["scancel", slurm.valid_job_id(job)], self.conf)

    def poll(self) -> dict[int, TaskState]:
        """Every task's state in the array of its latest submission (an earlier attempt's end is
        never read again)."""
        out: dict[int, TaskState] = {}
        for array in sorted(set(self.array_of.values()), key=self.arrays.index):
            done = _call(["scontrol", "-o", "show", "job", array], self.conf)
            if done.returncode != 0:
                slurm.ping(self.conf)  # names the controller when that is what failed
                continue
            tasks = parse_tasks(done.stdout, cancelled_by_us=self.cancelled)
            out.update({i: t for i, t in tasks.items() if self.array_of.get(i) == array})
        seen = {t.node for t in out.values() if t.node}
        if self.local and not seen <= self.local_nodes:  # recorded before the lane writes there
            self.local_nodes |= seen
            self._record()
        return out

    def cancel(self, wait: float = 30.0) -> list[str]:
        self.cancelled = True
        return cancel_name(self.name, self.conf, wait=wait)

    def forget(self) -> None:
        """Drop the record (every task has ended)."""
        _remove_record(self.token)


def _array_nodes(record: Mapping[str, Any], conf: Path) -> set[str]:
    """The nodes the tasks of a record's arrays run or ran on, as far as ``scontrol`` still lists them."""
    nodes: set[str] = set()
    for array in record.get("arrays") or []:
        try:
            done = _call(["scontrol", "-o", "show", "job", slurm.valid_job_id(str(array))], conf)
        except slurm.SlurmError:
            continue
        if done.returncode == 0:
            nodes |= {t.node for t in parse_tasks(done.stdout).values() if t.node}
    return nodes


def sweep_dead(*, dry_run: bool = False, wait: float = 30.0) -> list[str]:
    """Cancel the jobs of every recorded dispatch whose dispatcher is gone (``mxchaos cleanup``);
    what was cancelled (or, ``dry_run``, would be)."""
    said: list[str] = []
    for token, record in records().items():
        pid, start = record.get("pid"), record.get("start")
        if procscan.harness_alive(pid if isinstance(pid, int) else None, start if isinstance(start, int) else None):
            continue
        name, conf = str(record["name"]), Path(str(record.get("conf") or slurm.conf_path()))
        if not conf.is_file():  # its cluster's configuration is gone (a lab taken down): no job of it can run
            said.append(f"{'would remove' if dry_run else 'removed'} the record of {name} (its SLURM configuration "
                        f"{conf} is gone: nothing to cancel)")
            if not dry_run:
                _remove_record(token)
            continue
        if record.get("local"):  # nodes its tasks ran on that it died before recording: SLURM still lists them
            record = {**record, "local_nodes": sorted({*map(str, record.get("local_nodes") or []),
                                                       *_array_nodes(record, conf)})}
        if dry_run:
            said.append(f"would cancel the SLURM jobs named {name} ({conf})")
            said += sweep_node_local(record, conf, dry_run=True)
            continue
        try:
            left = cancel_name(name, conf, wait=wait)
        except slurm.SlurmError as exc:  # one cluster not answering does not keep the others' jobs alive
            said.append(f"could not cancel the SLURM jobs named {name}: {exc}")
            continue
        said.append(f"cancelled the SLURM jobs named {name}"
                    + (f"; still listed after {wait:g}s: {', '.join(left)}" if left else ""))
        if not left:  # the jobs are gone: what their node-local lanes left is taken back, then the record
            said += sweep_node_local(record, conf)
            _remove_record(token)
    return said
