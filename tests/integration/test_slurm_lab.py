"""A real SLURM cluster in the lab (``mxchaos lab up --slurm``: munge, slurmctld and a slurmd per lab host,
``harness.hosts.slurm_lab``) and scenarios run on the nodes of a real allocation
(``--inventory`` with ``slurm:``, ``harness.hosts.allocation``):

- ``srun -N3`` runs on the three nodes, each its own hostname; ``lab status`` shows ``sinfo``;
- (a) a two-host network scenario (a partition mid-READ) run inside ``salloc -N2 -w h2,h3`` passes,
  its hosts bound to the job's nodes (not to h1, which the job does not hold);
- (e) with no controller answering, ``mxchaos run --inventory slurm:`` exits 4 naming the controller
  before anything is started (no run folder), and so do ``cleanup --inventory slurm:`` and
  ``nightly --slurm`` (no night folder); inside a job
  ``cleanup --inventory`` reaches its nodes;
- ``matrix --slurm``: a column's lanes as one array, each writing its folder of the column;
- (b) ``nightly --slurm`` of four scenarios (one ``schedule: alone``) runs as one job array, a lane per
  node, and gathers one night (one page, one ``nightly.json``) with the verdicts of a local night; each
  lane's end as accounting has it (``sacct -c``, the lab's job completion log);
- (c) a node's slurmd SIGKILLed under its lane: the lane's end (NODE_FAIL) is an infrastructure verdict
  naming job, node and state, the lane is resubmitted elsewhere and passes; nothing lost, nothing left;
- ``--nodes-per-lane 2``: each lane holds two nodes and its scenario's two hosts are placed on them;
- ``--node-local DIR``: each lane writes on its node and the dispatcher takes its folder back through
  ``srun --overlap`` (a tar stream), the nodes' copies removed;
- (d) the dispatcher SIGKILLed mid-array: ``mxchaos cleanup`` cancels the array (nothing pending or
  running, no process of its runs left);
- ``reach: srun``: smoke and frozen_source (a SIGSTOP of the source mid-READ) pass on a node reached only through
  ``srun --overlap`` steps of a held job (its ssh port closed in the inventory), and so does (a)'s two-host
  network scenario; srun's own failure (a job that does not exist, a node it does not hold) is told from the
  command's exit code by real srun output; the job cancelled mid-run is an ERROR naming srun, never a FAIL;
- ``lab down`` stops every daemon (slurmctld, munged, the slurmds and their children) and removes
  every file and namespace; so does ``mxchaos cleanup`` for a lab whose ``lab up`` died, and
  ``lab down`` for a lab whose record is lost.

They hold the machine alone: the lab's daemons and a global cleanup must not meet a neighbour's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.commands import cleanup
from harness.errors import HarnessError
from harness.hosts import lab, slurm_lab, srun

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.alone,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd, SLURM daemons)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen", "iptables", "tc"))
                       or not Path("/usr/sbin/sshd").exists(),
                       reason="needs iproute2, iptables, tc, openssh-client and openssh-server"),
    pytest.mark.skipif(bool(slurm_lab.missing()),
                       reason=f"needs SLURM and munge ({', '.join(slurm_lab.missing())} missing: "
                              f"apt-get install -y {slurm_lab.PACKAGES})"),
]

MXCHAOS = [sys.executable, "-m", "harness.cli"]
TWO_HOSTS = """\
name: slurm_two_host_partition
description: on two nodes of a SLURM allocation, the reader's node is cut from its only source's mid-READ; the READ is called a stall and the reader loads from disk
seed: 5
budgets: {step: 30s, run: 100s}
hosts: {a: netns, r: netns}
model: {tensors: 8, tensor_mib: 16}
processes:
  server: {role: server, host: r, options: {heartbeat_timeout: 20s, reaper_interval: 500ms}}
  source-1: {role: source, host: a, options: {heartbeat_interval: 500ms, mode: central}}
  reader-1: {role: reader, host: r, options: {transfer_timeout: 30s}}
steps:
  - start: server
  - start: source-1
  - await: {process: source-1, event: status_change, where: {status: READY}}
  - fault: {kind: rate, target: a, rate: 1gbit, name: slow-a}
  - start: reader-1
  - await: {process: reader-1, event: transfer_start}
  - fault: {kind: partition, target: reader-1, peer: {source_of: reader-1}, name: cut}
  - await: {process: reader-1, exit: true, code: 0}
  - heal: [cut, slow-a]
checks:
  - loaded: {reader: reader-1, path: disk}
  - count: {process: reader-1, event: transfer_timeout, where: {stalled: true}, min: 1, max: 1}
  - integrity: {}
  - exit_codes: {expect: {reader-1: 0}, by_itself: [reader-1]}
  - nothing_leaked: {}
