"""``mxchaos soak`` for real: a metadata server, two sources and two looping readers moving a small
model over NIXL (UCX over TCP) load after load, sampled between rounds.

* The real code, resumed once (two segments, new processes): every load verified, the audit keeps
  up with the loads the harness counted, no descriptor, socket, thread or NIXL resource grows.
* A planted per-transfer leak (``mxref reader --debug-leak``) in one reader of two: caught, named
  (its process and resource) at its rate (one per load of that reader: 500 per 1,000 transfers of
  the soak), well within 2,000 transfers; the other reader flat; exit 1.
* A SIGKILLed soak whose processes hang (SIGSTOPped): its processes are in its run scope, and
  ``mxchaos cleanup`` against its state dir kills every one and removes its ledger entry.
* The sources of a P2P soak: each reader's fetch of a source's NIXL metadata leaves a socket of the
  source's NIXL listener in CLOSE_WAIT (xfail: a known defect, reported by the soak's first runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.soak.fleet import FleetSpec
from harness.soak.runner import SoakOptions, run_soak

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COUNTS = ("fds", "threads", "tcp", "tcp_established", "tcp_close_wait", "nixl_handles_open", "nixl_dlists_open",
          "nixl_registrations_open", "nixl_remote_agents_open")
CENTRAL = FleetSpec(sources=2, readers=2, tensors=4, tensor_mib=0.25, source_mode="central")


def test_a_real_soak_resumed_once_keeps_its_counts_flat(tmp_path: Path) -> None:
    said: list[str] = []
    first = run_soak(SoakOptions(out=tmp_path, transfers=100, spec=CENTRAL, sample_every=20, warmup=40), said.append)
    assert first["error"] is None and first["transfers"] == 100 and first["segments"] == 1
    summary = run_soak(SoakOptions(out=tmp_path, transfers=200, spec=CENTRAL, sample_every=20, warmup=40, resume=True),
                       said.append)
    assert summary["error"] is None, summary["error"]
    assert (summary["transfers"], summary["failed_loads"], summary["segments"]) == (200, 0, 2)
    audit = summary["audit_crosscheck"]
    assert sum(row["loads"] for row in audit.values()) == 200 and all(row["trusted"] for row in audit.values()), audit
    for process, resources in summary["series"].items():
        for resource in COUNTS:
            if resource in resources:
                assert resources[resource]["verdict"] != "grows", (process, resource, resources[resource])
    for reader in ("reader-1", "reader-2"):  # a reader's counts are the same after every load
        for resource in ("fds", "tcp", "nixl_handles_open", "nixl_registrations_open", "nixl_remote_agents_open"):
            assert summary["series"][reader][resource]["verdict"] == "flat", (reader, resource)
    assert (tmp_path / "processes-0").is_dir() and (tmp_path / "processes-1").is_dir()
    for reader in ("reader-1", "reader-2"):  # each load given back, the next one's target made ahead at once
        events = [json.loads(line) for line in (tmp_path / "processes-1" / f"{reader}.events.jsonl").read_text().splitlines()]
        loads = sum(e["event"] == "load_done" for e in events)
        ahead = [e for e in events if e["event"] == "target_prestart" and e["reason"].startswith("between loads")]
        assert loads == 50 and len(ahead) == loads, (reader, loads, len(ahead))
    page = (tmp_path / "soak.html").read_text()
    assert "<svg" in page and "tcp_close_wait" in page
    assert json.loads((tmp_path / "soak-result.json").read_text())["transfers"] == 200


@pytest.mark.parametrize(("kind", "resource"), [("fd", "fds"), ("registration", "nixl_registrations_open")])
def test_a_planted_per_transfer_leak_is_caught_named_and_rated(tmp_path: Path, kind: str, resource: str) -> None:
    out = tmp_path / "soak"
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "soak", "--transfers", "160", "--out", str(out), "--warmup", "40",
         "--sample-every", "20", "--source-mode", "central", "--leak", kind, "--leak-readers", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "soak-result.json").read_text())
    assert summary["verdict"] == "grows" and summary["error"] is None and summary["failed_loads"] == 0
    leaks = [g for g in summary["growths"] if g["resource"] == resource]
    assert [g["process"] for g in leaks] == ["reader-1"], summary["growths"]
    slope = leaks[0]["slope"]
    # reader-1 makes half the loads, one leak after each: 500 per 1,000 transfers of the soak
    assert slope["lo"] <= 500 <= slope["hi"] and slope["hi"] - slope["lo"] < 50, slope
    assert leaks[0]["detected_at"] <= 2000
    assert summary["series"]["reader-2"][resource]["verdict"] == "flat"
    assert f"reader-1 {resource} grows +500.0 per 1000 transfers" in done.stdout


@pytest.mark.xfail(strict=True, reason="known defect: a P2P fetch of a source's NIXL metadata leaves the source's "
                                       "listener socket in CLOSE_WAIT, one per reader agent (NIXL 1.5.1)")
def test_p2p_sources_keep_their_sockets_flat(tmp_path: Path) -> None:
    spec = FleetSpec(sources=1, readers=2, tensors=4, tensor_mib=0.25, source_mode="p2p")
    summary = run_soak(SoakOptions(out=tmp_path, transfers=140, spec=spec, sample_every=20, warmup=40), lambda _: None)
    assert summary["error"] is None and summary["failed_loads"] == 0
    assert summary["series"]["source-1"]["tcp_close_wait"]["verdict"] != "grows", summary["series"]["source-1"]


def test_an_interrupted_soak_stops_its_processes_and_leaves_a_readable_record(tmp_path: Path) -> None:
    import os
    import signal
    import time

    out = tmp_path / "soak"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "soak", "--seconds", "600", "--out", str(out), "--source-mode", "central",
         "--sources", "1", "--readers", "1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # three samples of each of its 3 processes: it is loading
            samples = out / "samples.jsonl"
            if samples.exists() and len(samples.read_text().splitlines()) >= 9:
                break
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, output[-3000:]
    summary = json.loads((out / "soak-result.json").read_text())
    assert summary["transfers"] >= 40 and summary["error"] is None and (out / "soak.html").exists()
    pids = {json.loads(line)["pid"] for line in (out / "samples.jsonl").read_text().splitlines()}
    assert len(pids) == 3
    for pid in pids:  # every process it started is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _descendants(root: int) -> dict[int, str]:
    """``root``'s descendants now (pid -> command line), read from /proc without the harness's finders."""
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
            except OSError:
                continue
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def test_a_sigkilled_soaks_processes_are_found_and_killed_by_cleanup(tmp_path: Path) -> None:
    """The soak's processes are in its run scope: SIGSTOPped (so the SIGTERM its death sends them is
    not acted on: a hung process), the soak SIGKILLed, they are still there; ``mxchaos cleanup``
    against the soak's state dir kills every one, removes its ledger entry and pid ledger, and
    writes CRASHED into its folder; a second cleanup finds nothing of it."""
    import os
    import signal
    import time

    state, out = tmp_path / "state", tmp_path / "soak"
    state.mkdir(mode=0o700)
    env = {**os.environ, "MXCHAOS_STATE_DIR": str(state)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "soak", "--seconds", "600", "--out", str(out), "--source-mode", "central",
         "--sources", "1", "--readers", "1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)
    stopped: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a sample of each of its 3 processes: the fleet is up
            samples = out / "samples.jsonl"
            if samples.exists() and len(samples.read_text().splitlines()) >= 3:
                break
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        run_id = json.loads((out / "soak.json").read_text())["run_id"]
        assert (state / "runs" / f"{run_id}.json").is_file() and (state / "runs" / f"{run_id}.pids").is_file()
        stopped = _descendants(proc.pid)
        assert len(stopped) >= 3, stopped
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        proc.kill()  # SIGKILL: nothing of the soak's own teardown runs
        proc.communicate(timeout=30)
        time.sleep(1.0)
        assert all(_running(pid) for pid in stopped)  # orphaned and hung: only cleanup can end them
        swept = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=120, check=False)
        assert swept.returncode == 0, swept.stdout + swept.stderr
        assert run_id in swept.stdout, swept.stdout
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_running(pid) for pid in stopped):
            time.sleep(0.2)
        assert [f"{pid} {cmd}" for pid, cmd in stopped.items() if _running(pid)] == []
        assert not (state / "runs" / f"{run_id}.json").exists() and not (state / "runs" / f"{run_id}.pids").exists()
        assert (out / "CRASHED").is_file()
        again = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=120, check=False)
        assert run_id not in again.stdout, again.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in stopped:  # a failed test leaves nothing either
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
