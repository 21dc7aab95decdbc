"""Scenarios on ssh hosts: a real lab (``harness.hosts.lab``: namespaces running OpenSSH sshd) and its
inventory; the same scenario files that run on netns hosts, bound to the lab's machines.

- the five network scenarios pass through the lab unchanged (process faults by remote signal,
  network faults by iptables/ip/tc run on the host, on its data interface);
- the two clock scenarios pass with their replica (server-b) on a lab host of its own, its time
  namespace or libfaketime the host's (seen in the kernel's view of that process), and a server
  regression planted there still fails them;
- a run leaves nothing on any host (its per-run folder, processes, chains) and the lab goes;
- every byte the harness read came over ssh: the host's per-run folder is not the run folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from harness.commands import cleanup
from harness.engine.runner import Runner
from harness.errors import HarnessError
from harness.hosts import lab, netns, ssh, ssh_sweep
from harness.hosts.inventory import Inventory, load_inventory
from harness.hosts.ssh import SshHost
from harness.judge.verdict import RunResult
from harness.machine import procscan
from harness.record.timeline import Entry, History
from harness.scenario import Scenario, capabilities, load_scenario, parse_scenario

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd, iptables)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen", "iptables", "tc"))
                       or not Path("/usr/sbin/sshd").exists(),
                       reason="needs iproute2, iptables, tc, openssh-client and openssh-server"),
]

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
NETWORK_SCENARIOS = ["partition_mid_read", "partition_reject_mid_read", "source_link_down",
                     "source_killed_mid_read", "frozen_source"]


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("lab")
    state = base / "lab"
    lab.up(4, inventory_out=state.parent / "inventory.yaml", state=state)
    try:
        yield state
    finally:
        try:
            lab.down(state)
        except HarnessError as exc:  # reported, after every test ran
            pytest.fail(f"lab down left something: {exc}")
        assert lab.leftovers(state) == []


@pytest.fixture
def lab_inventory(lab_state: Path) -> Inventory:
    return load_inventory(lab_state.parent / "inventory.yaml")


def _remote_leftovers(inventory: Inventory, run_id: str) -> list[str]:
    """What of the run is on any machine, seen over ssh (never the harness's own word)."""
    found: list[str] = []
    for name, machine in inventory.machines.items():
        host = SshHost(name, name, machine, f"probe-{os.getpid()}", Path("/nonexistent"))
        try:
            found += [f"{name}: pid {p.pid} ({p.proc})" for p in host.run_processes(run_id)]
            _rc, chains = host.run_privileged(["iptables", "-w", "5", "-S"], 10.0)
            found += [f"{name}: chain {line}" for line in chains.splitlines() if f"mxc-{netns.token(run_id)}-" in line]
            device = str(machine.data.device)
            _rc, qdiscs = host.run_privileged(["tc", "qdisc", "show", "dev", device], 10.0)
            found += [f"{name}: qdisc {line}" for line in qdiscs.splitlines() if "tbf 1de:" in line]
            _rc, link = host.run_privileged(["ip", "-br", "link", "show", "dev", device], 10.0)
            found += [f"{name}: {device} down" for _ in [1] if " DOWN " in f" {link} "]
            listing = host.run_remote(f"ls -1 {machine.work_dir}", timeout=15).stdout.split()
            found += [f"{name}: dir {entry}" for entry in listing if entry == run_id]
        finally:
            host.shell.close()
            host.close_master()
    return found


def _await(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g}s")
        time.sleep(0.2)


def test_harness_sigkilled_mid_run_then_cleanup_inventory_leaves_nothing(lab_inventory: Inventory, lab_state: Path,
                                                                         tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SCENARIOS.parent)}
    argv = [sys.executable, "-m", "harness.cli", "run", str(SCENARIOS / "partition_mid_read.yaml"), "--inventory",
            str(lab_state.parent / "inventory.yaml"), "--out", str(tmp_path), "-q"]
    harness = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # mid-run: its processes up, its rate qdiscs and the partition chain in place on the hosts
        def partitioned() -> bool:
            return any('"fault":"cut"' in line and '"type":"ok"' in line
                       for f in tmp_path.glob("*/*/timeline.jsonl") for line in f.read_text().splitlines())

        _await(partitioned, 120, "the partition of partition_mid_read")
        run_id = json.loads(next(tmp_path.glob("*/*/run.json")).read_text())["run_id"]
        assert _remote_leftovers(lab_inventory, run_id)  # there is something to sweep
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait(10)
        swept = ssh_sweep.sweep_inventory(lab_inventory, run_id=run_id)
        assert all(m.error is None for m in swept), [m.error for m in swept]
        assert _remote_leftovers(lab_inventory, run_id) == []
        # here: the local ssh clients of the dead harness (they carry its run id)
        cleanup.sweep(run_id=run_id)
        assert [p for p in procscan.scan() if p.run_id == run_id] == []
        assert not list(Path("/tmp").glob(f"mxc-ssh-{netns.token(run_id)}-*"))  # its control sockets
        assert ssh.sweep_local(run_id) == []  # and its ssh clients: cleanup left none to find
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(10)


