"""``scenarios/hardware/`` on machines without the hardware: every scenario is a SKIP whose
reason names what is missing, and nothing starts (no process, no host opened, no time spent).

Without an inventory the reason says it needs one with GPU/RDMA hosts; with a lab inventory
(``mxchaos lab up``: namespaces running sshd, CPU only, no RDMA NIC) the hosts are probed over
ssh and the reason names the lab host and "no cuda" / "no rdma". The real run needs a pair of
GPU hosts with RDMA NICs (docs/gpu-hosts.md: "Hardware scenarios")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.hosts import lab

REPO = Path(__file__).resolve().parents[2]
HARDWARE = REPO / "scenarios" / "hardware"
NAMES = {"hardware_smoke_rdma", "hardware_frozen_source_rdma", "hardware_rdma_link_down"}

pytestmark = [pytest.mark.integration]


def _run(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(HARDWARE), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=240, check=False, env=env, cwd=REPO)
    return done, time.monotonic() - started


def _verdicts(out: Path) -> dict[str, dict[str, object]]:
    found = {}
    for path in out.glob("*/*/verdict.json"):
        verdict = json.loads(path.read_text())
        found[path.parent.parent.name] = verdict
        timeline = path.parent / "timeline.jsonl"
        if timeline.exists():  # a skip starts nothing: no process, no network, no ssh host
            fs = {json.loads(line)["f"] for line in timeline.read_text().splitlines() if line.strip()}
            assert not fs & {"start", "network", "ssh_hosts", "prepare"}, (path, fs)
    return found


def _hardware_here() -> bool:
    from harness.scenario import capabilities

    return capabilities.have("cuda") or capabilities.have("rdma")


def test_without_an_inventory_every_hardware_scenario_skips_saying_it_needs_one(tmp_path: Path) -> None:
    done, seconds = _run(tmp_path / "runs")
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = _verdicts(tmp_path / "runs")
    assert set(verdicts) == NAMES
    for name, verdict in verdicts.items():
        assert verdict["verdict"] == "skip", (name, verdict)
        assert "needs an inventory with GPU/RDMA hosts" in str(verdict["reason"]), verdict["reason"]
        assert "host a requires accelerator cuda, transport rdma" in str(verdict["reason"])
    assert "3 scenarios: 3 SKIP" in done.stdout
    assert seconds < 60  # the interpreter's start and imports; the skip itself costs nothing


@pytest.fixture
def lab_inventory(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root (mxchaos lab: network namespaces, sshd)")
    if any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen")) or not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs iproute2, openssh-client and openssh-server")
    if _hardware_here():
        pytest.skip("this machine has a GPU or an RDMA device: the lab's hosts (its namespaces) would have them too")
    state, inventory = tmp_path / "lab", tmp_path / "inv.yaml"
    lab.up(2, inventory_out=inventory, state=state)
    try:
        yield inventory
    finally:
        try:
            lab.down(state)
        except HarnessError:
            pass


@pytest.mark.root
def test_on_lab_hosts_every_hardware_scenario_skips_naming_the_host_and_the_lack(tmp_path: Path, lab_inventory: Path) -> None:
    done, _ = _run(tmp_path / "runs", "--inventory", str(lab_inventory))
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = _verdicts(tmp_path / "runs")
    assert set(verdicts) == NAMES
    for name, verdict in verdicts.items():
        reason = str(verdict["reason"])
        assert verdict["verdict"] == "skip", (name, verdict)
        # declared: the lab's machines say cpu and ucx-tcp-any; probed over ssh: neither GPU nor RDMA device
        for host, machine in (("a", "h1"), ("b", "h2")):
            assert f"host {host} (machine {machine}): no cuda: the inventory declares accelerator cpu" in reason, reason
            assert f"host {host} (machine {machine}): no rdma: the inventory declares transport ucx-tcp-any" in reason, reason
        assert "probed: nvidia-smi -L lists no GPU and there is no /dev/nvidia<N>" in reason, reason
        assert "probed: no /sys/class/infiniband device and ibv_devices lists none" in reason, reason
        assert "hardware" in verdict["missing_capabilities"]  # type: ignore[operator]
