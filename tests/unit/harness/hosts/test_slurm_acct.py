"""End states from SLURM's accounting (``harness.hosts.slurm_acct``): ``sacct``'s lines parsed (an
accounting database's and the job completion log's, hostile ones dropped), the completion log asked
where the database is off (as on the lab), and the dispatcher taking accounting's word over the
controller's: a task ``scontrol`` calls COMPLETED that accounting has as NODE_FAIL is the
infrastructure's, its verdict naming the state and where it was read (fake clients)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.hosts import slurm_acct, slurm_array, slurm_dispatch
from harness.hosts.slurm_acct import SOURCE_DB, SOURCE_JOBCOMP, Accounting


def test_sacct_lines_give_each_jobs_state_exit_code_and_node() -> None:
    text = ("30|COMPLETED|0:0|h[1-2]\n31|COMPLETED|0:0|h1\n32|CANCELLED by 0|0:15|h2\n33|NODE_FAIL|1:0|h3\n"
            "34;rm|FAILED|1:0|h1\n35|FAILED|2:0|h1;reboot\n36|running now|0:0|h1\nnot a line\n")
    ends = slurm_acct.parse(text, SOURCE_JOBCOMP)
    assert sorted(ends) == ["30", "31", "32", "33", "35"]  # 34: no job id; 36: no state word
    assert (ends["30"].node, ends["30"].nodes) == ("", "h[1-2]")  # a lane of two nodes: no one node
    assert (ends["31"].state, ends["31"].rc, ends["31"].node) == ("COMPLETED", 0, "h1")
    assert (ends["32"].state, ends["32"].rc) == ("CANCELLED", 0)
    assert ends["33"].as_dict() == {"job": "33", "state": "NODE_FAIL", "rc": 1, "node": "h3", "nodes": "h3",
                                 "source": SOURCE_JOBCOMP}
    assert ends["35"].node == ends["35"].nodes == ""  # a hostile node name never reaches a verdict or --exclude


def _fake(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)


SACCT_NO_DB = """echo "$@" >> {calls}
case "$1" in
  -c) echo "{line}";;
  *) echo "Slurm accounting storage is disabled" >&2; exit 1;;
esac"""


def test_the_completion_log_is_read_where_the_database_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    _fake(tmp_path / "bin", "sacct", SACCT_NO_DB.format(calls=calls, line="41|TIMEOUT|0:0|h2\n42|RUNNING|0:0|h1"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    acct = Accounting(tmp_path / "slurm.conf")
    ends = acct.ended(["41", "42"])
    assert acct.source == SOURCE_JOBCOMP
    assert list(ends) == ["41"] and ends["41"].state == "TIMEOUT"  # 42 has not ended: not an end
    acct.ended(["42"])
    said = calls.read_text().splitlines()
    assert said[0].startswith("-X -P -n -j 41,42") and said[1].startswith("-c -P -n -j 41,42")
    assert said[2].startswith("-c ")  # the source found is kept for the dispatch


def test_an_accounting_database_is_read_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(tmp_path / "bin", "sacct", 'echo "51|OUT_OF_MEMORY|0:125|gpu07"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    acct = Accounting(tmp_path / "slurm.conf")
    assert acct.ended(["51"])["51"].state == "OUT_OF_MEMORY" and acct.source == SOURCE_DB


def test_the_dispatcher_takes_accountings_end_over_the_controllers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    spool = tmp_path / "spool"
    _fake(bin_dir, "scontrol", 'if [ "$1" = ping ]; then echo "Slurmctld(primary) at vm is UP"; else '
          'echo "JobId=78 ArrayJobId=77 ArrayTaskId=0 JobState=COMPLETED Reason=None ExitCode=0:0 BatchHost=h1"; fi')
    _fake(bin_dir, "sbatch", f'echo "sbatch $@" >> {calls}; mkdir -p {spool}/a1/lane-1 {spool}/a2/lane-1; '
          f'echo \'{{"started": 1}}\' > {spool}/a1/lane-1/task.json; cp {spool}/a1/lane-1/task.json {spool}/a2/lane-1/; echo 77')
    _fake(bin_dir, "scancel", "exit 0")
    _fake(bin_dir, "squeue", "exit 0")
    _fake(bin_dir, "sacct", SACCT_NO_DB.format(calls=calls, line="78|NODE_FAIL|0:0|h1"))
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=vm(10.0.0.1)\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    monkeypatch.setattr(slurm_dispatch, "POLL_S", 0.01)
    monkeypatch.setattr(slurm_dispatch, "stop_leftovers", lambda job: [])
    group = slurm_array.Group("lane-1", ("true",), Path(slurm_dispatch.FOLDER))
    (outcome,) = slurm_dispatch.dispatch([group], spool, slurm_dispatch.Options(conf))
    assert outcome.infra == ("SLURM job 78 (task 0) on node h1 ended NODE_FAIL; end state from "
                             "sacct -c (job completion log)")
    assert [e["state"] for e in outcome.ends] == ["NODE_FAIL", "NODE_FAIL"]
    assert {e["source"] for e in outcome.ends} == {SOURCE_JOBCOMP}
    assert "--exclude=h1" in calls.read_text()  # resubmitted once, not on the node accounting named
    json.dumps(outcome.ends)  # the lane's record holds it as it is
