"""``mxchaos cleanup``: sweep what crashed runs left behind.

Processes are found the one way the harness finds them (``procscan.find``: the run's scope,
``harness.machine.runscope``, with its cgroup and ledger of pids, and the ``MXCHAOS_RUN_ID`` in their
environment), so a wrapper's child with a blank environment is found too, and killed with the
rest of its cgroup at once. By default only runs whose harness is gone are swept (a
live harness may be a parallel pytest worker); ``run_id`` picks one run, ``all_runs``
every run. Each fault kind's ``sweep(run_id)`` removes its own leftovers (rules, qdiscs,
toxics named after the run), then the run's network of ``netns`` hosts goes (namespaces, veths,
bridge: found by the names and link aliases derived from the run id, also for a run whose
ledger entry is lost), and the run's ledger entry and its scope (cgroups, ledger of pids) are removed. First
of all (no ``run_id``), the SLURM jobs of a ``--slurm`` dispatcher that is gone are cancelled by the name
its record in the state dir gives (``harness.hosts.slurm_array.sweep_dead``), and waited for (bounded). A lab (``harness.hosts.lab``) whose
``mxchaos lab up`` died while building it goes too; a lab that is up is left alone.

What counts as a run's, and when it is dead: a process's ``MXCHAOS_RUN_ID`` counts only on a
process of our own user (``procscan.scan``); a run id that is malformed, wherever it was read (a
process's tag, a ledger file's name, a link alias), is skipped and named in ``skipped``, never
fatal. Whether a run's harness lives is read from our ledger entry first, then our ledger of pids,
then the network's owner record, then a member's tag; a run seen only through its cgroup (no
entry, no ledger of ours, no tagged process of ours: another state directory's run) is live, left
alone unless named by ``run_id`` or ``all_runs``. Every process is signalled only while it is still
the one found (``runscope.signal_exact``: pid and start time).

Only the ledger entries that are ours are read (``harness.machine.statedir``: a state directory that is
not ours is refused), and a run folder an entry names gets its ``CRASHED`` note only if it is the
folder the run made (``run_dir_id``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from harness import faults as fault_registry
from harness.hosts import lab, netns, slurm_array, ssh
from harness.machine import ledger, procscan, runscope, statedir

__all__ = ["CleanupReport", "sweep"]

_T = TypeVar("_T")


@dataclass
class CleanupReport:
    killed: list[procscan.RunProcess] = field(default_factory=list)
    survivors: list[procscan.RunProcess] = field(default_factory=list)
    skipped_live_runs: list[str] = field(default_factory=list)
    not_ours: list[str] = field(default_factory=list)  # runs seen only through a cgroup: no ledger of ours judges them
    skipped: list[str] = field(default_factory=list)  # malformed run ids, where they were read
    runs: list[str] = field(default_factory=list)
    fault_leftovers: dict[str, list[str]] = field(default_factory=dict)
    network: dict[str, list[str]] = field(default_factory=dict)  # run id -> namespaces/links deleted (dry run: found)
    slurm: list[str] = field(default_factory=list)  # a dead --slurm dispatcher's jobs, cancelled (dry run: found)
    dry_run: bool = False




def sweep(run_id: str | None = None, *, all_runs: bool = False, dry_run: bool = False, wait: float = 5.0) -> CleanupReport:
    report = CleanupReport(dry_run=dry_run)
    if run_id is not None:
        runscope.valid_run_id(run_id)
    if run_id is None:  # first: a dead dispatcher's SLURM tasks end (their runs tear down) before runs are looked for
        with contextlib.suppress(Exception):
            report.slurm = slurm_array.sweep_dead(dry_run=dry_run)
    found = procscan.find(skipped=report.skipped)
    live_entries = _valid(ledger.entries(), "a ledger entry", report.skipped)
    scoped = runscope.runs()
    tagged = {p.run_id for p in found if p.tagged}  # runs with a process of ours carrying their id
    runs: set[str] = {p.run_id for p in found} | set(live_entries) | scoped
    network_owners: dict[str, tuple[int | None, int | None]] = {}
    with contextlib.suppress(Exception):  # no `ip`, no netns: nothing of that kind to find
        network_owners = _valid(netns.leftover_runs(), "a network's link alias", report.skipped)
        runs |= set(network_owners)
    chosen: set[str] = set()
    for rid in sorted(runs):
        if run_id is not None and rid != run_id:
            continue
        hp, hs = _harness(rid, live_entries.get(rid, {}), runscope.owner(rid), network_owners.get(rid),
                          [p for p in found if p.run_id == rid])
        if hp is None and rid not in tagged and rid not in network_owners and run_id is None and not all_runs:
            report.not_ours.append(rid)  # only its cgroup: no ledger of ours proves it dead
            continue
        alive = procscan.harness_alive(hp, hs)
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
        runscope.signal_exact(p.pid, p.start)
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


def _valid(found: dict[str, _T], where: str, skipped: list[str]) -> dict[str, _T]:
    """``found`` without its malformed run ids, each named in ``skipped``."""
    out: dict[str, _T] = {}
    for rid, value in found.items():
        try:
            out[runscope.valid_run_id(rid)] = value
        except ValueError as exc:
            skipped.append(f"{where}: {exc}")
    return out


def _harness(rid: str, entry: dict[str, object], scope_owner: tuple[int | None, int | None],
             network_owner: tuple[int | None, int | None] | None, members: list[procscan.RunProcess]) -> tuple[int | None, int | None]:
    """The run's harness (pid, start time): our ledger entry's, else our ledger of pids', else the
    one its network recorded, else a member's tag (a member of ours: ``procscan.scan``; one caught
    between fork and exec names none, which is no evidence of a dead one). (None, None): nothing
    of ours names one."""
    pid, start = entry.get("harness_pid"), entry.get("harness_start")
    if isinstance(pid, int):
        return pid, start if isinstance(start, int) else None
    for owner in (scope_owner, network_owner):
        if owner is not None and owner[0] is not None:
            return owner
    known = [p for p in members if p.harness_pid is not None]
    return (known[0].harness_pid, known[0].harness_start) if known else (None, None)


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
