"""A run's scope (``harness.machine.runscope``) with real processes: a wrapper's child that left its process
group (or its session) and cleared its environment outlives the wrapper's stop; the leak scan finds
it, ``nothing_leaked`` fails the run naming it, and nothing of it is left after the run. Each
mechanism alone: a cgroup v2, a cgroup v1 freezer, and the ledger of sessions without cgroups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.commands.cleanup import sweep
from harness.engine.runner import Runner
from harness.machine import procscan, runscope
from harness.scenario import load_scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# The wrapper starts its child in a process group of its own (so the stop of the wrapper's group
# misses it), or a session of its own, with an empty environment (no MXCHAOS_RUN_ID), then waits.
CHILD = {  # started by a shell (no interpreter start-up between the wrapper's start and its child)
    "group": "perl -e 'setpgrp(0,0); %ENV=(); exec q(sleep), 300'",
    "session": "setsid env -i sleep 300",
}
SCENARIO = """\
name: {name}
budgets: {{step: 20s, run: 60s, stop_grace: 2s}}
processes:
  wrapper: {{role: command, argv: ["sh", "-c", "{child} & echo up; exec sleep 299"]}}
steps:
  - start: wrapper
  - sleep: 1s
checks:
  - nothing_leaked: {{}}
"""


def _kinds() -> list[str]:
    return sorted({h.kind for h in runscope.hierarchies()})


MECHANISMS = [
    pytest.param("v2", marks=[pytest.mark.root, pytest.mark.skipif("v2" not in _kinds(), reason="no writable cgroup v2 here")]),
    pytest.param("freezer", marks=[pytest.mark.root,
                                   pytest.mark.skipif("freezer" not in _kinds(), reason="no writable cgroup v1 freezer here")]),
    pytest.param("off"),
]


def _sleepers_of(run_dir: Path, seconds: int = 300) -> list[int]:
    """``sleep <seconds>`` processes whose working directory is the run folder (the oracle: not the
    harness's own way of finding them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") == str(run_dir) and Path(f"/proc/{entry}/cmdline").read_bytes() == f"sleep\0{seconds}\0".encode():
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("shape", ["group", "session"])
def test_nothing_leaked_fails_a_run_whose_wrappers_child_outlives_its_teardown(
    mechanism: str, shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if mechanism == "off" and shape == "session":
        pytest.skip("without a cgroup, a child that left the session and cleared its environment is beyond the ledger "
                    "(its wrapper is gone, so it has no ancestor of the run either): what the cgroups are for")
    monkeypatch.setenv(runscope.ENV_CGROUP, mechanism)
    path = tmp_path / "leaky.yaml"
    path.write_text(SCENARIO.format(name=f"leaky_{shape}_{mechanism}", python=sys.executable, child=CHILD[shape]))
    runner = Runner(load_scenario(path), out_dir=tmp_path / "runs", install_signal_handlers=False)
    try:
        result = runner.run()
        (check,) = [c for c in result.checks if c.kind == "nothing_leaked"]
        assert check.valid is False, check.summary
        leaked = check.details["processes"]
        assert [p["cmdline"] for p in leaked] == ["sleep 300"], leaked
        assert leaked[0]["proc"] is None or leaked[0]["proc"] == "wrapper"
        assert "1 process(es) alive" in check.summary and "sleep 300" in check.summary
        assert _sleepers_of(runner.run_dir) == []  # the leak scan killed it, too
        assert runscope.scope_paths(runner.run_id) == []  # and removed the run's scope
    finally:
        sweep(runner.run_id)


def test_a_clean_run_leaves_no_scope_and_passes(tmp_path: Path) -> None:
    """The same wrapper whose child stays in its group: the stop ends both, nothing leaked."""
    path = tmp_path / "clean.yaml"
    child = "env -i sleep 300"
    path.write_text(SCENARIO.format(name="clean_wrapper", python=sys.executable, child=child))
    runner = Runner(load_scenario(path), out_dir=tmp_path / "runs", install_signal_handlers=False)
    try:
        result = runner.run()
        (check,) = [c for c in result.checks if c.kind == "nothing_leaked"]
        assert check.valid is True, check.summary
        assert runscope.scope_paths(runner.run_id) == []
    finally:
        sweep(runner.run_id)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kill_ends_a_forking_process_tree_and_remove_leaves_nothing(mechanism: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that forks children as fast as it can, each with a clean environment in a new
    process group: ``kill`` ends all of it within its bound (a cgroup: at once, forks in flight
    included), ``remove`` leaves no cgroup and no ledger."""
    from harness.hosts.base import LocalHost

    monkeypatch.setenv(runscope.ENV_CGROUP, mechanism)
    run_id = f"scope-kill-{mechanism}-{os.getpid()}"
    env = {**os.environ, procscan.ENV_RUN_ID: run_id, procscan.ENV_PROC: "forker"}
    code = ("import subprocess, time\n"
            "while True:\n"
            "    subprocess.Popen(['sleep', '300'], env={}, process_group=0)\n"
            "    time.sleep(0.01)\n")
    proc = LocalHost().spawn([sys.executable, "-c", code], env=env, cwd=tmp_path, log_path=tmp_path / "forker.log")
    try:
        deadline = time.monotonic() + 30
        while len(procscan.find(run_id)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = procscan.find(run_id)
        assert len(found) >= 5, found
        assert {p.proc for p in found} == {"forker"}  # the children are named after it
        assert runscope.kill(run_id, wait=10) == []
        assert procscan.find(run_id) == []
        assert _sleepers_of(tmp_path) == []
        proc.wait(5)
        removed = runscope.remove(run_id)
        assert any(r.startswith("pid ledger") for r in removed)
        assert runscope.scope_paths(run_id) == [] and run_id not in runscope.runs()
    finally:
        runscope.kill(run_id, wait=5)
        runscope.remove(run_id)
        subprocess.run(["true"], check=False)


def test_the_remote_scan_finds_a_wrappers_child_with_a_blank_environment(tmp_path: Path) -> None:
    """``harness.hosts.ssh_remote.SCAN`` (what an ssh host runs to find a run's processes, no cgroup
    needed): a tagged process's child with an empty environment is the run's, named after it; so
    is the program under a remote wrapper (tagged MXCHAOS_SSH_RUN_ID) and what that program
    orphaned; the wrapper itself is plumbing, found only by the plumbing scan."""
    import json

    from harness.hosts.ssh_remote import SCAN

    run_id = f"remote-scan-{os.getpid()}"
    child = "import subprocess, time; subprocess.Popen(['sleep', '302'], env={}); time.sleep(300)"
    tagged = subprocess.Popen([sys.executable, "-c", child], env={**os.environ, procscan.ENV_RUN_ID: run_id,
                                                                   procscan.ENV_PROC: "store"}, start_new_session=True)
    wrapper = subprocess.Popen([sys.executable, "-c", child], env={"PATH": os.environ.get("PATH", ""),
                                                                    "MXCHAOS_SSH_RUN_ID": run_id}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run([sys.executable, "-c", SCAN, run_id], capture_output=True, text=True, timeout=30, check=True)
            rows = json.loads(done.stdout)
            if len(rows) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        by_pid = {row[0]: row for row in rows}
        assert by_pid[tagged.pid][1:3] == [run_id, "store"]
        sleepers = [row for row in rows if row[4].strip() == "sleep 302"]
        assert len(sleepers) == 2 and all(row[1] == run_id for row in sleepers), rows
        assert {row[2] for row in sleepers} == {"store", None}  # named after its tagged parent; the wrapper's has no name
        assert wrapper.pid not in by_pid  # plumbing, not a process of the run
        plumbing = subprocess.run([sys.executable, "-c", SCAN, run_id, "MXCHAOS_SSH_RUN_ID"], capture_output=True, text=True,
                                  timeout=30, check=True)
        assert wrapper.pid in {row[0] for row in json.loads(plumbing.stdout)}
    finally:
        for proc in (tagged, wrapper):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.root
@pytest.mark.skipif(not _kinds(), reason="no writable cgroup here")
def test_the_remote_wrapper_joins_the_runs_cgroup_and_the_remote_scan_reads_it(tmp_path: Path) -> None:
    """On a host where it may (root, a cgroup mounted), ``ssh_remote.WRAPPER`` puts itself and so
    its program into ``mxchaos/<run id>``; what the program orphans (a blank environment, a session
    of its own) is reparented to the wrapper, a subreaper, and found by the scan from the cgroup and
    the descent alike; here, this machine plays the host."""
    import json

    from harness.hosts.ssh_remote import SCAN, WRAPPER

    run_id = f"remote-cgroup-{os.getpid()}"
    # the program's child orphans a sleeper with a blank environment in a session of its own
    program = "import subprocess, time; subprocess.Popen(['sh', '-c', 'setsid sleep 305 & exit'], env={}); time.sleep(300)"
    spec = {"argv": [sys.executable, "-c", program], "env": {procscan.ENV_RUN_ID: run_id, procscan.ENV_PROC: "p"},
            "cwd": str(tmp_path), "log": str(tmp_path / "p.log"), "rc": str(tmp_path / "p.rc")}
    wrapper = subprocess.Popen([sys.executable, "-c", WRAPPER, json.dumps(spec)], stdout=subprocess.PIPE,
                               env={"PATH": os.environ.get("PATH", ""), "MXCHAOS_SSH_RUN_ID": run_id}, start_new_session=True)
    try:
        assert wrapper.stdout is not None
        line = wrapper.stdout.readline().decode()
        assert line.startswith("pid "), line
        pid = int(line.split()[1])
        deadline = time.monotonic() + 30
        while not _sleepers_of(tmp_path, 305) and time.monotonic() < deadline:
            time.sleep(0.05)
        (sleeper,) = _sleepers_of(tmp_path, 305)
        members: set[int] = set()
        for h in runscope.hierarchies()[:1]:
            members = {int(x) for x in (h.scope(run_id) / "cgroup.procs").read_text().split()}
        assert {wrapper.pid, pid, sleeper} <= members
        stat = runscope.proc_stat(sleeper)
        assert stat is not None and stat.ppid == wrapper.pid  # the orphan is the wrapper's (a subreaper), not init's
        rows = json.loads(subprocess.run([sys.executable, "-c", SCAN, run_id], capture_output=True, text=True, timeout=30,
                                         check=True).stdout)
        assert sleeper in {row[0] for row in rows} and wrapper.pid not in {row[0] for row in rows}
        assert runscope.kill(run_id, wait=10) == []
    finally:
        runscope.kill(run_id, wait=5)
        wrapper.wait(10)
        assert wrapper.stdout is not None
        wrapper.stdout.close()
        runscope.remove(run_id)
        assert runscope.scope_paths(run_id) == []
