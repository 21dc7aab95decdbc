"""A global ``mxchaos cleanup`` kills only what is ours and dead (issue 36 item 2), run as the real command
from a state directory of its own, against real processes:

- an unprivileged process (``nobody``, through ``setpriv``) carrying a live run's ``MXCHAOS_RUN_ID``
  and a dead harness's pid is no evidence: the live run and that process both survive (on the
  parent commit the whole live run was killed and its ledger entry removed);
- a process of ours whose run id is malformed is skipped and named; cleanup does not fail (on the
  parent commit every global cleanup failed with a ``--run-id`` error);
- a run seen only through its cgroup (another state directory's: no ledger of ours) is taken as
  live (on the parent commit its untagged process was killed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.machine import ledger, procscan, runscope

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (another user's process, cgroups)"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
    # a global `mxchaos cleanup`: nothing of a neighbour's may be caught mid-start
    pytest.mark.alone,
]

REPO = Path(__file__).resolve().parents[2]
NOBODY = "65534"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(folder))
    return folder


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait(10)
    return done.pid


def _sleeper(procs: list[subprocess.Popen[bytes]], env: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*prefix, "sleep", "120"], env={"PATH": os.environ["PATH"], **env}, start_new_session=True)
    procs.append(proc)
    return proc


def _cleanup(state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MXCHAOS_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_another_users_process_carrying_a_live_runs_id_kills_nothing(state: Path,
                                                                     started: list[subprocess.Popen[bytes]]) -> None:
    me, my_start = os.getpid(), procscan.proc_start_time(os.getpid())
    assert my_start is not None
    rid = ledger.new_run_id("victim")
    ledger.write_entry(rid, {"harness_pid": me, "harness_start": my_start})
    # the forger first (a lower pid: the first member the old cleanup asked about its harness)
    forger = _sleeper(started, {procscan.ENV_RUN_ID: rid, procscan.ENV_HARNESS_PID: str(_dead_pid()),
                                procscan.ENV_HARNESS_START: "1"},
                      ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"))
    victim = _sleeper(started, {procscan.ENV_RUN_ID: rid, procscan.ENV_PROC: "server", procscan.ENV_HARNESS_PID: str(me),
                                procscan.ENV_HARNESS_START: str(my_start)})
    runscope.record(rid, victim.pid, harness=(me, my_start))
    done = _cleanup(state)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _alive(victim), f"the live run's process was killed:\n{done.stdout}{done.stderr}"
    assert _alive(forger), "another user's process was killed"
    assert ledger.read_entry(rid) is not None, "the live run's ledger entry was removed"
    assert f"skipped run {rid}: its harness is still running" in done.stdout, done.stdout


def test_a_malformed_run_id_is_skipped_and_named_never_fatal(state: Path, started: list[subprocess.Popen[bytes]]) -> None:
    dead = str(_dead_pid())
    bad = _sleeper(started, {procscan.ENV_RUN_ID: "../not a run id", procscan.ENV_HARNESS_PID: dead})
    crashed = _sleeper(started, {procscan.ENV_RUN_ID: ledger.new_run_id("crashed"), procscan.ENV_HARNESS_PID: dead})
    done = _cleanup(state)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"skipped a malformed run id: pid {bad.pid}: run id '../not a run id'" in done.stderr, done.stderr
    crashed.wait(10)  # the crashed run next to it is still swept
    assert _alive(bad)


def test_a_run_seen_only_through_its_cgroup_is_left_alone(state: Path, started: list[subprocess.Popen[bytes]]) -> None:
    if not runscope.hierarchies():
        pytest.skip("no writable cgroup hierarchy here")
    rid = ledger.new_run_id("elsewhere")  # another state directory's run: its ledger is not ours
    with runscope.joining(rid) as join:
        assert join is not None
        proc = subprocess.Popen(["sleep", "120"], preexec_fn=join, start_new_session=True, env={"PATH": os.environ["PATH"]})
    started.append(proc)
    try:
        assert proc.pid in runscope.members(rid)
        done = _cleanup(state)
        assert done.returncode == 0, done.stdout + done.stderr
        assert _alive(proc), f"a run seen only through its cgroup was killed:\n{done.stdout}"
        assert f"skipped run {rid}: seen only through its cgroup" in done.stdout, done.stdout
    finally:
        proc.kill()
        proc.wait(10)
        runscope.remove(rid)
        assert runscope.scope_paths(rid) == []
