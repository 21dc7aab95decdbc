"""``mxchaos cleanup`` and a dead dispatcher's node-local lane folders (harness.hosts.slurm_leftover).

Fakes of SLURM's clients only: ``scancel`` / ``squeue`` answer that the jobs are gone, and ``srun -w NODE``
runs its command here as that node would (``SLURMD_NODENAME``), so the real ``slurm_task --pack`` /
``--remove`` children stream and remove real folders."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.hosts import slurm_array, slurm_leftover, slurm_task

FAKE_SRUN = """#!{python}
import os, sys
args = sys.argv[1:]
node = next(a.split("=", 1)[1] for a in args if a.startswith("--nodelist="))
with open(os.environ["FAKE_SRUN_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
if node in os.environ.get("FAKE_SRUN_BUSY", "").split(","):
    sys.stderr.write("srun: error: Unable to allocate resources: Requested nodes are busy\\n")
    sys.exit(1)
at = args.index("-m") - 1
os.execve(args[at], args[at:], {{**os.environ, "SLURMD_NODENAME": node}})
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "scancel").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")  # nothing of the name pending or running
    # the array still listed: task 2 ran on h3, which the dead dispatcher never recorded
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'JobId=10 ArrayJobId=8 ArrayTaskId=2 JobState=RUNNING "
                                      "ExitCode=0:0 NodeList=h3 BatchHost=h3'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.log"))
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "slurm.conf").write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    monkeypatch.chdir(Path(__file__).resolve().parents[4])  # the steps run `python -m harness...` from the checkout
    return tmp_path


def _lane(root: Path, node: str, lane: str) -> Path:
    folder = root / node / "nightly-0badc0de" / "a1" / lane
    (folder / "runs").mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps({"node": node}))
    (folder / "runs" / "verdict.json").write_text('{"verdict": "pass"}')
    (folder / slurm_task.DONE).write_text("{}")
    return folder


def test_cleanup_takes_back_and_removes_a_dead_dispatchers_node_local_lane_folders(fake_slurm: Path) -> None:
    nodes_root, spool = fake_slurm / "nodes", fake_slurm / "night" / "slurm"
    spool.mkdir(parents=True)
    _lane(nodes_root, "h1", "lane-1")
    _lane(nodes_root, "h2", "lane-2")
    (nodes_root / "h1" / "nightly-0badc0de" / "a1" / "lane-1" / "link").symlink_to("/etc/passwd")  # never followed out
    slurm_array._write_record("0badc0de", {
        "name": "mxchaos-nightly-0badc0de", "conf": str(fake_slurm / "slurm.conf"), "arrays": ["8"],
        "spool": str(spool), "pid": 2**22 + 7, "start": 1,  # a dispatcher that is gone
        "local": f"{nodes_root}/{{node}}/nightly-0badc0de", "local_nodes": ["h1", "h2"]})

    planned = slurm_array.sweep_dead(dry_run=True)
    assert planned[0].startswith("would cancel the SLURM jobs named mxchaos-nightly-0badc0de")
    assert planned[1:] == [f"would take {nodes_root}/{n}/nightly-0badc0de from node {n} (mxchaos-nightly-0badc0de) "
                           "and remove it there" for n in ("h1", "h2", "h3")]
    assert (nodes_root / "h1" / "nightly-0badc0de").is_dir()  # a dry run touches nothing

    said = slurm_array.sweep_dead()
    assert said[0] == "cancelled the SLURM jobs named mxchaos-nightly-0badc0de"
    for n in ("h1", "h2"):
        line = next(x for x in said if f"from node {n} " in x)
        assert line.startswith(f"took {nodes_root}/{n}/nightly-0badc0de from node {n} into {spool / 'left' / n} (")
        assert line.endswith("bytes) and removed it there" + (
            "; not taken (a link out of it, or no plain file): ./a1/lane-1/link" if n == "h1" else "")), line
        assert not (nodes_root / n / "nightly-0badc0de").exists()  # gone from the node
    # h3 from SLURM's listing of the array: swept too (nothing there)
    assert f"nothing left of mxchaos-nightly-0badc0de on node h3 ({nodes_root}/h3/nightly-0badc0de)" in said
    taken = spool / "left" / "h2" / "a1" / "lane-2"
    assert (taken / "runs" / "verdict.json").read_text() == '{"verdict": "pass"}'
    assert (taken / "task.json").read_text() == '{"node": "h2"}'
    assert not (spool / "left" / "h1" / "a1" / "lane-1" / "link").exists()  # tarfile's data filter: no link out
    assert slurm_array.records() == {}  # swept: a second cleanup has nothing of it
    assert slurm_array.sweep_dead() == []
    steps = (fake_slurm / "srun.log").read_text().splitlines()
    assert all(f"--immediate={slurm_leftover.IMMEDIATE_S}" in s and "--job-name=mxchaos-nightly-0badc0de-sweep" in s
               for s in steps)
    assert sum("--remove" in s for s in steps) == 2  # only where something was taken


