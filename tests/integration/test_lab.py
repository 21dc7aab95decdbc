"""``mxchaos lab up`` / ``lab down`` with real namespaces and a real OpenSSH sshd per host:
the hosts answer ssh with strict host-key checking on their management address, reach each
other on the data network, and ``lab down`` leaves no namespace, link, sshd or key behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import cleanup, lab
from harness.errors import HarnessError
from harness.inventory import Machine, load_inventory

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen")) or not Path("/usr/sbin/sshd").exists(),
                       reason="needs iproute2, openssh-client and openssh-server"),
]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "lab"
    yield folder
    try:
        lab.down(folder)  # whatever a failed test left
    except HarnessError:
        pass


def _ssh(inv_machine: Machine, command: str) -> subprocess.CompletedProcess[str]:
    assert inv_machine.identity_file is not None and inv_machine.known_hosts.file is not None
    argv = ["ssh", "-i", str(inv_machine.identity_file), "-o", f"UserKnownHostsFile={inv_machine.known_hosts.file}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            inv_machine.target, command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_lab_up_serves_ssh_and_down_leaves_nothing(state: Path, tmp_path: Path) -> None:
    inventory_path = tmp_path / "inv.yaml"
    info = lab.up(2, inventory_out=inventory_path, state=state)
    assert info["status"] == "up" and set(info["hosts"]) == {"h1", "h2"}
    inv = load_inventory(inventory_path)  # what lab up writes is a valid inventory
    h1, h2 = inv.machines["h1"], inv.machines["h2"]
    assert h1.data.device == "cable0" and h1.data_address != h1.address

    done = _ssh(h1, "ip -br addr show dev data0; cat /proc/self/net/dev >/dev/null; hostname >/dev/null; echo ok")
    assert done.returncode == 0, done.stderr
    assert h1.data_address in done.stdout and done.stdout.strip().endswith("ok")
    # the data network joins the hosts: a closed port on h1's data address refuses at once
    # (bash's /dev/tcp: no extra tools needed); an unreachable one would time out instead
    reach = _ssh(h2, f"timeout 3 bash -c 'exec 3<>/dev/tcp/{h1.data_address}/9'; echo rc=$?")
    assert "Connection refused" in reach.stderr and "rc=1" in reach.stdout, (reach.stdout, reach.stderr)

    with pytest.raises(HarnessError, match="already up"):
        lab.up(1, state=state)

    removed = lab.down(state)
    assert any(x.startswith("netns ") for x in removed)
    assert lab.leftovers(state) == []
    assert not state.exists()  # keys gone with it
    assert lab.down(state) == []  # idempotent


def test_a_lab_whose_builder_died_is_abandoned_and_cleanup_removes_it(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path))  # lab_dir() is now `state`
    assert lab.lab_dir() == state
    lab.up(1, state=state)
    info = lab.status(state)
    assert info is not None and not lab.abandoned(state)
    info.update(status="building", builder_pid=2**22 + 7, builder_start=1)  # a builder that is gone
    (state / "lab.json").write_text(json.dumps(info))
    assert lab.abandoned(state)
    report = cleanup.sweep(run_id="no-such-run")
    assert any(x.startswith("netns ") for x in report.network["abandoned lab"])
    assert lab.leftovers(state) == []


def test_down_finds_a_lab_whose_record_is_lost(state: Path) -> None:
    lab.up(1, state=state)
    (state / "lab.json").unlink()  # by the names and link aliases derived from the state dir
    lab.down(state)
    assert lab.leftovers(state) == []