"""


def _gone(state: Path, info: dict[str, Any]) -> None:
    assert lab.leftovers(state) == []
    assert _processes_naming(str(state)) == []
    assert not slurm_lab.munge_dir(info["token"]).exists()
    assert not any(ns.startswith(f"mxl{info['token']}-") for ns in
                   subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())


@pytest.fixture(scope="module")
def slurm_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    state = tmp_path_factory.mktemp("slurmlab") / "lab"
    info = lab.up(3, inventory_out=state.parent / "inventory.yaml", state=state, slurm=True)
    try:
        yield state, info
    finally:
        try:
            lab.down(state)
        except HarnessError as exc:
            pytest.fail(f"lab down left something: {exc}")
        _gone(state, info)


def _env(info: dict[str, Any], **extra: str) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": info["slurm"]["conf"], **extra}


def test_the_nodes_run_a_job_step_each_and_status_shows_sinfo(slurm_state: tuple[Path, dict[str, Any]]) -> None:
    _state, info = slurm_state
    done = subprocess.run(["srun", "-N3", "--job-name=mxchaos-test-srun", "hostname"], capture_output=True, text=True,
                          timeout=60, env=_env(info), check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["h1", "h2", "h3"]  # each node in a UTS namespace of its own
    # the nodes leave "completing" once the step's end is processed (bounded: the step has ended)
    assert _await("the nodes are idle again", lambda: "idle" in slurm_lab.sinfo(info), 20)
    assert "h[1-3]" in slurm_lab.sinfo(info)
    assert set(info["slurm"]["daemons"]) == {"munged", "slurmctld", "slurmd h1", "slurmd h2", "slurmd h3"}


def test_a_two_host_network_scenario_runs_on_the_allocations_nodes(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    scenario = tmp_path / "two.yaml"
    scenario.write_text(TWO_HOSTS)
    out = tmp_path / "out"
    command = [*MXCHAOS, "run", "--inventory", info["slurm"]["inventory"], "--out", str(out), str(scenario)]
    done = subprocess.run(["salloc", "-N2", "-w", "h2,h3", "--job-name=mxchaos-test-alloc", *command],
                          capture_output=True, text=True, timeout=240, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 PASS" in done.stdout
    timeline = next(out.glob("slurm_two_host_partition/*/timeline.jsonl"))
    assert {host: d["machine"] for host, d in _hosts_opened(timeline).items()} == {"a": "h2", "r": "h3"}


def test_no_controller_answering_is_exit_4_naming_it_before_anything_runs(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    conf = Path(info["slurm"]["conf"]).read_text()
    port = info["slurm"]["controller"].rsplit(":", 1)[1]
    dead = tmp_path / "slurm.conf"  # the lab's configuration, its controller on a port where nothing listens
    dead.write_text(conf.replace(f"SlurmctldPort={port}", "SlurmctldPort=9"))
    scenario = tmp_path / "two.yaml"
    scenario.write_text(TWO_HOSTS)
    out = tmp_path / "out"
    done = subprocess.run([*MXCHAOS, "run", "--inventory", "slurm:", "--out", str(out), str(scenario)], capture_output=True,
                          text=True, timeout=60, env=_env(info, SLURM_CONF=str(dead), SLURM_JOB_ID="1"), check=False)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "controller" in done.stderr and ":9 does not answer" in done.stderr and str(dead) in done.stderr
    assert not out.exists()  # refused before anything started
    swept = subprocess.run([*MXCHAOS, "cleanup", "--run-id", "nosuch-20260101T000000-a1b2c3", "--inventory", "slurm:"],
                           capture_output=True, text=True, timeout=60, check=False,
                           env=_env(info, SLURM_CONF=str(dead), SLURM_JOB_ID="1"))
    assert swept.returncode == 4 and ":9 does not answer" in swept.stderr, swept.stdout + swept.stderr
    nights = tmp_path / "nights"
    night = subprocess.run([*MXCHAOS, "nightly", "--slurm", "--out", str(nights), str(scenario)], capture_output=True,
                           text=True, timeout=120, env=_env(info, SLURM_CONF=str(dead)), check=False)
    assert night.returncode == 4 and ":9 does not answer" in night.stderr, night.stdout + night.stderr
    assert not nights.exists()  # nothing written, nothing queued


def test_cleanup_sweeps_the_nodes_of_an_allocation(slurm_state: tuple[Path, dict[str, Any]]) -> None:
    """``cleanup --inventory slurm:`` inside a job reaches each of its nodes over ssh (a run id no run has: nothing to remove)."""
    _state, info = slurm_state
    inside = f"{sys.executable} -m harness.cli cleanup --run-id nosuch-20260101T000000-a1b2c3 --inventory {info['slurm']['inventory']}"
    done = subprocess.run(["salloc", "-N2", "--job-name=mxchaos-test-cleanup", "sh", "-c", inside], capture_output=True,
                          text=True, timeout=120, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not swept" not in done.stderr


@pytest.fixture
def own_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path))  # lab_dir() is this lab: cleanup sees it
    state = tmp_path / "lab"
    yield state
    try:
        lab.down(state)
    except HarnessError:
        pass


def test_cleanup_stops_the_slurm_of_a_lab_whose_builder_died(own_lab: Path) -> None:
    info = lab.up(1, state=own_lab, slurm=True)
    assert _processes_naming(str(own_lab))
    record = lab.status(own_lab)
    assert record is not None
    record.update(status="building", builder_pid=2**22 + 7, builder_start=1)  # a `lab up` that is gone
    (own_lab / "lab.json").write_text(json.dumps(record))
    report = cleanup.sweep(run_id="no-such-run")
    swept = report.network["abandoned lab"]
    assert any(x.startswith("slurmctld pid") for x in swept) and any(x.startswith("munged pid") for x in swept)
    _gone(own_lab, info)


def test_down_stops_the_daemons_of_a_lab_whose_record_is_lost(own_lab: Path) -> None:
    info = lab.up(1, state=own_lab, slurm=True)
    (own_lab / "lab.json").unlink()  # by the lab's own pid files: root's processes running the daemons' binaries
    removed = lab.down(own_lab)
    assert any(x.startswith("slurmctld pid") for x in removed) and any(x.startswith("munged pid") for x in removed)
    _gone(own_lab, info)


# --- the nightly as one SLURM job array (issue #34 item 2: (b), (c), (d)) -------------------------

SMOKE = (Path(__file__).resolve().parents[2] / "scenarios" / "smoke.yaml").read_text()


def _scenarios(folder: Path, prefix: str, sleep_s: int = 0) -> Path:
    """Four small scenarios (the smoke scenario under other names), the last ``schedule: alone``;
    ``sleep_s``: each holds its processes that long after the load (a lane long enough to hit)."""
    folder.mkdir()
    for i, letter in enumerate("abcd"):
        text = SMOKE.replace("name: smoke", f"name: {prefix}_{letter}")
        if letter == "d":
            text = text.replace("\nseed: 1\n", "\nseed: 1\nschedule: alone\n")
        if sleep_s:
            text = text.replace("  - await: {process: reader-1, exit: true}\n",
                                f"  - await: {{process: reader-1, exit: true}}\n  - sleep: {sleep_s}s\n")
        assert f"{prefix}_{letter}" in text and (letter != "d" or "schedule: alone" in text), i
        (folder / f"{prefix}_{letter}.yaml").write_text(text)
    return folder


def _night(out: Path) -> tuple[Path, dict[str, Any]]:
    nights = [p for p in out.iterdir() if p.is_dir() and not p.is_symlink() and p.name[0].isdigit()]
    assert len(nights) == 1, nights
    return nights[0], json.loads((nights[0] / "nightly.json").read_text())


def _cells(doc: dict[str, Any]) -> dict[str, str]:
    return {s["name"]: s["cell"] for s in doc["scenarios"]}


def _pending_or_running(info: dict[str, Any], name: str) -> list[str]:
    done = subprocess.run(["squeue", "-h", "-n", name, "-t", "PENDING,RUNNING,CONFIGURING,COMPLETING", "-o", "%i %T"],
                          capture_output=True, text=True, timeout=30, env=_env(info), check=True)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _processes_naming(text: str) -> list[str]:
    """The processes of this machine whose command line names ``text`` (not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and status != "Z":
            found.append(f"{entry.name} {cmdline.strip()[:200]}")
    return found


def _hosts_opened(timeline: Path) -> dict[str, Any]:
    """The run's hosts as its timeline's ``ssh_hosts`` ok entry says they were opened (machine, srun job/node)."""
    opened = next(e for e in map(json.loads, timeline.read_text().splitlines())
                  if e.get("f") == "ssh_hosts" and e.get("type") == "ok")
    hosts: dict[str, Any] = opened["value"]["hosts"]
    return hosts


def _hostnames(info: dict[str, Any], nodes: str) -> list[str]:
    """``scontrol show hostnames``: a node list (``h[2-3]``) as names."""
    return subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True,
                          timeout=30, env=_env(info), check=True).stdout.split()


