"""``harness.machine.runscope`` without the kernel's help: which run ids can name a scope, which cgroup
hierarchies are seen in a mountinfo, which ledger of pids is trusted, and which processes its
sessions and descendants make a run's (a fake /proc)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.machine import runscope
from harness.machine.runscope import ProcStat


@pytest.mark.parametrize("good", ["smoke-20261202T101010-abc123", "a", "x_y.z:1+2=3"])
def test_run_ids_that_name_a_scope(good: str) -> None:
    assert runscope.valid_run_id(good) == good


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", ".hidden", "-flag", "a b", "x" * 201, "a\0b"])
def test_run_ids_that_cannot_name_a_scope_are_refused_naming_the_rule(bad: str) -> None:
    with pytest.raises(ValueError, match="1 to 200 of"):
        runscope.valid_run_id(bad)


MOUNTINFO = """\
25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
31 25 0:28 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
32 25 0:29 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
33 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
"""


def test_the_hierarchies_of_a_mountinfo_v2_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(info if str(self) == "/proc/self/mountinfo" else self, *a, **k))
    found = runscope._mounted()
    assert [(h.kind, str(h.mount)) for h in found] == [("v2", "/sys/fs/cgroup/unified"), ("freezer", "/sys/fs/cgroup/freezer")]
    assert found[1].scope("r-1") == Path("/sys/fs/cgroup/freezer/mxchaos/r-1")
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    monkeypatch.setenv(runscope.ENV_CGROUP, "freezer")
    assert [h.kind for h in runscope.hierarchies()] == ["freezer"]
    monkeypatch.setenv(runscope.ENV_CGROUP, "off")
    assert runscope.hierarchies() == []
    monkeypatch.setenv(runscope.ENV_CGROUP, "auto")
    assert [h.kind for h in runscope.hierarchies()] == ["v2", "freezer"]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(runscope, "_mounted", lambda: [])  # no cgroup: the ledger alone
    return tmp_path / "runs"


def test_the_ledger_names_the_harness_first_and_each_pid_with_its_start(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runscope, "proc_stat", lambda pid: ProcStat(pid, "S", 1, pid, 1000 + pid))
    runscope.record("r-1", 50, (7, 77))
    runscope.record("r-1", 51, (8, 88))  # only the first record names the harness
    assert (state / "r-1.pids").read_text() == "harness 7 77\npid 50 1050\npid 51 1051\n"
    assert runscope.owner("r-1") == (7, 77)
    assert runscope.runs() == {"r-1"}
    assert oct((state / "r-1.pids").stat().st_mode & 0o777) == "0o600"


def test_a_ledger_another_user_could_have_written_is_not_trusted(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It could name any process of the machine for cleanup to kill."""
    state.mkdir(parents=True)
    path = state / "r-2.pids"
    path.write_text("harness 7 77\npid 50 1050\n")
    path.chmod(0o666)
    assert runscope.owner("r-2") == (None, None)
    path.chmod(0o600)
    assert runscope.owner("r-2") == (7, 77)
    path.unlink()
    target = state / "elsewhere"
    target.write_text("harness 9 99\n")
    path.symlink_to(target)
    assert runscope.owner("r-2") == (None, None)


def _fake_proc(monkeypatch: pytest.MonkeyPatch, procs: list[ProcStat]) -> None:
    table = {p.pid: p for p in procs}
    monkeypatch.setattr(runscope, "_all_stats", lambda: dict(table))


def test_members_are_the_recorded_their_sessions_and_every_descendant(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state.mkdir(parents=True)
    (state / "r-3.pids").write_text("harness 1 1\npid 100 5000\npid 200 6000\n")
    (state / "r-3.pids").chmod(0o600)
    _fake_proc(monkeypatch, [
        ProcStat(100, "S", 1, 100, 5000),  # a recorded leader, alive
        ProcStat(101, "S", 1, 100, 5001),  # left its group, kept the session, reparented to init
        ProcStat(102, "S", 101, 102, 5002),  # its child in a session of its own: a descendant
        ProcStat(103, "Z", 100, 100, 5003),  # a zombie: already dead
        ProcStat(200, "S", 1, 200, 9999),  # pid 200 reused by another session's leader: not ours
        ProcStat(201, "S", 200, 200, 9998),  # ... nor its session
        ProcStat(300, "S", 1, 300, 7000),  # someone else entirely
    ])
    assert runscope.members("r-3") == {100, 101, 102}
    assert runscope.members("r-3", seeds=[300]) == {100, 101, 102, 300}  # a tagged process and its own
    (state / "r-3.pids").write_text("harness 1 1\npid 100 4999\n")  # recorded leader gone, its pid reused as a leader
    assert runscope.members("r-3") == set()


def test_a_leaders_session_outlives_the_leader(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state.mkdir(parents=True)
    (state / "r-4.pids").write_text("harness 1 1\npid 400 5000\n")
    (state / "r-4.pids").chmod(0o600)
    _fake_proc(monkeypatch, [ProcStat(401, "S", 1, 400, 5001), ProcStat(402, "R", 1, 402, 5002)])
    assert runscope.members("r-4") == {401}


def test_remove_deletes_the_ledger_once_no_cgroup_is_left(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runscope, "proc_stat", lambda pid: None)
    runscope.record("r-5", 10, (1, None))
    assert [p.name for p in runscope.scope_paths("r-5")] == ["r-5.pids"]
    assert runscope.remove("r-5") == [f"pid ledger {state / 'r-5.pids'}"]
    assert runscope.scope_paths("r-5") == [] and runscope.remove("r-5") == []


def test_cleanup_does_not_take_a_scope_member_that_names_no_harness_for_a_dead_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A child caught between fork and exec is in its run's cgroup before the ledger of pids names
    the harness: it names none. Plain ``mxchaos cleanup`` (dead runs only) must still see the run's
    live harness in its ledger entry and leave it alone (it used to kill a parallel run's server)."""
    from harness.commands import cleanup
    from harness.hosts import netns, slurm_array
    from harness.machine import ledger, procscan

    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    rid = "live-20261202T181131-abc123"
    me = os.getpid()
    ledger.write_entry(rid, {"run_id": rid, "harness_pid": me, "harness_start": procscan.proc_start_time(me)})
    early = procscan.RunProcess(pid=me, run_id=rid, proc=None, harness_pid=None, harness_start=None, state="R", cmdline="python")
    monkeypatch.setattr(procscan, "find", lambda run_id=None, skipped=None: [early])
    monkeypatch.setattr(runscope, "runs", lambda: {rid})
    # the machine's own networks and SLURM arrays are other runs' (a parallel test's netns scenario): not this test's
    monkeypatch.setattr(netns, "leftover_runs", dict)
    monkeypatch.setattr(slurm_array, "sweep_dead", lambda dry_run=False: [])
    report = cleanup.sweep(dry_run=True)
    assert report.skipped_live_runs == [rid] and report.runs == [] and report.killed == []


def test_a_signal_reaches_a_pid_only_while_it_is_the_process_that_was_found() -> None:
    """``signal_exact``: a pid whose start time is not the one it was found with (reused by
    another process meanwhile) gets no signal; the process found gets it."""
    import signal
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    try:
        st = runscope.proc_stat(proc.pid)
        assert st is not None
        assert not runscope.signal_exact(proc.pid, st.start + 1, signal.SIGKILL)  # another process's start
        assert not runscope.signal_exact(proc.pid, None, signal.SIGKILL)  # not known: nothing sent
        assert proc.poll() is None
        assert runscope.signal_exact(proc.pid, st.start, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait(10)
