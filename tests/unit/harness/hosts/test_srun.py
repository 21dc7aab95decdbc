"""``reach: srun``: the command prefix a node's steps get, srun's own failures told from the command's
exit code, and the inventory key (a fake ``srun`` here; the real one in
tests/integration/test_slurm_lab.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.hosts import allocation, slurm, srun
from harness.hosts.inventory import InventoryInvalid, parse_inventory
from harness.hosts.ssh import SshHost

CONF = "SlurmctldHost=vm(10.0.0.1)\nSlurmctldPort=6817\n"


def test_the_prefix_is_one_overlapping_task_of_the_job_on_the_node() -> None:
    argv = srun.argv("1234", "gpu07")
    assert argv[0] == "srun" and argv[-2:] == ["/bin/sh", "-c"]
    assert {"--overlap", "--jobid=1234", "--nodes=1", "--ntasks=1"} <= set(argv)
    assert argv[argv.index("-w") + 1] == "gpu07"
    export = next(a for a in argv if a.startswith("--export="))
    assert "MXCHAOS_SSH_RUN_ID" in export and "ALL" not in export and "PYTHONPATH" not in export


@pytest.mark.parametrize("stderr", [
    "srun: error: Unable to confirm allocation for job 99: Invalid job id specified\n"
    "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 99\n",
    "srun: error: Unable to create step for job 12: Requested node configuration is not available\n",
    "srun: fatal: Job 12 not found\n",
    "slurmstepd: error: *** STEP 12.3 ON h2 CANCELLED AT 2026-12-07T00:10:00 ***\n"
    "srun: error: h2: task 0: Killed\n",
])
def test_sruns_own_failures_are_told(stderr: str) -> None:
    why = srun.failure(1, stderr)
    assert why is not None and "task 0: Killed" not in why


@pytest.mark.parametrize(("rc", "stderr"), [
    (3, "srun: error: h2: task 0: Exited with exit code 3\n"),
    (137, "srun: error: h2: task 0: Killed\n"),
    (1, "Traceback (most recent call last):\nsrun: error is what the command printed, not a line of srun's\n"),
    (2, ""),
    (0, "srun: error: something that did not stop the command\n"),
])
def test_the_commands_own_exit_is_not_sruns_failure(rc: int, stderr: str) -> None:
    assert srun.failure(rc, stderr) is None


FAKE_SRUN = """#!/bin/sh
for a in "$@"; do case "$a" in --jobid=999) echo "srun: error: Unable to confirm allocation for job 999: Invalid job id specified" >&2; exit 1;; esac; done
for line; do :; done
sh -c "$line"; rc=$?
[ $rc -ne 0 ] && echo "srun: error: n2: task 0: Exited with exit code $rc" >&2
exit $rc
"""


@pytest.fixture
def fake_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "srun"
    script.write_text(FAKE_SRUN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return tmp_path


def _host(tmp_path: Path, job: str) -> SshHost:
    text = (f"machines:\n  n2: {{address: 10.9.0.2, port: 9, reach: srun, srun: {{job: '{job}', node: n2, "
            f"conf: {tmp_path / 'slurm.conf'}}}}}\n")
    inv = parse_inventory(text)
    return SshHost("a", "n2", inv.machines["n2"], "run-x", tmp_path / "run")


def test_an_srun_host_runs_its_commands_as_steps_and_tells_sruns_failure(fake_srun: Path) -> None:
    host = _host(fake_srun, "7")
    assert host.ssh_argv() == srun.argv("7", "n2")
    assert host.local_env["SLURM_CONF"] == str(fake_srun / "slurm.conf")
    assert host.describe()["srun"] == "job 7 node n2" and "ssh" not in host.describe()
    done = host.run_remote("echo hi; exit 3", timeout=10)
    assert (done.rc, done.stdout.strip(), host.lost) == (3, "hi", None)  # the command's exit: the host answers
    gone = _host(fake_srun, "999")
    done = gone.run_remote("true", timeout=10)
    assert done.rc == 255 and gone.lost is not None
    assert "srun host a (node n2 of SLURM job 999)" in gone.lost and "Invalid job id specified" in gone.lost
    gone.close_master()  # no control master to end: nothing run


def test_reach_srun_needs_a_job_and_a_slurm_inventory_gives_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InventoryInvalid, match=r"machines\.n2.*reach: srun runs commands as steps of a SLURM job"):
        parse_inventory("machines:\n  n2: {address: 10.9.0.2, reach: srun}\n")
    with pytest.raises(InventoryInvalid, match=r"reach"):
        parse_inventory("machines:\n  n2: {address: 10.9.0.2, reach: telnet}\n")
    (tmp_path / "slurm.conf").write_text(CONF)
    monkeypatch.setattr(slurm, "ping", lambda conf: "UP")
    monkeypatch.setattr(slurm, "job", lambda jid, conf: slurm.Job("7", "RUNNING", None, "n[2-3]", ("n2", "n3")))
    monkeypatch.setattr(slurm, "nodes", lambda names, conf: {"n2": "10.9.0.2", "n3": "10.9.0.3"})
    (tmp_path / "alloc.yaml").write_text(f"slurm: {{job: 7, conf: {tmp_path / 'slurm.conf'}, nodes: {{n3: {{reach: srun}}}}}}\n")
    inv = allocation.open_inventory(tmp_path / "alloc.yaml")
    assert inv.machines["n2"].reach == "ssh" and inv.machines["n2"].srun is None
    place = inv.machines["n3"].srun
    assert place is not None and (place.job, place.node, place.conf) == ("7", "n3", tmp_path / "slurm.conf")
    (tmp_path / "all.yaml").write_text(f"defaults: {{reach: srun}}\nslurm: {{job: 7, conf: {tmp_path / 'slurm.conf'}}}\n")
    assert {m.srun.node for m in allocation.open_inventory(tmp_path / "all.yaml").machines.values() if m.srun} == {"n2", "n3"}
    # slurm+srun:FILE: the file's allocation, every node through srun whatever the file says (n2 says ssh)
    (tmp_path / "ssh.yaml").write_text(f"defaults: {{port: 9}}\nslurm: {{job: 7, conf: {tmp_path / 'slurm.conf'}, "
                                       "nodes: {n2: {reach: ssh, data: {address: 10.8.0.2, device: eth1}}}}\n")
    forced = allocation.open_inventory(f"slurm+srun:{tmp_path / 'ssh.yaml'}")
    assert {n: (m.reach, m.srun.node if m.srun else None) for n, m in forced.machines.items()} == {
        "n2": ("srun", "n2"), "n3": ("srun", "n3")}
    assert (forced.machines["n2"].data.device, forced.machines["n2"].port) == ("eth1", 9)  # the file's own keys kept
    assert allocation.open_inventory(tmp_path / "ssh.yaml").machines["n2"].reach == "ssh"  # as written, without it
    (tmp_path / "plain.yaml").write_text("machines:\n  a: {address: 10.0.0.1}\n")
    with pytest.raises(InventoryInvalid, match=r"slurm\+srun:FILE is for an inventory of a SLURM allocation"):
        allocation.open_inventory(f"slurm+srun:{tmp_path / 'plain.yaml'}")


def test_a_slurm_file_may_not_name_the_step_itself(tmp_path: Path) -> None:
    (tmp_path / "alloc.yaml").write_text("slurm: {job: 7, nodes: {n3: {reach: srun, srun: {job: '8', node: n9}}}}\n")
    with pytest.raises(InventoryInvalid, match=r"slurm\.nodes.*nor srun: SLURM gives them"):
        allocation.open_inventory(tmp_path / "alloc.yaml")