def test_a_host_whose_sshd_freezes_ends_the_run_naming_it(lab_inventory: Inventory, lab_state: Path,
                                                          tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIOS / "source_killed_mid_read.yaml")  # one host, bound to h1
    info = lab.status(lab_state)
    assert info is not None
    ns = info["hosts"]["h1"]["netns"]
    frozen: list[int] = []

    def freeze(entry: Entry) -> None:
        if entry.actor == "source-2" and entry.f == "start" and entry.type == "ok" and not frozen:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout.split()
            frozen.extend(int(p) for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "sshd")
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)

    runner = Runner(scenario, out_dir=tmp_path, inventory=lab_inventory, observers=[freeze], install_signal_handlers=False)
    try:
        result = runner.run()
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert frozen, "sshd was never frozen"
    assert (result.status, result.verdict) == ("error", "error"), (result.status, result.reason)  # the environment's
    assert "ssh host local (h1, root@" in result.reason and "stopped answering" in result.reason
    assert result.seconds < scenario.budgets.run
    leak = next(c for c in result.checks if c.name == "nothing_leaked")
    assert leak.valid == "unknown" and "local" in leak.summary
    ssh_sweep.sweep_inventory(lab_inventory, run_id=runner.run_id)  # thawed: its processes go now
    assert _remote_leftovers(lab_inventory, runner.run_id) == []


