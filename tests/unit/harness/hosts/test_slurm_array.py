"""A SLURM job array as the dispatcher reads it (``harness.hosts.slurm_array``): every SLURM end state
mapped to the tests' own end (DONE) or the infrastructure's (INFRA), the records ``scontrol -o show job``
prints for an array (a pending range, each started task on its own line) parsed; an array task running
its group from the manifest (``harness.hosts.slurm_task``, a real child); a lane that SLURM ended twice
making its scenarios' cells ``environment broken`` naming job, node and state, exit 4
(``harness.nightly.slurm``, its dispatch faked)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.exits import EXIT_ENV_BROKEN
from harness.hosts import slurm_array, slurm_dispatch, slurm_task
from harness.hosts.slurm import SlurmError
from harness.hosts.slurm_array import DONE, INFRA, PENDING, RUNNING
from harness.machine import procscan
from harness.nightly import slurm as night_slurm
from harness.nightly.run import ENV_BROKEN_CELL, NightSpec, run_night
from harness.scenario import load_scenario
from harness.scenario.placement import LanePlacement, spread

# what `scontrol -o show job 13` printed on the lab (SLURM 22.05.8) for a 3-task array, one task started,
# the rest pending (shortened: the keys the dispatcher reads, and a few it must skip)
ARRAY = """\
JobId=13 ArrayJobId=13 ArrayTaskId=2 JobName=mxchaos-nightly-325b730c UserId=root(0) JobState=NODE_FAIL Reason=NodeDown Dependency=(null) ExitCode=0:0 NodeList=h2 BatchHost=h2 Command=(null)
JobId=14 ArrayJobId=13 ArrayTaskId=0 JobName=mxchaos-nightly-325b730c UserId=root(0) JobState=COMPLETED Reason=None ExitCode=1:0 NodeList=h1 BatchHost=h1
JobId=13 ArrayJobId=13 ArrayTaskId=3-4,6%2 JobName=mxchaos-nightly-325b730c UserId=root(0) JobState=PENDING Reason=Resources ExitCode=0:0 NodeList=(null)
JobId=15 ArrayJobId=13 ArrayTaskId=1 JobName=mxchaos-nightly-325b730c UserId=root(0) JobState=RUNNING Reason=None ExitCode=0:0 NodeList=h3 BatchHost=h3
"""


@pytest.mark.parametrize(("state", "by_us", "expected"), [
    ("COMPLETED", False, DONE), ("FAILED", False, DONE), ("TIMEOUT", False, INFRA), ("NODE_FAIL", False, INFRA),
    ("PREEMPTED", False, INFRA), ("BOOT_FAIL", False, INFRA), ("OUT_OF_MEMORY", False, INFRA), ("DEADLINE", False, INFRA),
    ("CANCELLED", False, INFRA), ("CANCELLED+", False, INFRA), ("CANCELLED", True, DONE), ("PENDING", False, PENDING),
    ("REQUEUED", False, PENDING), ("SUSPENDED", False, PENDING), ("RUNNING", False, RUNNING),
    ("COMPLETING", False, RUNNING), ("CONFIGURING", False, RUNNING),
])
def test_every_slurm_state_is_the_tests_end_the_infrastructures_or_still_going(state: str, by_us: bool, expected: str) -> None:
    assert slurm_array.state_of(state, cancelled_by_us=by_us) == expected


def test_an_arrays_records_give_each_tasks_job_node_state_and_exit_code() -> None:
    tasks = slurm_array.parse_tasks(ARRAY)
    assert sorted(tasks) == [0, 1, 2, 3, 4, 6]
    assert (tasks[0].job, tasks[0].state, tasks[0].node, tasks[0].rc) == ("14", DONE, "h1", 1)
    assert (tasks[1].state, tasks[1].node) == (RUNNING, "h3")
    assert (tasks[2].job, tasks[2].state, tasks[2].slurm_state) == ("13", INFRA, "NODE_FAIL")
    assert tasks[2].describe() == "SLURM job 13 (task 2) on node h2 ended NODE_FAIL (NodeDown)"
    assert all(tasks[i].state == PENDING and tasks[i].job == f"13_{i}" and tasks[i].node == "" for i in (3, 4, 6))


def test_a_hostile_node_name_from_slurm_is_not_kept() -> None:
    tasks = slurm_array.parse_tasks(ARRAY.replace("BatchHost=h1", "BatchHost=h1;rm${IFS}-rf"))
    assert tasks[0].node == ""


def test_lanes_for_a_cluster_give_each_lone_scenario_a_node_of_its_own() -> None:
    placements = [LanePlacement(n, n == "d", "declared" if n == "d" else "") for n in "abcde"]
    assert spread(placements, 3) == [("lane-1", ("a", "c")), ("lane-2", ("b", "e")), ("alone-d", ("d",))]
    assert spread(placements, 1) == [("lane-1", ("a", "b", "c", "e")), ("alone-d", ("d",))]


def test_a_task_runs_its_group_from_the_manifest_and_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "lane-1"
    manifest = tmp_path / "groups.json"
    script = "import os, sys; open(sys.argv[1], 'w').write(os.environ['LANE_AXIS']); sys.exit(7)"
    manifest.write_text(json.dumps([{"name": "lane-1", "argv": [sys.executable, "-c", script, str(folder / "ran")],
                                     "folder": str(folder), "env": {"LANE_AXIS": "nixl-1.5"}, "cwd": str(tmp_path)}]))
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert slurm_task.main([str(manifest)]) == 7  # the run's own exit code
    assert (folder / "ran").read_text() == "nixl-1.5"
    said = json.loads((folder / "task.json").read_text())
    assert said["job"] == "42" and said["index"] == 0 and said["started"] > 0
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")  # no such group: the task says so, no run
    assert slurm_task.main([str(manifest)]) == slurm_task.EXIT_BAD_TASK


SCENARIO = """\
name: {name}
description: one server
seed: 3
processes:
  server: {{role: server}}
