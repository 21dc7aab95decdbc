"""Run groups as one SLURM job array and wait for them: the dispatcher's loop.

``dispatch(groups, spool, options)`` submits every group as one array
(``harness.hosts.slurm_array``), polls it every ``POLL_S`` until each task has ended, and returns
each group's ``Outcome``: the folder its ``mxchaos run`` wrote and its exit code, or the
infrastructure verdict (``infra``) that ended it. How a task ended is accounting's word
(``harness.hosts.slurm_acct``: ``sacct``, or ``sacct -c`` where there is only the job completion
log), read once the controller lists the task as ended (``scontrol``'s, said so, when accounting
has no record within ``ACCT_WAIT_S``); each attempt's end is kept in ``Outcome.ends``. A task that SLURM ended for a reason that is not
the tests' doing (``slurm_array.INFRA_STATES``), one that stayed pending past
``allocation_timeout``, one that ran past ``run_timeout`` and one whose folder holds no
``task.json`` (it never started its run, or its folder is not the dispatcher's to see) is
resubmitted once, into a folder of its own (``<spool>/a2/<group>``), excluding the node that
failed it; a second such end is the group's ``infra``, naming the job, the node and the state.
Before it is resubmitted, what the ended task left running is stopped where the dispatcher can
see it (``stop_leftovers``: the processes carrying its ``SLURM_JOB_ID``, and its slurmstepd).

A controller that stops answering mid-dispatch is ``SlurmUnavailable`` (exit 4 naming it) after a
best-effort cancel (the record stays for ``mxchaos cleanup`` when that fails too). SIGINT and
SIGTERM of the dispatcher cancel the whole dispatch (``scancel --name``, then a bounded
wait until nothing of it is pending or running) and raise ``KeyboardInterrupt``. The dispatch is
recorded in the state dir before anything is submitted, and removed when every task has ended:
``mxchaos cleanup`` cancels the jobs of a dispatcher that died.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

from harness.hosts import slurm
from harness.hosts.allocation import PREFIX, SRUN_PREFIX
from harness.hosts.slurm_acct import SOURCE_NONE, Accounting
from harness.hosts.slurm_array import DONE, INFRA, PENDING, RUNNING, Dispatch, Group, TaskState, state_of
from harness.hosts.slurm_gather import Gatherer
from harness.machine import runscope

__all__ = ["FOLDER", "FolderFor", "Options", "Outcome", "dispatch", "stop_leftovers"]

FOLDER = "{folder}"  # in a group's argv: the folder of the attempt that runs it
POLL_S = 1.0
KILL_WAIT_S = 15.0
UNLISTED_S = 60.0  # a submitted task SLURM does not list this long after its submission: the infrastructure's
ACCT_WAIT_S = 10.0  # an ended task that accounting does not list this long: scontrol's word is taken (and said)


@dataclass(frozen=True)
class Options:
    conf: Path
    partition: str | None = None
    time_limit: str | None = None  # sbatch --time
    allocation_timeout: float = 600.0  # a task pending longer: infrastructure
    run_timeout: float = 3600.0  # a task running longer: infrastructure (SLURM's --time when given is the first bound)
    label: str = "run"
    nodes_per_lane: int = 1  # sbatch --nodes of each task; over 1, the lane's run takes its hosts from the allocation
    lane_inventory: str | None = None  # how such a lane reaches its nodes: an inventory file with slurm: (default slurm:)
    reach: str = "ssh"  # how such a lane reaches its nodes: ssh, or srun (slurm+srun:[lane_inventory])
    node_local: str | None = None  # the nodes do not see our folders: lanes write under this folder on their node

    def lane_slots(self, nodes: int) -> int:
        """How many lanes run at once on ``nodes`` nodes (at least one)."""
        return max(1, nodes // max(1, self.nodes_per_lane))

    def lane_argv(self, argv: Sequence[str]) -> tuple[str, ...]:
        """A lane's ``mxchaos run`` argv; with several nodes per lane, ``--inventory`` of the task's
        own allocation (``slurm:``, ``lane_inventory``; ``slurm+srun:[lane_inventory]`` when ``reach`` is srun) after
        ``run``: its scenarios' hosts are bound to the lane's nodes by the inventory rule."""
        if self.nodes_per_lane <= 1 or "run" not in argv:
            return tuple(argv)
        at = list(argv).index("run") + 1
        spec = (SRUN_PREFIX if self.reach == "srun" else "" if self.lane_inventory else PREFIX) + (self.lane_inventory or "")
        return (*argv[:at], "--inventory", spec, *argv[at:])


@dataclass
class Outcome:
    group: Group
    folder: Path  # the attempt whose runs count
    rc: int | None = None
    infra: str | None = None  # the infrastructure verdict (after the resubmission)
    node: str = ""
    job: str = ""
    attempts: list[str] = field(default_factory=list)  # what each attempt ended as
    queued_to_start_s: float | None = None  # submission -> the task's first act on its node
    nodelist: str = ""  # every node of the attempt that counts (SLURM's NodeList: h[1-2])
    gathered: list[dict[str, object]] = field(default_factory=list)  # node-local results: each attempt's gathering
    ends: list[dict[str, object]] = field(default_factory=list)  # each attempt's end: job, state, rc, node, source


FolderFor = Callable[[Group, int], Path]  # (group, attempt 1 or 2) -> the folder that attempt writes


def _attempt(groups: Sequence[Group], spool: Path, n: int, folder_for: FolderFor | None,
             local_root: str | None = None) -> list[Group]:
    """The groups of attempt ``n``: each its folder here, and (node-local results, ``local_root``)
    the folder its task writes on its node instead, which its argv names."""
    out = []
    for g in groups:
        folder = folder_for(g, n) if folder_for is not None else spool / f"a{n}" / g.name
        remote = f"{local_root}/a{n}/{g.name}" if local_root is not None else None
        out.append(replace(g, folder=folder, remote=remote,
                           argv=tuple((remote or str(folder)) if a == FOLDER else a for a in g.argv)))
    return out


@contextlib.contextmanager
def _signals_cancel(d: Dispatch, log: Callable[[str], None]) -> Iterator[None]:
    """SIGINT/SIGTERM: cancel the dispatch, then KeyboardInterrupt (a second signal waits for that)."""
    caught: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if caught:
            return
        caught.append(signum)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log(f"interrupted: cancelling SLURM jobs named {d.name}")
        left = d.cancel()
        if left:
            log(f"still listed after the bound: {', '.join(left)}")
        else:
            d.forget()
        raise
    except slurm.SlurmError as exc:  # the controller stopped answering mid-dispatch: cancel what can be, say so
        log(f"SLURM failed mid-dispatch ({exc}): cancelling SLURM jobs named {d.name}")
        with contextlib.suppress(slurm.SlurmError):
            if not d.cancel(wait=10.0):
                d.forget()
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _environ_job(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def _job_pids(job: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if _environ_job(pid) == job or cmd.startswith(f"slurmstepd: [{job}."):
            pids.append(pid)
    return pids


def stop_leftovers(job: str, wait: float = KILL_WAIT_S) -> list[int]:
    """Stop what an ended task left running where this machine sees it (its node's slurmd died: a
    node in this pid namespace, as the lab's): SIGTERM to every process carrying its
    ``SLURM_JOB_ID`` (the run heals and tears down), SIGKILL to what is left after ``wait``, then
    its slurmstepd; the pids that were found. Each signal goes to the process found, by its start time."""
    slurm.valid_job_id(job)
    found = {pid: st.start for pid in _job_pids(job) if (st := runscope.proc_stat(pid)) is not None}
    for pid, start in found.items():
        if not _is_stepd(pid):
            runscope.signal_exact(pid, start, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(not _is_stepd(p) and _alive(p, s) for p, s in found.items()):
        time.sleep(0.2)
    for pid in _job_pids(job):
        st = runscope.proc_stat(pid)
        if st is not None:
            runscope.signal_exact(pid, st.start, signal.SIGKILL)
    return sorted(found)


def _is_stepd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"slurmstepd")
    except OSError:
        return False


def _alive(pid: int, start: int) -> bool:
    now = runscope.proc_stat(pid)
    return now is not None and now.start == start and now.state not in ("Z", "X")


def _started(folder: Path) -> float | None:
    try:
        return float(json.loads((folder / "task.json").read_text())["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _judge_end(task: TaskState, folder: Path) -> str | None:
    """Why an ended task is the infrastructure's (None: it is the run's end)."""
    if task.state == INFRA:
        return task.describe()
    if _started(folder) is None:
        return (f"SLURM job {task.job} (task {task.index}) on node {task.node or '(none)'} ended {task.slurm_state} "
                f"(rc {task.rc}) but {folder / 'task.json'} is not there: the task never started its run, or its "
                "folder is not visible to the dispatcher (--slurm needs a file system shared with the nodes)")
    return None


def _accounted(tasks: dict[int, TaskState], acct: Accounting, seen_end: dict[int, float], now: float,
               known: dict[int, str], cancelled_by_us: bool) -> dict[int, tuple[TaskState, dict[str, object]] | None]:
    """The ended tasks of this poll with their end as accounting says it (``sacct``), or as
    ``scontrol`` says it when accounting has nothing (no source, or no record ``ACCT_WAIT_S`` after
    the end was first seen); None: wait for accounting."""
    ended = {i: t for i, t in tasks.items() if t.state in (DONE, INFRA)}
    jobs = {i: (t.job if "_" not in t.job else known.get(i, "")) for i, t in ended.items()}
    said = acct.ended([j for j in jobs.values() if j])
    out: dict[int, tuple[TaskState, dict[str, object]] | None] = {}
    for i, task in ended.items():
        seen_end.setdefault(i, now)
        end = said.get(jobs[i])
        if end is not None:
            state = state_of(end.state, cancelled_by_us=cancelled_by_us)
            out[i] = (replace(task, job=end.job, state=state, slurm_state=end.state, node=end.node or task.node,
                              rc=end.rc if end.rc is not None else task.rc), end.as_dict())
        elif not jobs[i] or acct.source == SOURCE_NONE or now - seen_end[i] > ACCT_WAIT_S:
            why = ("its own job id was never listed" if not jobs[i] else "no accounting" if acct.source == SOURCE_NONE
                   else f"{acct.source}: no record within {ACCT_WAIT_S:g}s")
            out[i] = (task, {"job": task.job, "state": task.slurm_state, "rc": task.rc, "node": task.node,
                             "nodes": task.nodelist, "source": f"scontrol ({why})"})
        else:
            out[i] = None
    return out


def dispatch(groups: Sequence[Group], spool: Path, options: Options,
             log: Callable[[str], None] = lambda _m: None, folder_for: FolderFor | None = None) -> list[Outcome]:
    """Run ``groups`` as one array (module docstring); their outcomes, in order. Each attempt of a
    group writes ``folder_for(group, attempt)`` (default ``<spool>/a<attempt>/<group>``)."""
    slurm.ping(options.conf)  # exit 4 naming the controller before anything is written or queued
    groups = [replace(g, argv=options.lane_argv(g.argv)) for g in groups]
    local_root = None
    if options.node_local is not None:  # a folder of its own per dispatch and node, on each node
        local_root = f"{options.node_local.rstrip('/')}/{{node}}/{options.label}-{secrets.token_hex(4)}"
    first = _attempt(groups, spool, 1, folder_for, local_root)
    d = Dispatch(first, spool, options.conf, partition=options.partition, time_limit=options.time_limit,
                 label=options.label, nodes=options.nodes_per_lane, embed=local_root is not None, local=local_root)
    gatherers: dict[int, Gatherer] = {}  # node-local results: task index -> its gathering (this attempt)
    outcomes = [Outcome(g, g.folder) for g in first]
    attempt = {i: 1 for i in range(len(first))}
    ended: set[int] = set()
    running_since: dict[int, float] = {}
    acct = Accounting(options.conf)
    seen_end: dict[int, float] = {}  # task index -> when its end was first seen (this attempt)
    known: dict[int, str] = {}  # task index -> its own job id, once SLURM listed it (accounting is asked by it)
    with _signals_cancel(d, log):
        array = d.submit(list(range(len(first))))
        each = "one node" if options.nodes_per_lane <= 1 else f"{options.nodes_per_lane} nodes"
        log(f"SLURM array {array} ({d.name}): {len(first)} task(s), {each} each")
        while len(ended) < len(first):
            time.sleep(POLL_S)
            states = d.poll()
            now = time.monotonic()
            for i, t in states.items():
                if "_" not in t.job:
                    known[i] = t.job
            for i, out in enumerate(outcomes):
                # SLURM lists no such task (purged, a controller that lost its state): bounded too
                if i not in ended and i not in states and now - d.submitted_at[i] > UNLISTED_S:
                    states[i] = TaskState(i, known.get(i) or f"{d.array_of[i]}_{i}", INFRA, "NOT_LISTED", out.node,
                                          reason=f"scontrol lists no such task {UNLISTED_S:g}s after its submission")
            ends = _accounted({i: t for i, t in states.items() if i not in ended}, acct, seen_end, now, known, d.cancelled)
            redo: list[int] = []
            for i, out in enumerate(outcomes):
                task = states.get(i)
                if i in ended or task is None:
                    continue
                end: dict[str, object] | None = None
                if task.state in (DONE, INFRA):
                    accounted = ends.get(i)
                    if accounted is None:
                        continue  # accounting has not written it yet (bounded: ACCT_WAIT_S)
                    task, end = accounted
                if task.state == RUNNING:
                    running_since.setdefault(i, now)
                    if local_root is not None and i not in gatherers and "_" not in task.job and task.node:
                        gatherers[i] = Gatherer(task.job, task.node, str(d.groups[i].remote), out.folder, options.conf,
                                                options.run_timeout)
                        gatherers[i].start()
                if out.queued_to_start_s is None and (t0 := _started(out.folder)) is not None:
                    out.queued_to_start_s = max(0.0, t0 - d.submitted_wall[i])
                why = None
                if task.state == PENDING and now - d.submitted_at[i] > options.allocation_timeout:
                    why = f"SLURM job {task.job} (task {i}) never started within {options.allocation_timeout:g}s ({task.reason})"
                elif task.state == RUNNING and now - running_since[i] > options.run_timeout:
                    why = f"SLURM job {task.job} (task {i}) on node {task.node} ran past {options.run_timeout:g}s"
                elif task.state in (DONE, INFRA):
                    if end is not None:
                        out.ends.append(end)
                    taking = gatherers.get(i)
                    if taking is not None:
                        taking.join()
                        out.gathered.append(taking.describe())
                    why = _judge_end(task, out.folder)
                    if why is not None and taking is not None and taking.error:
                        why += f"; gathering its folder from {taking.node}: {taking.error}"
                    elif why is not None and local_root is not None and taking is None:
                        why += "; its node-local folder was never gathered (the task was not seen running)"
                    if why is not None and end is not None:
                        why += f"; end state from {end['source']}"
                    if why is None:
                        out.rc, out.node, out.job, out.nodelist = task.rc, task.node, task.job, task.nodelist
                        out.attempts.append(f"{task.job} on {task.node}: {task.slurm_state} rc {task.rc}")
                        ended.add(i)
                        continue
                else:
                    continue
                if task.state in (PENDING, RUNNING):
                    with contextlib.suppress(slurm.SlurmError):
                        d.cancel_task(task.job)
                if task.job and "_" not in task.job:
                    stop_leftovers(task.job)
                out.attempts.append(why)
                out.node, out.job = task.node, task.job
                log(f"{out.group.name}: infrastructure: {why}")
                running_since.pop(i, None)
                seen_end.pop(i, None)
                gatherers.pop(i, None)
                known.pop(i, None)
                if attempt[i] >= 2:
                    out.infra = why
                    ended.add(i)
                else:
                    redo.append(i)
            if redo:
                again = _attempt([groups[i] for i in redo], spool, 2, folder_for, local_root)
                for i, g in zip(redo, again):
                    attempt[i] = 2
                    d.groups[i] = g
                    outcomes[i].folder = g.folder
                bad = sorted({outcomes[i].node for i in redo if outcomes[i].node})
                array = d.submit(redo, exclude=bad)
                log(f"resubmitted {', '.join(groups[i].name for i in redo)} as SLURM array {array}"
                    + (f" (not on {', '.join(bad)})" if bad else ""))
    d.forget()
    return outcomes