@pytest.mark.alone  # their verdicts are stall and reset windows: a neighbour's load moves them
@pytest.mark.parametrize("name", NETWORK_SCENARIOS)
def test_network_scenarios_pass_on_lab_ssh_hosts(name: str, lab_inventory: Inventory, tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    result = Runner(scenario, out_dir=tmp_path, inventory=lab_inventory, install_signal_handlers=False).run()
    failed = [f"{c.name}: {c.summary}" for c in result.checks if c.valid is not True]
    if result.verdict != "pass" and _source_died_after_a_heal(result.history, scenario):
        # NIXL 1.5.1's known defect (scenario partition_heal_serves_later_reader, 2 of ~6 runs on
        # lab ssh hosts): a source whose departed reader's host resets its retransmits once the
        # link is back dies of SIGSEGV; what this test judges, ssh hosts, is checked all the same
        _check_hosts_and_folders(result, scenario, lab_inventory)
        pytest.xfail(f"NIXL 1.5.1: a source died of SIGSEGV after the heal (known defect): {failed} ({result.run_dir})")
    assert result.verdict == "pass", f"{result.status} {result.reason} {failed} ({result.run_dir})"
    _check_hosts_and_folders(result, scenario, lab_inventory)


def _source_died_after_a_heal(history: History, scenario: Scenario) -> bool:
    heal = history.last(actor="nemesis", f="heal", type="ok")
    sources = {name for name, role in scenario.roles().items() if role == "source"}
    return heal is not None and any(
        e.f == "process_exit" and e.actor in sources and e.get("signal") == "SIGSEGV" and not e.get("stopped_by_harness")
        and e.t > heal.t for e in history)


def _check_hosts_and_folders(result: RunResult, scenario: Scenario, lab_inventory: Inventory) -> None:
    info = json.loads((result.run_dir / "run.json").read_text())
    hosts = info["hosts"]
    assert set(hosts) == set(scenario.hosts) and all(h["kind"] == "ssh" for h in hosts.values())
    for host in hosts.values():  # a per-run folder of its own on each host, removed at the end
        remote = Path(host["remote_dir"])
        assert not remote.is_relative_to(result.run_dir) and not remote.exists()
        clock = host["clock"]
        assert {"start", "end"} <= set(clock) and clock["start"]["error_s"] >= 0
    # what the processes wrote came back over ssh (logs, results)
    assert list((result.run_dir / "procs").glob("*.log"))
    for machine in lab_inventory.machines.values():
        assert not any(Path(machine.work_dir).iterdir()), f"{machine.work_dir} is not empty"


# (scenario, the regression planted in its servers (MXREF_SIMULATED_BUG), the check it fails)
CLOCK_RUNS = [
    ("clock_replica_booted_earlier", None, None),
    ("clock_replica_booted_earlier", "monotonic_stamps", "the replica offered reader-1 both live sources"),
    ("clock_replica_wall_behind", None, None),
    ("clock_replica_wall_behind", "future_stamps", "the replica offered reader-1 both live sources"),
]


def _replica_on_its_own_host(name: str, bug: str | None) -> Scenario:
    """The clock scenario ``name`` with server-b on host ``replica`` and the rest (its Redis store
    included) on host ``main`` (two lab machines), ``bug`` planted in both servers."""
    path = SCENARIOS / f"{name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["hosts"] = {"main": "local", "replica": "local"}
    doc["processes"]["store"] = {"role": "redis"}  # the scenario's Redis (``store: redis``), named to place it
    for proc, spec in doc["processes"].items():
        spec["host"] = "replica" if proc == "server-b" else "main"
        if bug is not None and spec["role"] == "server":
            spec["env"] = {"MXREF_SIMULATED_BUG": bug}
    return parse_scenario(yaml.safe_dump(doc, sort_keys=False), file=path)


@pytest.mark.parametrize(("name", "bug", "fails"), CLOCK_RUNS, ids=[f"{n}-{b or 'mxref'}" for n, b, _f in CLOCK_RUNS])
def test_clock_scenarios_on_lab_ssh_hosts_the_replicas_clocks_are_its_hosts(name: str, bug: str | None, fails: str | None,
                                                                            lab_inventory: Inventory, lab_state: Path,
                                                                            tmp_path: Path) -> None:
    scenario = _replica_on_its_own_host(name, bug)
    seen: dict[str, str] = {}

    def kernel_view(entry: Entry) -> None:  # server-b up: what the kernel says of that process (the lab shares it)
        if entry.actor == "server-b" and entry.f == "listening" and not seen:
            pid = entry.get("pid")
            with contextlib.suppress(OSError):
                seen["netns"] = str(os.stat(f"/proc/{pid}/ns/net").st_ino)
                seen["timens_offsets"] = Path(f"/proc/{pid}/timens_offsets").read_text()
                seen["maps"] = Path(f"/proc/{pid}/maps").read_text()

    result = Runner(scenario, out_dir=tmp_path, inventory=lab_inventory, observers=[kernel_view], install_signal_handlers=False).run()
    failed = {c.name: c.summary for c in result.checks if c.valid is False}
    if fails is not None:  # the planted regression is caught on ssh hosts too
        assert result.verdict == "fail" and fails in failed, (result.status, result.reason, failed, result.run_dir)
    else:
        assert result.verdict == "pass", f"{result.status} {result.reason} {failed} ({result.run_dir})"
    _check_hosts_and_folders(result, scenario, lab_inventory)
    hosts = json.loads((result.run_dir / "run.json").read_text())["hosts"]
    info = lab.status(lab_state)
    assert info is not None and hosts["replica"]["machine"] != hosts["main"]["machine"]
    netns_inode = os.stat(f"/run/netns/{info['hosts'][hosts['replica']['machine']]['netns']}").st_ino
    assert seen.get("netns") == str(netns_inode), seen.get("netns")  # server-b ran on its ssh host
    started = next(e for e in result.history if e.actor == "server-b" and e.f == "start" and e.type == "ok")
    assert started.get("host") == "replica"
    if name == "clock_replica_booted_earlier":  # a time namespace of its host, 72 h ahead
        assert started.value["clocks"] == {"monotonic_s": 259200.0, "boottime_s": 259200.0}
        assert seen["timens_offsets"].split() == ["monotonic", "259200", "0", "boottime", "259200", "0"]
        # what the two servers wrote (fetched back over ssh): server-b's stamps run 72 h ahead of
        # server-a's, and the timeline has them apart by what happened between their events only
        raw = {n: json.loads((result.run_dir / "procs" / f"{n}.events.jsonl").read_text().splitlines()[0])
               for n in ("server-a", "server-b")}
        placed = {n: next(e for e in result.history if e.actor == n and e.f == raw[n]["event"]) for n in raw}
        ahead = raw["server-b"]["mono"] - raw["server-a"]["mono"] - (placed["server-b"].t - placed["server-a"].t)
        assert abs(ahead - 259200.0) < 0.5, ahead
    else:  # libfaketime loaded into it, its own time namespace the host's
        assert started.value["clocks"]["realtime_s"] == -2.0
        assert "libfaketime" in seen["maps"] and seen["timens_offsets"].split() == ["monotonic", "0", "0", "boottime", "0", "0"]
    # every event of the replica where it happened: its stamps (72 h ahead, over ssh) believed once
    # the declared offset and the host's probed clock are taken off, none set aside
    assert not [e for e in result.history if e.actor == "server-b" and "clock_rejected" in e.value]
    listening = next(e for e in result.history if e.actor == "server-b" and e.f == "listening")
    assert started.t - 0.5 <= listening.t <= started.t + 10


def test_a_lab_hosts_probe_over_ssh_finds_what_clock_faults_need(lab_inventory: Inventory, tmp_path: Path) -> None:
    machine = lab_inventory.machines["h1"]
    host = SshHost("replica", "h1", machine, f"probe-clk-{os.getpid()}", tmp_path)
    try:
        have = host.capabilities()
        assert {"root-login", "unshare", "timens", "faketime"} <= have, have
        assert host.faketime is not None and Path(host.faketime).name == "libfaketimeMT.so.1"
    finally:
        host.shell.close()
        host.close_master()
    for name in ("clock_replica_booted_earlier", "clock_replica_wall_behind"):
        assert capabilities.missing_on_ssh(_replica_on_its_own_host(name, None), lab_inventory, f"probe-clk-{os.getpid()}", tmp_path) == ([], "")