steps:
  - start: server
checks:
  - nothing_leaked: {{}}
"""


def test_a_lane_slurm_ended_twice_is_an_environment_verdict_naming_job_node_and_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sc").mkdir()
    scenarios = []
    for name in ("lost_a", "lost_b"):
        (tmp_path / "sc" / f"{name}.yaml").write_text(SCENARIO.format(name=name))
        scenarios.append(load_scenario(tmp_path / "sc" / f"{name}.yaml"))
    why = "SLURM job 21 (task 0) on node h2 ended NODE_FAIL (NodeDown)"

    def fake_dispatch(groups, spool, options, log, folder_for=None):  # type: ignore[no-untyped-def]
        return [slurm_dispatch.Outcome(g, spool / "a2" / g.name, infra=why, node="h2", job="21",
                                       attempts=["SLURM job 20 ... NODE_FAIL", why]) for g in groups]

    monkeypatch.setattr(night_slurm, "dispatch", fake_dispatch)
    monkeypatch.setattr(night_slurm, "partition_nodes", lambda conf, partition: 1)
    record: dict[str, object] = {}
    binding = night_slurm.SlurmBinding(slurm_dispatch.Options(tmp_path / "slurm.conf"), record=record)
    outcome = run_night(NightSpec(scenarios=scenarios, out=tmp_path / "nights"), binding)
    assert outcome.exit_code == EXIT_ENV_BROKEN
    assert {c.scenario: c.name for c in outcome.cells} == {"lost_a": ENV_BROKEN_CELL, "lost_b": ENV_BROKEN_CELL}
    assert all(c.note == f"environment broken: {why}" for c in outcome.cells)
    assert record["slurm"]["lanes"][0]["infra"] == why  # type: ignore[index]
    assert os.path.isfile(outcome.night_dir / "nightly.json")


def test_cleanup_forgets_a_dead_dispatchers_record_whose_cluster_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    slurm_array._write_record("0badc0de", {"name": "mxchaos-nightly-0badc0de", "conf": str(tmp_path / "gone.conf"),
                                           "arrays": ["8"], "pid": 2**22 + 7, "start": 1})
    slurm_array._write_record("live0001", {"name": "mxchaos-nightly-live0001", "conf": str(tmp_path / "gone.conf"),
                                           "arrays": ["9"], "pid": os.getpid(),
                                           "start": procscan.proc_start_time(os.getpid())})
    assert slurm_array.sweep_dead(dry_run=True) == [
        f"would remove the record of mxchaos-nightly-0badc0de (its SLURM configuration {tmp_path / 'gone.conf'} is gone: "
        "nothing to cancel)"]
    assert len(slurm_array.sweep_dead()) == 1
    assert sorted(slurm_array.records()) == ["live0001"]  # a live dispatcher's record is never touched


def _fake_client(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_an_array_sbatch_refuses_is_an_error_naming_why_and_leaves_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _fake_client(bin_dir, "scontrol", 'echo "Slurmctld(primary) at vm is UP"')
    _fake_client(bin_dir, "sbatch", f'echo "$@" >> {calls}; '
                 'echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2; exit 1')
    _fake_client(bin_dir, "scancel", f'echo "scancel $@" >> {calls}')
    _fake_client(bin_dir, "squeue", "exit 0")
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=vm(10.0.0.1)\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    group = slurm_array.Group("lane-1", ("true",), Path(slurm_dispatch.FOLDER))
    with pytest.raises(SlurmError, match="Invalid partition name"):
        slurm_dispatch.dispatch([group], tmp_path / "spool", slurm_dispatch.Options(conf, partition="nope"))
    said = calls.read_text()
    assert "--partition=nope" in said and "--no-requeue" in said and "--exclusive" in said and "--array=0" in said
    assert "scancel --name mxchaos-run-" in said  # sbatch may fail yet queue: what carries the name is cancelled
    assert slurm_array.records() == {}


def test_a_task_slurm_stops_listing_is_resubmitted_once_then_the_infrastructures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _fake_client(bin_dir, "scontrol", 'if [ "$1" = ping ]; then echo "Slurmctld(primary) at vm is UP"; fi')
    _fake_client(bin_dir, "sbatch", f'echo "$@" >> {calls}; echo 77')
    _fake_client(bin_dir, "scancel", "exit 0")
    _fake_client(bin_dir, "squeue", "exit 0")
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=vm(10.0.0.1)\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    monkeypatch.setattr(slurm_dispatch, "UNLISTED_S", 0.0)
    monkeypatch.setattr(slurm_dispatch, "POLL_S", 0.01)
    group = slurm_array.Group("lane-1", ("true",), Path(slurm_dispatch.FOLDER))
    (outcome,) = slurm_dispatch.dispatch([group], tmp_path / "spool", slurm_dispatch.Options(conf))
    assert outcome.infra is not None and "NOT_LISTED" in outcome.infra and "scontrol lists no such task" in outcome.infra
    assert len(outcome.attempts) == 2 and outcome.folder == tmp_path / "spool" / "a2" / "lane-1"
    assert len(calls.read_text().splitlines()) == 2  # submitted, then resubmitted once
    assert slurm_array.records() == {}


def test_several_nodes_per_lane_bind_the_lanes_run_to_its_allocation_and_fewer_lanes_fit() -> None:
    argv = ("python", "-m", "harness.cli", "run", "--repeat", "2", "--out", slurm_dispatch.FOLDER, "a.yaml")
    one = slurm_dispatch.Options(Path("slurm.conf"))
    assert one.lane_argv(argv) == argv and one.lane_slots(3) == 3
    two = slurm_dispatch.Options(Path("slurm.conf"), nodes_per_lane=2, lane_inventory="/lab/slurm-inventory.yaml")
    assert two.lane_argv(argv) == ("python", "-m", "harness.cli", "run", "--inventory", "/lab/slurm-inventory.yaml",
                                   "--repeat", "2", "--out", slurm_dispatch.FOLDER, "a.yaml")
    assert slurm_dispatch.Options(Path("c"), nodes_per_lane=2).lane_argv(argv)[4:6] == ("--inventory", "slurm:")
    srun_lanes = slurm_dispatch.Options(Path("c"), nodes_per_lane=2, reach="srun")
    assert srun_lanes.lane_argv(argv)[4:6] == ("--inventory", "slurm+srun:")  # the lane's nodes through srun steps
    srun_file = slurm_dispatch.Options(Path("c"), nodes_per_lane=2, reach="srun", lane_inventory="/lab/inv.yaml")
    assert srun_file.lane_argv(argv)[4:6] == ("--inventory", "slurm+srun:/lab/inv.yaml")
    assert [two.lane_slots(n) for n in (1, 3, 4, 64)] == [1, 1, 2, 32]
    (task,) = slurm_array.parse_tasks("JobId=9 ArrayJobId=9 ArrayTaskId=0 JobState=RUNNING ExitCode=0:0 "
                                      "NodeList=h[1-2] BatchHost=h1").values()
    assert (task.node, task.nodelist) == ("h1", "h[1-2]")


def test_a_node_local_task_holds_its_folder_until_a_gathering_step_streamed_it_and_said_taken(tmp_path: Path) -> None:
    import io
    import subprocess
    import tarfile
    import time

    template = str(tmp_path / "nodes" / "{node}" / "lane-1")
    script = "import sys; open(sys.argv[1] + '/run.txt', 'w').write('ran'); print('to task.out'); sys.exit(5)"
    manifest = json.dumps([{"name": "lane-1", "argv": [sys.executable, "-c", script, template], "folder": template,
                            "local": True, "env": {}, "cwd": str(tmp_path)}])
    env = {**os.environ, "SLURMD_NODENAME": "h9", "SLURM_ARRAY_TASK_ID": "0"}
    task = subprocess.Popen([sys.executable, "-m", "harness.hosts.slurm_task", "-"], stdin=subprocess.PIPE, env=env)
    try:
        assert task.stdin is not None
        task.stdin.write(manifest.encode())  # "-": the here-document of the batch script
        task.stdin.close()
        step = subprocess.run([sys.executable, "-m", "harness.hosts.slurm_task", "--gather", template, "30"],
                              capture_output=True, timeout=60, env=env, check=True)
        with tarfile.open(fileobj=io.BytesIO(step.stdout), mode="r|") as tar:
            names = {m.name for m in tar}
        assert {"./run.txt", "./task.json", "./task.out", "./task.done"} <= names
        time.sleep(0.5)
        assert task.poll() is None  # the task holds its node until its folder is taken
        subprocess.run([sys.executable, "-m", "harness.hosts.slurm_task", "--taken", template], timeout=60, env=env,
                       check=True)
        assert task.wait(30) == 5  # its run's code
        assert not (tmp_path / "nodes" / "h9" / "lane-1").exists()  # its copy gone once taken
    finally:
        if task.poll() is None:
            task.kill()
            task.wait(10)


def test_reach_srun_is_refused_for_lanes_of_one_node() -> None:
    """``--reach srun`` says how a several-node lane's own allocation is reached: with one node per lane
    (its hosts are namespaces there, nothing is reached) it is a usage error naming the rule."""
    import argparse

    from harness.commands.slurmopts import slurm_options

    args = argparse.Namespace(reach="srun", partition=None, time=None, allocation_timeout=600.0, node_local=None,
                              nodes_per_lane=1, lane_inventory=None)
    with pytest.raises(SystemExit) as exc:
        slurm_options(args, "nightly")
    assert exc.value.code == 2
