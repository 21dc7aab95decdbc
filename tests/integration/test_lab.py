"""``mxchaos lab up`` / ``lab down`` with real namespaces and a real OpenSSH sshd per host:
the hosts answer ssh with strict host-key checking on their management address, reach each
other on the data network, and ``lab down`` leaves no namespace, link, sshd or key behind.
Hostile state: ``lab down`` follows no symlinked lab folder and kills no sshd it did not record;
copies of a run's secrets pushed to an ssh host are 0600 there, and ``cleanup --inventory``
removes only the per-run folders the harness made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.commands import cleanup
from harness.errors import HarnessError
from harness.hosts import lab, ssh_sweep
from harness.hosts.inventory import Inventory, Machine, load_inventory
from harness.hosts.ssh import SshHost
from harness.machine.statedir import StateDirError
from mxref import pki

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


# ---------------------------------------------------------------------------- hostile state (harness.machine.statedir)


def test_down_refuses_a_symlinked_lab_folder_and_touches_nothing_behind_it(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    state.symlink_to(victim)  # `lab down` used to resolve it and rmtree the target
    with pytest.raises(StateDirError, match="symbolic link"):
        lab.down(state)
    assert (victim / "precious").read_text() == "keep me\n"
    assert state.is_symlink()


def test_down_kills_only_the_sshd_it_recorded(state: Path) -> None:
    state.mkdir(mode=0o700)
    # a process that looks like a lab sshd (named sshd, a path under the lab's folder in its
    # command line) but that the lab never started: `lab down` used to SIGKILL it
    bystander = subprocess.Popen(["bash", "-c", f"exec -a {state}/sshd sleep 300"])
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{bystander.pid}/cmdline").read_bytes().startswith(f"{state}/sshd".encode()):
            assert time.monotonic() < deadline, "bash did not exec within 10s"
            time.sleep(0.02)
        lab.down(state)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(10)


def _crashed_ssh_run(state: Path, tmp_path: Path, run_id: str) -> tuple[Inventory, SshHost, pki.RunCredentials]:
    """A lab of one host, and an ssh run on it whose harness "crashed" after opening the host (its
    per-run folder stays there): the host, and the run's credentials (TLS key, token)."""
    old_umask = os.umask(0o022)  # the lab's sshd (and so every remote command) inherits it: files 0644 by default
    try:
        lab.up(1, inventory_out=tmp_path / "inv.yaml", state=state)
    finally:
        os.umask(old_umask)
    inventory = load_inventory(tmp_path / "inv.yaml")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    creds = pki.generate(run_dir, tls=True, token=True)
    host = SshHost("h1", "h1", inventory.machines["h1"], run_id, run_dir)
    host.open()
    return inventory, host, creds


def test_pushed_secrets_are_0600_on_the_host(state: Path, tmp_path: Path) -> None:
    _inventory, host, creds = _crashed_ssh_run(state, tmp_path, "pushed-20260101T000000-a1b2c3")
    modes = {}
    try:
        for local in (creds.token, creds.server_key):
            assert local is not None
            remote = host._push(str(local))
            modes[local.name] = host.run_remote(f"stat -c %a {remote} $(dirname {remote})", timeout=15).stdout.split()
    finally:
        host.close()
    assert modes == {"token": ["600", "700"], "server.key": ["600", "700"]}


def test_inventory_cleanup_removes_only_the_run_folders_it_made(state: Path, tmp_path: Path) -> None:
    run_id = "crashed-20260101T000000-a1b2c3"
    inventory, host, _creds = _crashed_ssh_run(state, tmp_path, run_id)
    host.shell.close()  # the harness "crashes": its per-run folder stays on the host
    host.close_master()
    machine = inventory.machines["h1"]
    work = Path(machine.work_dir)  # the lab's hosts share this machine's file system
    ours = work / run_id
    assert ours.is_dir()
    planted = []
    for name in ("copied-20260101T000000-000001", "forged-20260101T000000-000002"):
        planted.append(work / name)
        (work / name).mkdir()
        (work / name / "precious").write_text("keep me\n")
        (work / name / ".mxchaos-run").write_text(f"{name}\n")  # a marker that names it, but not one we wrote
    os.chown(work / "forged-20260101T000000-000002", 65534, 65534)
    os.chown(work / "forged-20260101T000000-000002" / ".mxchaos-run", 65534, 65534)
    (work / "copied-20260101T000000-000001" / ".mxchaos-run").unlink()  # run-looking, no marker at all
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    (work / "linked-20260101T000000-000003").symlink_to(victim)

    # one run id at a time (as `cleanup --inventory --run-id`): the lab's hosts share this machine's
    # processes, and a sweep of every dead run would also reach other harnesses' leftovers here
    for folder in [*planted, work / "linked-20260101T000000-000003"]:
        swept = ssh_sweep.sweep_inventory(inventory, run_id=folder.name)
        assert [(m.error, m.removed) for m in swept] == [(None, [])]
    swept = ssh_sweep.sweep_inventory(inventory, run_id=run_id)
    assert [(m.error, m.removed) for m in swept] == [(None, [f"remove {machine.work_dir}/{run_id}"])]
    assert not ours.exists()
    assert all((folder / "precious").exists() for folder in planted)
    assert (victim / "precious").exists() and (work / "linked-20260101T000000-000003").is_symlink()