def test_a_node_not_free_keeps_its_folder_and_says_so(fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes_root, spool = fake_slurm / "nodes", fake_slurm / "night" / "slurm"
    spool.mkdir(parents=True)
    _lane(nodes_root, "h2", "lane-2")
    monkeypatch.setenv("FAKE_SRUN_BUSY", "h2")
    record = {"name": "mxchaos-matrix-0badc0de", "spool": str(spool),
              "local": f"{nodes_root}/{{node}}/nightly-0badc0de", "local_nodes": ["h2"]}
    (line,) = slurm_leftover.sweep_node_local(record, fake_slurm / "slurm.conf")
    assert line.startswith(f"left {nodes_root}/h2/nightly-0badc0de on node h2 (mxchaos-matrix-0badc0de): could not "
                           "take it (srun exited 1: srun: error: Unable to allocate resources"), line
    assert (nodes_root / "h2" / "nightly-0badc0de" / "a1" / "lane-2" / "task.json").exists()  # kept, not lost


@pytest.mark.parametrize("root", ["/tmp/x/{node}/../../etc", "relative/{node}/nightly-0badc0de", "/tmp/{node}/x",
                                  "/tmp/nodes/nightly-0badc0de"])
def test_a_record_whose_root_is_not_ours_takes_and_removes_nothing(fake_slurm: Path, root: str) -> None:
    record = {"name": "mxchaos-nightly-0badc0de", "spool": str(fake_slurm), "local": root, "local_nodes": ["h1"]}
    (line,) = slurm_leftover.sweep_node_local(record, fake_slurm / "slurm.conf")
    assert "names no node-local root of ours" in line
    assert not (fake_slurm / "srun.log").exists()  # no step was run


def test_a_hostile_node_name_is_never_put_on_a_command_line(fake_slurm: Path) -> None:
    record = {"name": "mxchaos-nightly-0badc0de", "spool": str(fake_slurm),
              "local": f"{fake_slurm}/{{node}}/nightly-0badc0de", "local_nodes": ["h1;rm -rf /"]}
    (line,) = slurm_leftover.sweep_node_local(record, fake_slurm / "slurm.conf")
    assert line.startswith("not swept on a node of mxchaos-nightly-0badc0de") and "is not a host name" in line
    assert not (fake_slurm / "srun.log").exists()


def test_the_dispatch_records_its_node_local_root_and_the_nodes_its_tasks_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    group = slurm_array.Group("lane-1", ("true",), tmp_path / "a1" / "lane-1")
    d = slurm_array.Dispatch([group], tmp_path / "spool", tmp_path / "slurm.conf", label="nightly", embed=True,
                             local="/scratch/{node}/nightly-0badc0de")
    d._record()
    assert slurm_array.records()[d.token]["local_nodes"] == []
    answers = {"7": "JobId=9 ArrayJobId=7 ArrayTaskId=0 JobState=RUNNING ExitCode=0:0 NodeList=h2 BatchHost=h2"}

    class Done:
        returncode = 0

        def __init__(self, stdout: str) -> None:
            self.stdout = stdout

    monkeypatch.setattr(slurm_array, "_call", lambda argv, conf, timeout=0: Done(answers.get(argv[-1], "")))
    d.array_of = {0: "7"}
    d.arrays = ["7"]
    d.poll()
    record = slurm_array.records()[d.token]
    assert (record["local"], record["local_nodes"]) == ("/scratch/{node}/nightly-0badc0de", ["h2"])
