"""``mxchaos cleanup --inventory FILE``: sweep what dead runs left on every machine of an inventory.

On each machine, over ssh (``harness.hosts.ssh.SshHost``; sudo for the network commands when the
inventory says so), for every run whose harness is gone (by the harness pid and start time its
processes carry in ``MXCHAOS_HARNESS_PID``/``_START``: the harness ran here), or only ``run_id``,
or every run with ``all_runs``:

- processes carrying ``MXCHAOS_RUN_ID`` are killed (SIGKILL);
- iptables chains ``mxc-<token>-*`` (partition/reject) whose run token is not a live run's are
  unhooked and deleted;
- our ``tbf`` qdisc (handle ``1de:``) on the data device is deleted and a data device left down
  is set up again, only when no live run of this harness's machine may use that machine
  (``may_use``: neither carries a run id);
- per-run folders ``<work_dir>/<run id>`` of runs that are not live are removed, only those the
  harness made: a folder (no symlink) owned by the ssh user holding the marker ``SshHost.open``
  wrote (``.mxchaos-run``, a regular file of that user's naming the folder); checked again, on the
  host, in the command that removes it. Anything else in ``work_dir`` is left alone.

A machine that does not answer is reported by name, within its connect timeout; the others are
swept anyway.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.hosts import netns
from harness.hosts.inventory import Inventory, Machine
from harness.hosts.netns import QDISC_HANDLE
from harness.hosts.ssh import RUN_MARKER, SshHost
from harness.hosts.ssh_remote import shell_path
from harness.machine import ledger, procscan

__all__ = ["MachineSweep", "live_runs", "may_use", "sweep_inventory"]


@dataclass
class MachineSweep:
    machine: str
    removed: list[str] = field(default_factory=list)
    error: str | None = None


def live_runs() -> dict[str, dict[str, Any]]:
    """The ledger entries of runs whose harness (on this machine) is still running, by run id."""
    live = {}
    for rid, info in ledger.entries().items():
        pid, start = info.get("harness_pid"), info.get("harness_start")
        if procscan.harness_alive(pid if isinstance(pid, int) else None, start if isinstance(start, int) else None):
            live[rid] = info
    return live


def may_use(info: dict[str, Any], machine: Machine) -> bool:
    """Whether a live run (its ledger entry) may have faults on ``machine``: its ssh hosts name
    it; or it runs over ssh and has not opened its hosts yet; or (an entry without the ``ssh``
    key, from an older harness) it is not a netns run. A qdisc or a downed device carries no run
    id, so only such a run keeps the sweep off them; runs on other machines (or none) do not."""
    hosts = info.get("hosts")
    if isinstance(hosts, dict) and hosts:
        here = f"{machine.target}:{machine.port}"
        return any(isinstance(h, dict) and h.get("ssh") == here for h in hosts.values())
    if "ssh" in info:
        return bool(info["ssh"])
    return "network" not in info


def sweep_inventory(inventory: Inventory, *, run_id: str | None = None, all_runs: bool = False,
                    dry_run: bool = False) -> list[MachineSweep]:
    entries = {} if all_runs else live_runs()
    entries.pop(run_id or "", None)
    live = set(entries)
    results = []
    for name, machine in inventory.machines.items():
        host = SshHost(name, name, machine, f"cleanup-{os.getpid()}", Path("/nonexistent"))
        result = MachineSweep(name)
        busy = any(may_use(info, machine) for info in entries.values())
        try:
            _sweep_machine(host, live, busy, run_id, all_runs, dry_run, result)
        except HarnessError as exc:
            result.error = str(exc)
        finally:
            host.shell.close()
            host.close_master()
        if host.lost and result.error is None:
            result.error = host.lost
        results.append(result)
    return results


# on the host, in work_dir: succeeds for a folder the harness made (``SshHost.open``)
_MADE = (f'[ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && [ -f "$d/{RUN_MARKER}" ] && [ ! -L "$d/{RUN_MARKER}" ] '
         f'&& [ -O "$d/{RUN_MARKER}" ] && [ "$(cat "$d/{RUN_MARKER}")" = "$d" ]')


def _dead(rid: str, live: set[str], run_id: str | None) -> bool:
    return rid == run_id if run_id is not None else rid not in live


def _sweep_machine(host: SshHost, live: set[str], busy: bool, run_id: str | None, all_runs: bool, dry_run: bool,
                   result: MachineSweep) -> None:
    """``live``: the run ids still running (anywhere); ``busy``: whether one of them may have
    faults on this machine (``may_use``), which keeps the sweep off its qdisc and device."""
    verb = "would " if dry_run else ""

    def doomed(p: procscan.RunProcess) -> bool:
        if run_id is not None or all_runs:
            return all_runs or p.run_id == run_id
        return p.run_id not in live and not procscan.harness_alive(p.harness_pid, p.harness_start)

    procs = [p for p in host.run_processes("") if doomed(p)]
    procs += [p for p in host.run_processes("", plumbing=True) if p.run_id not in live and (run_id is None or p.run_id == run_id)
              and p.run_id != f"cleanup-{os.getpid()}" and p.pid not in {q.pid for q in procs}]
    if procs and not dry_run:
        host.kill_processes([p.pid for p in procs])
    result.removed += [f"{verb}kill pid {p.pid} ({p.proc}) of run {p.run_id}" for p in procs]
    live_tokens = {netns.token(rid) for rid in live}
    rc, out = host.run_privileged(["iptables", "-w", "5", "-S"], 10.0)
    chains = sorted({line.split()[1] for line in out.splitlines() if rc == 0 and line.startswith("-N mxc-")})
    for chain in chains:
        token = chain.split("-")[1]
        if token in live_tokens or (run_id is not None and token != netns.token(run_id)):
            continue
        if not dry_run:
            for hook in ("INPUT", "OUTPUT"):
                for _ in range(16):
                    if host.run_privileged(["iptables", "-w", "5", "-D", hook, "-j", chain], 10.0)[0] != 0:
                        break
            host.run_privileged(["iptables", "-w", "5", "-F", chain], 10.0)
            host.run_privileged(["iptables", "-w", "5", "-X", chain], 10.0)
        result.removed.append(f"{verb}delete iptables chain {chain}")
    device = host.machine.data.device
    if device and not busy:
        rc, out = host.run_privileged(["tc", "qdisc", "show", "dev", device], 10.0)
        if rc == 0 and f"qdisc tbf {QDISC_HANDLE}" in out:
            if not dry_run:
                host.run_privileged(["tc", "qdisc", "del", "dev", device, "root", "handle", QDISC_HANDLE], 10.0)
            result.removed.append(f"{verb}delete tbf qdisc on {device}")
        rc, out = host.run_privileged(["ip", "-br", "link", "show", "dev", device], 10.0)
        if rc == 0 and " DOWN " in f" {out} ":
            if not dry_run:
                host.run_privileged(["ip", "link", "set", "dev", device, "up"], 10.0)
            result.removed.append(f"{verb}set {device} up")
    work = shell_path(host.machine.work_dir)
    done = host.run_remote(f'cd {work} 2>/dev/null || exit 0; for d in *; do {_MADE} && printf "%s\\n" "$d"; done; true',
                           timeout=host.machine.connect_timeout + 10)
    for entry in done.stdout.split():
        if _dead(entry, live, run_id):
            if not dry_run:
                with contextlib.suppress(HarnessError):
                    host.run_remote(f"cd {work} && d={shlex.quote(entry)} && {_MADE} && rm -rf -- \"$d\"",
                                    timeout=host.machine.connect_timeout + 30)
            result.removed.append(f"{verb}remove {host.machine.work_dir}/{entry}")