def _await(what: str, probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:g}s: {what}")


def _dispatch_name(log: Path) -> str:
    match = re.search(r"SLURM array \d+ \((mxchaos-nightly-[0-9a-f]+)\)", log.read_text(errors="replace"))
    return match.group(1) if match else ""


@pytest.mark.timeout(420)
def test_b_nightly_slurm_spreads_the_lanes_as_one_array_and_gathers_one_night(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "quick")
    slurm_out, local_out = tmp_path / "slurm-nights", tmp_path / "local-nights"
    done = subprocess.run([*MXCHAOS, "nightly", "--slurm", "--out", str(slurm_out), "-q", str(paths)],
                          capture_output=True, text=True, timeout=300, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert len(re.findall(r"SLURM array \d+ ", done.stdout)) == 1  # one sbatch --array, no resubmission
    night, doc = _night(slurm_out)
    assert (night / "index.html").is_file() and (night / "junit.xml").is_file()
    lanes = doc["hosts"]["slurm"]["lanes"]
    assert doc["hosts"]["binding"] == "slurm" and len(lanes) == 3
    assert {lane["node"] for lane in lanes} == {"h1", "h2", "h3"}  # each lane a node of its own
    alone = next(lane for lane in lanes if lane["name"].startswith("alone-"))
    assert alone["scenarios"] == ["quick_d"]
    assert sorted(n for lane in lanes for n in lane["scenarios"]) == ["quick_a", "quick_b", "quick_c", "quick_d"]
    for lane in lanes:  # each lane's end read from accounting (the lab's job completion log), not the controller
        assert [(e["state"], e["rc"], e["node"], e["source"]) for e in lane["ends"]] == [
            ("COMPLETED", 0, lane["node"], "sacct -c (job completion log)")], lane
    for name in ("quick_a", "quick_b", "quick_c", "quick_d"):  # every run folder gathered into the night's runs/
        runs = [p for p in (night / "runs" / name).glob("*/verdict.json") if not p.parent.is_symlink()]  # not latest
        assert len(runs) == 1, name
    local = subprocess.run([*MXCHAOS, "nightly", "--out", str(local_out), "-q", str(paths)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert local.returncode == done.returncode, local.stdout[-2000:]
    assert _cells(doc) == _cells(_night(local_out)[1]) == dict.fromkeys(_cells(doc), "PASS")


@pytest.mark.timeout(420)
def test_c_a_node_that_dies_under_its_lane_is_an_infrastructure_verdict_and_the_lane_runs_again(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "nodefail", sleep_s=25)
    out, log = tmp_path / "nights", tmp_path / "nightly.log"
    with open(log, "w") as sink:
        night = subprocess.Popen([*MXCHAOS, "nightly", "--slurm", "--out", str(out), "-q", str(paths)], stdout=sink,
                                 stderr=subprocess.STDOUT, env=_env(info))
    killed = ""
    try:
        name = _await("the array is submitted", lambda: _dispatch_name(log), 60)

        def lane_2_node() -> str:
            done = subprocess.run(["squeue", "-h", "-n", name, "-t", "RUNNING", "-o", "%K %N"], capture_output=True,
                                  text=True, timeout=30, env=_env(info), check=False)
            return next((n for k, n in (ln.split() for ln in done.stdout.splitlines() if len(ln.split()) == 2)
                         if k == "1"), "")

        killed = _await("lane-2 runs on a node", lane_2_node, 60)
        _await("lane-2's run has started", lambda: list(out.glob("*/slurm/a1/lane-2/nodefail_b/*/timeline.jsonl")), 60)
        daemon = lab.status(state)["slurm"]["daemons"][f"slurmd {killed}"]  # type: ignore[index]
        os.kill(daemon["pid"], 9)
        rc = night.wait(timeout=360)
    finally:
        if night.poll() is None:
            night.kill()
            night.wait(timeout=30)
        if killed:
            lab.restart_slurmd(killed, state)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-4000:]
    assert re.search(rf"lane-2: infrastructure: SLURM job \d+ \(task 1\) on node {killed} ended NODE_FAIL", text), text[-3000:]
    assert f"(not on {killed})" in text
    night_dir, doc = _night(out)
    lane = next(lane for lane in doc["hosts"]["slurm"]["lanes"] if lane["name"] == "lane-2")
    assert len(lane["attempts"]) == 2 and "NODE_FAIL" in lane["attempts"][0] and lane["node"] != killed
    assert (lane["ends"][0]["state"], lane["ends"][0]["node"]) == ("NODE_FAIL", killed)  # as accounting has it
    assert lane["ends"][0]["source"] == "sacct -c (job completion log)" and "end state from sacct -c" in lane["attempts"][0]
    assert lane["infra"] is None and lane["rc"] == 0
    assert _cells(doc) == dict.fromkeys(("nodefail_a", "nodefail_b", "nodefail_c", "nodefail_d"), "PASS")  # nothing lost
    assert (night_dir / "slurm" / "a1" / "lane-2" / "task.json").is_file()  # the failed attempt kept for a look
    assert _pending_or_running(info, name) == []
    assert _processes_naming(str(night_dir)) == []  # nothing of the killed lane left running


@pytest.mark.timeout(300)
def test_d_a_killed_dispatchers_array_is_cancelled_by_cleanup(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "orphan", sleep_s=60)
    out, log = tmp_path / "nights", tmp_path / "nightly.log"
    (tmp_path / "state").mkdir(mode=0o700)
    env = _env(info, MXCHAOS_STATE_DIR=str(tmp_path / "state"))  # the dispatch's record, and the cleanup that reads it
    with open(log, "w") as sink:
        night = subprocess.Popen([*MXCHAOS, "nightly", "--slurm", "--out", str(out), "-q", str(paths)], stdout=sink,
                                 stderr=subprocess.STDOUT, env=env)
    try:
        name = _await("the array is submitted", lambda: _dispatch_name(log), 60)
        _await("every lane runs", lambda: len([ln for ln in _pending_or_running(info, name) if "RUNNING" in ln]) == 3, 60)
        _await("the lanes' runs have started", lambda: len(list(out.glob("*/slurm/a1/*/orphan_*/*/timeline.jsonl"))) >= 3, 60)
    finally:
        night.kill()  # SIGKILL: no handler runs, nothing is cancelled by the dispatcher
        night.wait(timeout=30)
    assert len(_pending_or_running(info, name)) == 3  # the array outlives its dispatcher
    assert len(list((tmp_path / "state" / "slurm").glob("*.json"))) == 1  # recorded before sbatch
    swept = subprocess.run([*MXCHAOS, "cleanup"], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert f"cancelled the SLURM jobs named {name}" in swept.stdout, swept.stdout
    assert _pending_or_running(info, name) == []
    night_dir = next(p for p in out.iterdir() if p.name[0].isdigit())
    assert _await("no process of the lanes is left", lambda: _processes_naming(str(night_dir)) == [] or None, 30) is True
    assert list((tmp_path / "state" / "slurm").glob("*.json")) == []  # its record went with its jobs
    again = subprocess.run([*MXCHAOS, "cleanup"], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert name not in again.stdout


@pytest.mark.timeout(300)
def test_sigterm_of_the_dispatcher_cancels_its_array_and_writes_the_night_interrupted(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "term", sleep_s=60)
    out, log = tmp_path / "nights", tmp_path / "nightly.log"
    (tmp_path / "state").mkdir(mode=0o700)
    env = _env(info, MXCHAOS_STATE_DIR=str(tmp_path / "state"))
    with open(log, "w") as sink:
        night = subprocess.Popen([*MXCHAOS, "nightly", "--slurm", "--out", str(out), "-q", str(paths)], stdout=sink,
                                 stderr=subprocess.STDOUT, env=env)
    try:
        name = _await("the array is submitted", lambda: _dispatch_name(log), 60)
        _await("the lanes' runs have started", lambda: len(list(out.glob("*/slurm/a1/*/term_*/*/timeline.jsonl"))) >= 3, 60)
        night.terminate()
        rc = night.wait(timeout=90)
    finally:
        if night.poll() is None:
            night.kill()
            night.wait(timeout=30)
    assert rc == 130, log.read_text()[-3000:]
    assert f"cancelling SLURM jobs named {name}" in log.read_text()
    assert _pending_or_running(info, name) == []
    assert list((tmp_path / "state" / "slurm").glob("*.json")) == []
    night_dir, doc = _night(out)
    assert doc["interrupted"] is True
    assert _await("no process of the lanes is left", lambda: _processes_naming(str(night_dir)) == [] or None, 30) is True


@pytest.mark.timeout(420)
def test_matrix_slurm_runs_a_columns_lanes_as_one_array_into_the_column_folder(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "column")
    out = tmp_path / "matrix"
    done = subprocess.run([*MXCHAOS, "matrix", "--slurm", "--subject", "mxref", "--no-raw-read", "--out", str(out),
                           str(paths)], capture_output=True, text=True, timeout=360, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert len(re.findall(r"SLURM array \d+ ", done.stdout)) == 1
    doc = json.loads((out / "matrix.json").read_text())
    (column,) = doc["columns"]
    lanes = column["slurm"]["lanes"]
    assert {lane["node"] for lane in lanes} == {"h1", "h2", "h3"} and not column["infra"]
    assert next(lane for lane in lanes if lane["name"].startswith("alone-"))["scenarios"] == ["column_d"]
    for lane in lanes:  # each lane wrote its folder of the column, which the column's summary joins
        assert (out / column["id"] / lane["name"] / "summary.json").is_file()
    assert {name: row[column["id"]]["verdict"] for name, row in doc["cells"].items()} == \
        dict.fromkeys(("column_a", "column_b", "column_c", "column_d"), "PASS")


@pytest.mark.timeout(480)
def test_nodes_per_lane_gives_each_lane_two_nodes_and_its_hosts_are_placed_over_them(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``nightly --slurm --nodes-per-lane 2``: two two-host scenarios (one ``schedule: alone``), two lanes
    of two nodes each (the lab's three nodes hold one such lane at a time: the second queues); each
    lane's run takes its hosts from its own allocation (``--inventory`` of the lab's ``slurm:`` file),
    so each scenario's two hosts are the two nodes SLURM gave its lane, and every cell passes."""
    _state, info = slurm_state
    folder = tmp_path / "sc"
    folder.mkdir()
    pair = TWO_HOSTS.replace("rate: 1gbit", "rate: 200mbit")  # the READ long enough for the cut to land in it
    # and the cut a moment into it: landed within ms of transfer_start it can beat every byte over the limit
    pair = pair.replace("event: transfer_start}\n", "event: transfer_start}\n  - sleep: 400ms\n")
    assert pair != TWO_HOSTS and "sleep: 400ms" in pair
    (folder / "pair_a.yaml").write_text(pair.replace("name: slurm_two_host_partition", "name: pair_a"))
    (folder / "pair_b.yaml").write_text(pair.replace("name: slurm_two_host_partition", "name: pair_b")
                                        .replace("\nseed: 5\n", "\nseed: 5\nschedule: alone\n"))
    out = tmp_path / "nights"
    done = subprocess.run([*MXCHAOS, "nightly", "--slurm", "--nodes-per-lane", "2", "--lane-inventory",
                           info["slurm"]["inventory"], "--out", str(out), "-q", str(folder)],
                          capture_output=True, text=True, timeout=420, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"SLURM array \d+ \(mxchaos-nightly-[0-9a-f]+\): 2 task\(s\), 2 nodes each", done.stdout)
    night, doc = _night(out)
    record = doc["hosts"]["slurm"]
    assert record["nodes_per_lane"] == 2 and len(record["lanes"]) == 2
    for lane in record["lanes"]:
        nodes = _hostnames(info, lane["nodes"])
        assert len(nodes) == 2 and lane["node"] in nodes, lane
        (name,) = lane["scenarios"]
        timeline = next(p for p in (night / "runs" / name).glob("*/timeline.jsonl") if not p.parent.is_symlink())
        placed = {host: d["machine"] for host, d in _hosts_opened(timeline).items()}
        assert sorted(placed.values()) == sorted(nodes), (placed, nodes)  # its two hosts on its lane's two nodes
    assert _cells(doc) == {"pair_a": "PASS", "pair_b": "PASS"}


@pytest.mark.timeout(420)
def test_node_local_results_are_written_on_the_nodes_and_gathered_back_through_srun(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``nightly --slurm --node-local DIR``: the manifest travels in the batch script, each lane writes its
    folder under DIR/<its node>/ (what its task.json says), the dispatcher takes each folder back through
    ``srun --overlap`` (a tar stream on the step's output: bytes and seconds recorded per lane), the
    nodes' copies are removed once taken, and the night is the one a shared file system gives: every
    run gathered, every cell PASS."""
    _state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "local")
    out, nodes_root = tmp_path / "nights", tmp_path / "node-local"
    done = subprocess.run([*MXCHAOS, "nightly", "--slurm", "--node-local", str(nodes_root), "--out", str(out), "-q",
                           str(paths)], capture_output=True, text=True, timeout=360, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    night, doc = _night(out)
    lanes = doc["hosts"]["slurm"]["lanes"]
    assert len(lanes) == 3 and {lane["node"] for lane in lanes} == {"h1", "h2", "h3"}
    for lane in lanes:
        (taken,) = lane["gathered"]
        assert taken["error"] is None and taken["bytes"] > 100_000 and taken["seconds"] is not None, lane
        said = json.loads((night / "slurm" / "a1" / lane["name"] / "task.json").read_text())
        assert said["local"] is True and said["node"] == lane["node"]
        assert said["folder"].startswith(f"{nodes_root}/{lane['node']}/nightly-"), said  # written on its node
        assert not Path(said["folder"]).exists()  # the node's copy went once the dispatcher had it
    for name in ("local_a", "local_b", "local_c", "local_d"):
        runs = [p for p in (night / "runs" / name).glob("*/verdict.json") if not p.parent.is_symlink()]
        assert len(runs) == 1, name
    assert _cells(doc) == dict.fromkeys(("local_a", "local_b", "local_c", "local_d"), "PASS")
    assert not list(nodes_root.glob("*/*/*/*"))  # no lane folder left on any node


def _hold(info: dict[str, Any], node: str) -> str:
    """A job holding ``node`` (or ``h2,h3``) with no shell (``salloc --no-shell``): its id."""
    done = subprocess.run(["salloc", "--no-shell", f"-N{node.count(',') + 1}", "-w", node, "--job-name=mxchaos-test-srun-reach"], capture_output=True,
                          text=True, timeout=60, env=_env(info), check=False)
    match = re.search(r"Granted job allocation (\d+)", done.stdout + done.stderr)
    assert done.returncode == 0 and match, done.stdout + done.stderr
    return match.group(1)


@contextlib.contextmanager
def _held(info: dict[str, Any], node: str) -> Iterator[str]:
    """``_hold``'s job for the ``with`` block, cancelled as it ends (also on a failed assert)."""
    job = _hold(info, node)
    try:
        yield job
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30, env=_env(info), check=False)


def _passes(info: dict[str, Any], inventory: str, out: Path, *scenarios: Path, timeout: float = 240) -> None:
    """``mxchaos run --inventory INVENTORY --out OUT SCENARIOS`` exits 0 with every scenario PASS."""
    done = subprocess.run([*MXCHAOS, "run", "--inventory", inventory, "--out", str(out), *map(str, scenarios)],
                          capture_output=True, text=True, timeout=timeout, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(scenarios)} PASS" in done.stdout, done.stdout[-2000:]


def _srun_inventory(info: dict[str, Any], job: str, path: Path) -> Path:
    """The lab's allocation inventory for ``job`` with every node reached through srun, its ssh port closed."""
    doc = yaml.safe_load(Path(info["slurm"]["inventory"]).read_text())
    doc["defaults"] |= {"reach": "srun", "port": 9}  # nothing listens on 9: ssh could not reach the node
    doc["slurm"]["job"] = int(job)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(420)
def test_hosts_reached_through_srun_run_smoke_and_a_frozen_source(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _state, info = slurm_state
    with _held(info, "h2") as job:
        # srun's own failure and the command's exit code, as real srun reports them
        ok = subprocess.run([*srun.argv(job, "h2"), "hostname; exit 3"], capture_output=True, text=True, timeout=60,
                            env=_env(info), check=False)
        assert (ok.returncode, ok.stdout.strip(), srun.failure(ok.returncode, ok.stderr)) == (3, "h2", None), ok.stderr
        nojob = subprocess.run([*srun.argv("999999", "h2"), "true"], capture_output=True, text=True, timeout=60,
                               env=_env(info), check=False)
        assert nojob.returncode != 0 and srun.failure(nojob.returncode, nojob.stderr), nojob.stderr
        notheld = subprocess.run([*srun.argv(job, "h3"), "true"], capture_output=True, text=True, timeout=60,
                                 env=_env(info), check=False)
        assert notheld.returncode != 0 and srun.failure(notheld.returncode, notheld.stderr), notheld.stderr

        inventory = _srun_inventory(info, job, tmp_path / "srun.yaml")
        out = tmp_path / "out"
        repo = Path(__file__).resolve().parents[2]
        _passes(info, str(inventory), out, repo / "scenarios" / "smoke.yaml", repo / "scenarios" / "frozen_source.yaml",
                timeout=300)
        for name in ("smoke", "frozen_source"):
            hosts = _hosts_opened(next(out.glob(f"{name}/*/timeline.jsonl")))
            assert [d.get("srun") for d in hosts.values()] == [f"job {job} node h2"], hosts
        steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True, text=True, timeout=30,
                               env=_env(info), check=True)
        assert "mxchaos-step" not in steps.stdout  # every step the runs started has ended
        swept = subprocess.run([*MXCHAOS, "cleanup", "--run-id", "nosuch-20260101T000000-a1b2c3", "--inventory", str(inventory)],
                               capture_output=True, text=True, timeout=120, env=_env(info), check=False)
        assert swept.returncode == 0 and "not swept" not in swept.stderr, swept.stdout + swept.stderr  # reached through srun


@pytest.mark.timeout(300)
def test_a_job_cancelled_under_an_srun_host_is_the_environments_error_not_the_subjects(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The job its steps belong to is cancelled mid-run: srun's own failure (the job is gone) loses the host, and
    the run ends as an error naming the host, the job and what srun said, never as a failed check."""
    _state, info = slurm_state
    with _held(info, "h3") as job:
        inventory = _srun_inventory(info, job, tmp_path / "srun.yaml")
        scenario = tmp_path / "long.yaml"
        scenario.write_text(SMOKE.replace("name: smoke", "name: srun_job_cancelled").replace(
            "  - await: {process: reader-1, exit: true}\n", "  - await: {process: reader-1, exit: true}\n  - sleep: 60s\n"))
        assert "sleep: 60s" in scenario.read_text()
        out = tmp_path / "out"
        run = subprocess.Popen([*MXCHAOS, "run", "--inventory", str(inventory), "--out", str(out), str(scenario)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(info))
        try:
            timeline = _await("the run's reader has exited", lambda: next(
                (t for t in out.glob("srun_job_cancelled/*/timeline.jsonl")
                 if any("process_exit" in line and "reader-1" in line for line in t.read_text().splitlines())), None), 120)
            subprocess.run(["scancel", job], capture_output=True, timeout=30, env=_env(info), check=True)
            output, _ = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(10)
        verdict = json.loads(next(timeline.parent.glob("verdict.json")).read_text())
        assert (verdict["verdict"], verdict["status"]) == ("error", "error"), (verdict, output[-2000:])
        assert f"srun host local (node h3 of SLURM job {job})" in verdict["reason"], verdict["reason"]
        assert "srun failed" in verdict["reason"], verdict["reason"]
        assert run.returncode != 0
        assert _processes_naming(verdict["run_id"]) == []  # nothing of the run left here


@pytest.mark.timeout(300)
def test_a_two_host_network_scenario_runs_on_nodes_reached_through_srun(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Test (a)'s scenario (a rate limit and a partition mid-READ, NIXL between the nodes) with both hosts
    reached through srun: the network faults' commands run in each node's shell, itself a step there."""
    _state, info = slurm_state
    with _held(info, "h2,h3") as job:
        scenario = tmp_path / "two.yaml"
        scenario.write_text(TWO_HOSTS)
        out = tmp_path / "out"
        _passes(info, str(_srun_inventory(info, job, tmp_path / "srun.yaml")), out, scenario)
        hosts = _hosts_opened(next(out.glob("slurm_two_host_partition/*/timeline.jsonl")))
        assert {h: d.get("srun") for h, d in hosts.items()} == {"a": f"job {job} node h2", "r": f"job {job} node h3"}


@pytest.mark.timeout(300)
def test_slurm_srun_spec_runs_smoke_on_a_jobs_node_through_srun_alone(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``--inventory slurm+srun:JOB`` (no file): the held job's node is the host, reached through srun steps
    of that job (its timeline says so), and smoke passes."""
    _state, info = slurm_state
    with _held(info, "h3") as job:
        out = tmp_path / "out"
        _passes(info, f"slurm+srun:{job}", out, Path(__file__).resolve().parents[2] / "scenarios" / "smoke.yaml")
        hosts = _hosts_opened(next(out.glob("smoke/*/timeline.jsonl")))
        assert [d.get("srun") for d in hosts.values()] == [f"job {job} node h3"], hosts


@pytest.mark.timeout(420)
def test_nodes_per_lane_reached_through_srun_place_a_two_host_scenario_on_the_lanes_nodes(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``nightly --slurm --nodes-per-lane 2 --reach srun --lane-inventory F`` (F: the lab's allocation inventory
    with its ssh port closed, ``port: 9``, and no ``reach:``): the lane's run gets ``--inventory slurm+srun:F``,
    so its two hosts are its lane's two nodes, each reached through a step of the lane's own job (the timeline
    names the job and node of every host; ssh could not have reached them), and the rate limit and the
    partition mid-READ (F's data devices) pass."""
    _state, info = slurm_state
    folder = tmp_path / "sc"
    folder.mkdir()
    # the cut a moment after the READ started (a step through srun lands it within ms: before a byte over the limit)
    pair = TWO_HOSTS.replace("rate: 1gbit", "rate: 200mbit").replace("name: slurm_two_host_partition", "name: pair_srun")
    pair = pair.replace("event: transfer_start}\n", "event: transfer_start}\n  - sleep: 400ms\n")
    assert "pair_srun" in pair and "200mbit" in pair and "sleep: 400ms" in pair
    (folder / "pair_srun.yaml").write_text(pair)
    closed = yaml.safe_load(Path(info["slurm"]["inventory"]).read_text())
    closed["defaults"] |= {"port": 9}  # nothing listens on 9: ssh could not reach a node
    assert "reach" not in closed["defaults"]  # the dispatcher's --reach srun says it, not the file
    inventory = tmp_path / "closed.yaml"
    inventory.write_text(yaml.safe_dump(closed))
    out = tmp_path / "nights"
    done = subprocess.run([*MXCHAOS, "nightly", "--slurm", "--nodes-per-lane", "2", "--reach", "srun", "--lane-inventory",
                           str(inventory), "--out", str(out), "-q", str(folder)], capture_output=True, text=True,
                          timeout=360, env=_env(info), check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    night, doc = _night(out)
    (lane,) = doc["hosts"]["slurm"]["lanes"]
    nodes = _hostnames(info, lane["nodes"])
    assert len(nodes) == 2, lane
    timeline = next(p for p in (night / "runs" / "pair_srun").glob("*/timeline.jsonl") if not p.parent.is_symlink())
    reached = {d["machine"]: d.get("srun") for d in _hosts_opened(timeline).values()}
    assert reached == {node: f"job {lane['job']} node {node}" for node in nodes}, (reached, lane)
    assert _cells(doc) == {"pair_srun": "PASS"}


@pytest.mark.timeout(420)
def test_cleanup_takes_back_the_node_local_folders_of_a_killed_dispatcher(
    slurm_state: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``nightly --slurm --node-local DIR`` SIGKILLed once its lanes' runs have ended and their tasks hold their
    folders for a dispatcher that will never take them: ``mxchaos cleanup`` cancels the array, then takes each
    node's folder of the dispatch into the night's spool (``left/<node>/``) through a step of a job of its own
    there and removes it from the node: every lane's runs come back, nothing is left under DIR, no job of it."""
    _state, info = slurm_state
    paths = _scenarios(tmp_path / "sc", "stray")
    out, log, nodes_root = tmp_path / "nights", tmp_path / "nightly.log", tmp_path / "node-local"
    (tmp_path / "state").mkdir(mode=0o700)
    env = _env(info, MXCHAOS_STATE_DIR=str(tmp_path / "state"))
    with open(log, "w") as sink:
        night = subprocess.Popen([*MXCHAOS, "nightly", "--slurm", "--node-local", str(nodes_root), "--out", str(out), "-q",
                                  str(paths)], stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        name = _await("the array is submitted", lambda: _dispatch_name(log), 60)
        _await("every lane's task has started on its node", lambda: len(list(nodes_root.glob("*/*/a1/*/task.json"))) == 3, 90)
    finally:
        night.kill()  # SIGKILL: nobody will gather the lanes' folders
        night.wait(timeout=30)
    _await("every lane's run has ended and its task holds its folder",
           lambda: len(list(nodes_root.glob("*/*/a1/*/task.done"))) == 3, 240)
    assert len(_pending_or_running(info, name)) == 3  # each task holds its node for the gathering
    record = json.loads(next((tmp_path / "state" / "slurm").glob("*.json")).read_text())
    assert record["local"].startswith(f"{nodes_root}/{{node}}/nightly-"), record  # its nodes: recorded or SLURM's
    began = time.monotonic()
    swept = subprocess.run([*MXCHAOS, "cleanup"], capture_output=True, text=True, timeout=300, env=env, check=False)
    print(f"cleanup took {time.monotonic() - began:.1f}s:\n{swept.stdout}")  # the figures docs/slurm-dispatch.md gives
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert f"cancelled the SLURM jobs named {name}" in swept.stdout, swept.stdout
    spool = Path(record["spool"])
    for node in ("h1", "h2", "h3"):
        assert re.search(rf"took {re.escape(str(nodes_root))}/{node}/nightly-[0-9a-f]{{8}} from node {node} into "
                         rf"{re.escape(str(spool / 'left' / node))} \(\d+ bytes\) and removed it there", swept.stdout), swept.stdout
    verdicts = sorted(p.parent.parent.name for p in spool.glob("left/*/a1/*/stray_*/*/verdict.json")
                      if not p.parent.is_symlink())
    assert verdicts == ["stray_a", "stray_b", "stray_c", "stray_d"], verdicts  # every lane's run came back
    assert not list(nodes_root.glob("*/*")), list(nodes_root.glob("*/*"))  # nothing left on any node
    assert _pending_or_running(info, name) == [] and _pending_or_running(info, f"{name}-sweep") == []
    assert list((tmp_path / "state" / "slurm").glob("*.json")) == []
    assert name not in subprocess.run([*MXCHAOS, "cleanup"], capture_output=True, text=True, timeout=120, env=env,
                                      check=False).stdout
