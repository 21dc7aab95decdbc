"""Scenarios on ssh hosts: a real lab (``harness.lab``: namespaces running OpenSSH sshd) and its
inventory; the same scenario files that run on netns hosts, bound to the lab's machines.

- the five network scenarios pass through the lab unchanged (process faults by remote signal,
  network faults by iptables/ip/tc run on the host, on its data interface);
- a run leaves nothing on any host (its per-run folder, processes, chains) and the lab goes;
- every byte the harness read came over ssh: the host's per-run folder is not the run folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import lab
from harness.errors import HarnessError
from harness.inventory import Inventory, load_inventory
from harness.runner import Runner
from harness.scenario import load_scenario

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
def lab_inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inventory]:
    base = tmp_path_factory.mktemp("lab")
    state = base / "lab"
    lab.up(4, inventory_out=base / "inventory.yaml", state=state)
    try:
        yield load_inventory(base / "inventory.yaml")
    finally:
        try:
            lab.down(state)
        except HarnessError as exc:  # reported, after every test ran
            pytest.fail(f"lab down left something: {exc}")
        assert lab.leftovers(state) == []


@pytest.mark.parametrize("name", NETWORK_SCENARIOS)
def test_network_scenarios_pass_on_lab_ssh_hosts(name: str, lab_inventory: Inventory, tmp_path: Path) -> None:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    result = Runner(scenario, out_dir=tmp_path, inventory=lab_inventory, install_signal_handlers=False).run()
    failed = [f"{c.name}: {c.summary}" for c in result.checks if c.valid is not True]
    assert result.verdict == "pass", f"{result.status} {result.reason} {failed} ({result.run_dir})"
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
