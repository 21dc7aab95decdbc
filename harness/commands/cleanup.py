"""``mxchaos cleanup``: sweep what crashed runs left behind.

Processes are found the one way the harness finds them (``procscan.find``: the run's scope,
``harness.machine.runscope``, with its cgroup and ledger of pids, and the ``MXCHAOS_RUN_ID`` in their
environment), so a wrapper's child with a blank environment is found too, and killed with the
rest of its cgroup at once. By default only runs whose harness is gone are swept (a
live harness may be a parallel pytest worker); ``run_id`` picks one run, ``all_runs``
every run. Each fault kind's ``sweep(run_id)`` removes its own leftovers (rules, qdiscs,
toxics named after the run), then the run's network of ``netns`` hosts goes (namespaces, veths,
bridge: found by the names and link aliases derived from the run id, also for a run whose
ledger entry is lost), and the run's ledger entry and its scope (cgroups, ledger of pids) are removed. A lab (``harness.hosts.lab``) whose
``mxchaos lab up`` died while building it goes too; a lab that is up is left alone.

Only the ledger entries that are ours are read (``harness.machine.statedir``: a state directory that is
not ours is refused), and a run folder an entry names gets its ``CRASHED`` note only if it is the
folder the run made (``run_dir_id``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import faults as fault_registry
from harness.hosts import lab, netns, ssh
from harness.machine import ledger, procscan, runscope, statedir

__all__ = ["CleanupReport", "sweep"]


@dataclass
class CleanupReport:
    killed: list[procscan.RunProcess] = field(default_factory=list)
    survivors: list[procscan.RunProcess] = field(default_factory=list)
    skipped_live_runs: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    fault_leftovers: dict[str, list[str]] = field(default_factory=dict)
    network: dict[str, list[str]] = field(default_factory=dict)  # run id -> namespaces/links deleted (dry run: found)
    dry_run: bool = False




def sweep(run_id: str | None = None, *, all_runs: bool = False, dry_run: bool = False, wait: float = 5.0) -> CleanupReport:
    report = CleanupReport(dry_run=dry_run)
    if run_id is not None:
        runscope.valid_run_id(run_id)
    found = procscan.find()
    live_entries = ledger.entries()
    scoped = runscope.runs()
    runs: set[str] = {p.run_id for p in found} | set(live_entries) | scoped
    network_owners: dict[str, tuple[int | None, int | None]] = {}
    with contextlib.suppress(Exception):  # no `ip`, no netns: nothing of that kind to find
        network_owners = netns.leftover_runs()
        runs |= set(network_owners)
    chosen: set[str] = set()
    for rid in sorted(runs):
        if run_id is not None and rid != run_id:
            continue
        members = [p for p in found if p.run_id == rid]
        info = live_entries.get(rid, {})
        owner = network_owners.get(rid, runscope.owner(rid) if rid in scoped else (None, None))
        # a member that names its harness (one caught between fork and exec, in the run's cgroup
        # before the ledger of pids names its harness, names none: it is no evidence of a dead one)
        known = [p for p in members if p.harness_pid is not None]
        hp = known[0].harness_pid if known else info.get("harness_pid", owner[0])
        hs = known[0].harness_start if known else info.get("harness_start", owner[1])
        alive = procscan.harness_alive(hp if isinstance(hp, int) else None, hs if isinstance(hs, int) else None)
        if alive and run_id is None and not all_runs:
            report.skipped_live_runs.append(rid)
            continue
        chosen.add(rid)
    report.runs = sorted(chosen)
    with contextlib.suppress(Exception):  # a lab whose `mxchaos lab up` died half-built
        if lab.abandoned():
            report.network["abandoned lab"] = lab.leftovers() if dry_run else lab.down()
    targets = [p for p in found if p.run_id in chosen]
    if dry_run:
        report.killed = targets
        for rid in report.runs:
            with contextlib.suppress(Exception):
                left = netns.leftovers(rid)
                if left:
                    report.network[rid] = left
            scope = [f"{'cgroup' if p.suffix != '.pids' else 'pid ledger'} {p}" for p in runscope.scope_paths(rid)]
            if scope:
                report.network.setdefault(rid, []).extend(scope)
        return report
    deadline = time.monotonic() + wait
    for p in targets:  # at once, before any one of them can notice the others going
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGKILL)
    alive_pids: set[int] = set()
    for rid in sorted(chosen):  # its cgroup at once, then whatever else is found of it, until none is
        alive_pids |= set(runscope.kill(rid, [p.pid for p in targets if p.run_id == rid], wait=max(0.0, deadline - time.monotonic())))
    remaining = [p for p in targets if p.pid in alive_pids]
    report.killed = [p for p in targets if p not in remaining]
    report.survivors = remaining + [p for p in procscan.find() if p.run_id in chosen and p.pid in alive_pids
                                    and p.pid not in {q.pid for q in remaining}]
    for rid in chosen:
        for kind, cls in fault_registry.REGISTRY.items():
            with contextlib.suppress(Exception):
                removed = cls.sweep(rid)
                if removed:
                    report.fault_leftovers.setdefault(kind, []).extend(removed)
        with contextlib.suppress(Exception):  # after the faults: their rules live in these namespaces
            removed = netns.sweep(rid)
            if removed:
                report.network[rid] = removed
        with contextlib.suppress(Exception):  # the control sockets of its ssh hosts (harness.hosts.ssh)
            removed = ssh.sweep_local(rid)
            if removed:
                report.network.setdefault(rid, []).extend(removed)
        ledger.remove_entry(rid)
        with contextlib.suppress(Exception):  # its cgroups (empty now) and ledger of pids
            removed = runscope.remove(rid)
            if removed:
                report.network.setdefault(rid, []).extend(removed)
        _mark_crashed(live_entries.get(rid) or {}, len(targets))
    return report


def _mark_crashed(info: dict[str, object], swept: int) -> None:
    """A ``CRASHED`` note in the run folder the (verified, ours) ledger entry names, only if that
    folder is still the one the run made (its device and inode, ``run_dir_id``) and ours: never
    through a symlink, never over an existing file."""
    run_dir = info.get("run_dir")
    if not isinstance(run_dir, str):
        return
    fd = statedir.open_recorded_dir(Path(run_dir), info.get("run_dir_id"))
    if fd is None:
        return
    try:
        note = os.open("CRASHED", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        with os.fdopen(note, "w") as out:
            out.write(f"the harness of this run died; swept {swept} process(es) at {time.ctime()}\n")
    except OSError:
        pass
    finally:
        os.close(fd)
