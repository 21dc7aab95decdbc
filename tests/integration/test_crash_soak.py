"""Crash soak, one run per kind of process the harness starts (the server on both front ends, a
source, a reader, redis, toxiproxy, CPU hogs and a wrapper's child, netns hosts with a qdisc and an
iptables rule in place, the ModelExpress client subject): ``mxchaos run`` SIGKILLed once the
kind's processes are up (a long sleep step under way), then ``mxchaos cleanup --run-id``: no
process, port, namespace, link, rule, qdisc or file of that run remains (its run folder aside).

What is checked is found without the harness's own way of finding it (``procscan``/``runscope``):
the harness's descendants and every process whose working directory or command line is in the run
folder, snapshotted just before the kill; the ports its processes reported (and toxiproxy's); the
namespaces, links and iptables chains named after the run; the ledger, pid ledger, cgroups and ssh
control folders of the run. A kind whose tools are missing is skipped, naming them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import subjects
from harness.errors import HarnessError
from harness.hosts import netns
from harness.machine import ledger
from harness.scenario import capabilities

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
SLEEP = "  - sleep: 300s\n"
HEAD = "name: soak_{kind}\nbudgets: {{step: 30s, run: 400s, stop_grace: 2s}}\nmodel: {{tensors: 2, tensor_mib: 1}}\n"
NEEDS_ROOT = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, iptables, tc)")]

KINDS: dict[str, str] = {
    # the server on its default front end (native gRPC), a source, and a reader waiting on the server, frozen
    "server_source_reader": """processes:
  server: {role: server}
  source-1: {role: source, options: {heartbeat_interval: 500ms}}
  reader-1: {role: reader, options: {rpc_timeout: 200s, transfer_timeout: 200s}}
steps:
  - start: server
  - start: source-1
  - await: {process: source-1, event: status_change, where: {status: READY}}
  - fault: {kind: pause, target: server, name: frozen}
  - start: reader-1
  - await: {process: reader-1, event: started}
""",
    "server_grpcio": """processes:
  server: {role: server, extra_args: [--grpc-impl, grpcio]}
steps:
  - start: server
  - await: {process: server, event: listening}
""",
    "redis": """store: redis
processes:
  server: {role: server}
steps:
  - start: server
  - await: {process: store, event: listening}
""",
    "toxiproxy": """proxies:
  mds: {upstream: server}
processes:
  server: {role: server}
steps:
  - start: server
  - await: {process: server, event: listening}
""",
    "hogs": """processes:
  hog-1: {role: command, argv: ["{python}", "-c", "import time\\nwhile True: time.sleep(0.001)"]}
  hog-2: {role: command, argv: ["sh", "-c", "sleep 300 & exec sleep 300"]}
  # a wrapper whose child has a clean environment and a session of its own (no tag, no group)
  wrapper: {role: command, argv: ["{python}", "-c", "import subprocess, time; subprocess.Popen(['sleep', '301'], env={}, start_new_session=True); time.sleep(300)"]}
steps:
  - start: [hog-1, hog-2, wrapper]
""",
    "netns": """hosts: {ctl: netns, a: netns}
processes:
  server: {role: server, host: ctl}
  source-1: {role: source, host: a, options: {heartbeat_interval: 500ms}}
steps:
  - start: server
  - start: source-1
  - await: {process: source-1, event: status_change, where: {status: READY}}
  - fault: {kind: rate, target: a, rate: 1gbit, name: slow}
  - fault: {kind: partition, target: source-1, peer: server, name: cut}
""",
    "subject_modelexpress": """processes:
  server: {role: server}
  source-mx: {role: source, subject: modelexpress, options: {heartbeat_interval: 1s}}
steps:
  - start: server
  - start: source-mx
  - await: {process: source-mx, event: started}
""",
}


def _skip_reason(kind: str) -> str | None:
    if kind == "redis" and shutil.which("redis-server") is None:
        return "no redis-server installed"
    if kind == "toxiproxy" and capabilities.toxiproxy_server() is None:
        return "no toxiproxy-server installed (.venv/bin or PATH)"
    if kind == "netns" and any(shutil.which(t) is None for t in ("ip", "iptables", "tc")):
        return "needs iproute2, iptables and tc"
    if kind == "subject_modelexpress" and not subjects.env_ready("modelexpress"):
        return "the ModelExpress client's environment is not built (MXCHAOS_BUILD_SUBJECTS=0, or .ci/bootstrap not run)"
    return None


def _params() -> Iterator[object]:
    for kind in KINDS:
        marks = list(NEEDS_ROOT) if kind == "netns" else []
        reason = _skip_reason(kind)
        if reason is not None:
            marks.append(pytest.mark.skip(reason=reason))
        yield pytest.param(kind, marks=marks, id=kind)


# ---------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Seen:
    pid: int
    start: int
    cmdline: str


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of ``pid``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return ""


def _of_run(harness_pid: int | None, run_dir: Path) -> dict[int, Seen]:
    """The harness's descendants and every process working in, or naming, the run folder."""
    stats = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _stat(int(e))) is not None}
    found: set[int] = set()
    if harness_pid is not None:
        todo = [harness_pid]
        while todo:
            parent = todo.pop()
            for pid, (_state, ppid, _start) in stats.items():
                if ppid == parent and pid not in found:
                    found.add(pid)
                    todo.append(pid)
    for pid in stats:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(run_dir)):
                found.add(pid)
        if str(run_dir) in _cmdline(pid):
            found.add(pid)
    return {pid: Seen(pid, stats[pid][2], _cmdline(pid)) for pid in found if pid in stats and stats[pid][0] != "Z"}


def _still_alive(seen: dict[int, Seen]) -> list[Seen]:
    out = []
    for s in seen.values():
        now = _stat(s.pid)
        if now is not None and now[0] not in ("Z", "X") and now[2] == s.start:
            out.append(s)
    return out


def _ports(run_dir: Path) -> set[int]:
    """Every port the run's processes reported, and its toxiproxy's (API and proxies)."""
    ports: set[int] = set()
    for events in (run_dir / "procs").glob("*.events.jsonl"):
        for line in events.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == "listening" and isinstance(record.get("port"), int):
                    ports.add(record["port"])
    for line in (run_dir / "timeline.jsonl").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            value = entry.get("value") or {}
            if entry.get("actor") == "harness" and entry.get("f") in ("toxiproxy", "proxy") and entry.get("type") == "ok":
                for text in (value.get("api"), value.get("listen")):
                    port = str(text or "").rpartition(":")[2]
                    if port.isdigit():
                        ports.add(int(port))
    return ports


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.3):
        return True
    return False


def _leftovers(run_id: str, run_dir: Path, seen: dict[int, Seen]) -> list[str]:
    alive = {s.pid: s for s in _still_alive(seen)} | _of_run(None, run_dir)
    for entry in os.listdir("/proc"):  # ssh control masters of its hosts (named by their control socket)
        if entry.isdigit() and f"mxc-ssh-{netns.token(run_id)}-" in _cmdline(int(entry)):
            alive[int(entry)] = Seen(int(entry), 0, _cmdline(int(entry)))
    left = [f"process {pid}: {s.cmdline[:120]}" for pid, s in sorted(alive.items())]
    left += [f"port {port} open" for port in sorted(_ports(run_dir)) if _listening(port)]
    tok = netns.token(run_id)
    if shutil.which("ip"):
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False).stdout
        left += [f"netns {line.split()[0]}" for line in names.splitlines() if tok in line]
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10, check=False).stdout
        left += [f"link {line[:80]}" for line in links.splitlines() if tok in line or run_id in line]
    if os.geteuid() == 0 and shutil.which("iptables"):
        rules = subprocess.run(["iptables", "-w", "5", "-S"], capture_output=True, text=True, timeout=10, check=False).stdout
        left += [f"iptables {line}" for line in rules.splitlines() if f"mxc-{tok}" in line]
    if shutil.which("tc") and shutil.which("ip"):
        qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, timeout=10, check=False).stdout
        left += [f"qdisc {line}" for line in qdiscs.splitlines() if tok in line]
    files = [ledger.ledger_dir() / f"{run_id}.json", ledger.ledger_dir() / f"{run_id}.pids"]
    files += [Path(m) / "mxchaos" / run_id for m in _cgroup_mounts()]
    files += list(Path("/tmp").glob(f"mxc-ssh-{tok}-*"))
    left += [f"file {f}" for f in files if f.exists()]
    return left


def _cgroup_mounts() -> list[str]:
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            head, _, tail = line.partition(" - ")
            if tail.split()[:1] in (["cgroup"], ["cgroup2"]):
                mounts.append(head.split()[4])
    return mounts


# ---------------------------------------------------------------------------- one crash


@dataclass
class Crash:
    harness: subprocess.Popen[bytes]
    out: Path
    run_id: str = ""
    run_dir: Path = field(default_factory=Path)


def _timeline_entries(run_dir: Path) -> list[dict[str, object]]:
    out = []
    with contextlib.suppress(OSError):
        for line in (run_dir / "timeline.jsonl").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _await_sleep_step(crash: Crash, within: float) -> None:
    """Until the run's last step (the long sleep) is under way: every process of the kind is up."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if crash.harness.poll() is not None:
            break
        for run_json in crash.out.glob("*/*/run.json"):
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(run_json.read_text())
                crash.run_id, crash.run_dir = str(info["run_id"]), Path(str(info["run_dir"]))
        if crash.run_id:
            entries = _timeline_entries(crash.run_dir)
            for e in entries:
                value = e.get("value")
                if (e.get("f"), e.get("type")) == ("step", "invoke") and isinstance(value, dict) \
                        and str(value.get("text", "")).startswith("sleep"):
                    return
            failed = [e for e in entries if e.get("type") == "fail"]
            if failed:
                raise AssertionError(f"the run failed before its processes were up: {failed[:3]}")
        time.sleep(0.1)
    raise AssertionError(f"the run's sleep step did not start within {within:g}s (harness rc {crash.harness.poll()}); "
                         f"see {crash.out}")


@pytest.mark.parametrize("kind", list(_params()))
def test_a_sigkilled_harness_leaves_nothing_after_cleanup(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"soak_{kind}.yaml"
    path.write_text(HEAD.format(kind=kind) + KINDS[kind].replace("{python}", sys.executable) + SLEEP)
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's harness, also in the processes it starts
    harness = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(out), "-q"], cwd=REPO,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    crash = Crash(harness, out)
    try:
        _await_sleep_step(crash, within=90)
        seen = _of_run(harness.pid, crash.run_dir)
        assert seen, "the run started no process"
        os.kill(harness.pid, signal.SIGKILL)  # no teardown, no finally
        harness.wait(10)
        time.sleep(0.2)
        seen.update(_of_run(None, crash.run_dir))  # and whatever its processes did meanwhile
        assert _still_alive(seen), "nothing of the run outlived its harness: this soak would prove nothing"
        done = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup", "--run-id", crash.run_id], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        left = _leftovers(crash.run_id, crash.run_dir, seen)
        assert left == [], f"after `mxchaos cleanup --run-id {crash.run_id}`:\n" + "\n".join(left) + \
            f"\ncleanup said:\n{done.stdout}{done.stderr}"
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(10)
        if crash.run_id:  # whatever a failure left, for the next test's sake (by this test's own oracle too)
            from harness.commands.cleanup import sweep

            with contextlib.suppress(HarnessError, ValueError):
                sweep(crash.run_id)
            for s in _of_run(None, crash.run_dir).values():
                with contextlib.suppress(OSError):
                    os.kill(s.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- a lab host (ssh)

LAB_KIND = """hosts: {a: netns}
processes:
  store: {role: redis, host: a}
  wrapper: {role: command, host: a, argv: ["{python}", "-c", "import subprocess, time; subprocess.Popen(['sleep', '303'], env={}, start_new_session=True); time.sleep(300)"]}
steps:
  - start: [store, wrapper]
  - await: {process: store, event: listening}
"""
LAB_TOOLS = ("ip", "ssh", "ssh-keygen", "iptables", "tc", "redis-server")


def _ns_pids(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10, check=False).stdout
    return {int(x) for x in out.split() if x.isdigit()}


@pytest.fixture(scope="module")
def lab_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, object]]]:
    from harness.hosts import lab

    state = tmp_path_factory.mktemp("soaklab") / "lab"
    info = lab.up(1, inventory_out=state.parent / "inventory.yaml", state=state)
    try:
        yield state.parent / "inventory.yaml", info
    finally:
        lab.down(state)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the lab: network namespaces running sshd)")
@pytest.mark.skipif(any(shutil.which(t) is None for t in LAB_TOOLS) or not Path("/usr/sbin/sshd").exists(),
                    reason=f"needs {', '.join(LAB_TOOLS)} and openssh-server")
def test_a_sigkilled_harness_on_a_lab_host_leaves_nothing_after_cleanup(lab_host: tuple[Path, dict[str, object]],
                                                                        tmp_path: Path) -> None:
    """The same over ssh, on a lab host (a namespace running sshd): redis and a wrapper whose child
    has a clean environment and a session of its own, on the host; after ``mxchaos cleanup
    --run-id --inventory`` nothing of the run is in the host's namespace but its sshd (its
    sessions for the run included), its per-run folder is gone, and nothing is left here."""
    inventory, info = lab_host
    hosts = info["hosts"]
    assert isinstance(hosts, dict)
    host = hosts["h1"]
    listener = {int(host["sshd_pid"])}
    path = tmp_path / "soak_lab.yaml"
    path.write_text(HEAD.format(kind="lab") + LAB_KIND.replace("{python}", sys.executable) + SLEEP)
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    harness = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(path), "--out", str(out), "-q",
                                "--inventory", str(inventory)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    crash = Crash(harness, out)
    try:
        _await_sleep_step(crash, within=90)
        deadline = time.monotonic() + 30  # the wrapper's child is up (the wrapper reports nothing)
        while not any(_cmdline(pid) == "sleep 303" for pid in _ns_pids(str(host["netns"]))) and time.monotonic() < deadline:
            time.sleep(0.1)
        remote = _ns_pids(str(host["netns"])) - listener
        assert any(_cmdline(pid) == "sleep 303" for pid in remote), [_cmdline(p) for p in remote]
        seen = _of_run(harness.pid, crash.run_dir)
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait(10)
        done = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup", "--run-id", crash.run_id, "--inventory",
                               str(inventory)], cwd=REPO, env=env, capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        deadline = time.monotonic() + 15  # the sshd sessions of the run end once its ssh clients are gone
        while (_ns_pids(str(host["netns"])) - listener) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [f"on h1: process {pid}: {_cmdline(pid)[:120]}" for pid in sorted(_ns_pids(str(host["netns"])) - listener)]
        left += [f"on h1: dir {d}" for d in [Path(str(host["work_dir"])) / crash.run_id] if d.exists()]
        left += _leftovers(crash.run_id, crash.run_dir, seen)
        assert left == [], f"after `mxchaos cleanup --run-id {crash.run_id} --inventory`:\n" + "\n".join(left) + \
            f"\ncleanup said:\n{done.stdout}{done.stderr}"
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(10)
        if crash.run_id:
            from harness.commands.cleanup import sweep

            with contextlib.suppress(HarnessError, ValueError):
                sweep(crash.run_id)
            for pid in _ns_pids(str(host["netns"])) - listener:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _naming(folder: Path) -> set[int]:
    """Live processes whose command line (or process title: sshd's is one string) names ``folder``."""
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and str(folder) in _cmdline(int(e))
            and (st := _stat(int(e))) is not None and st[0] != "Z"}


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the lab: network namespaces running sshd)")
@pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen")) or not Path("/usr/sbin/sshd").exists(),
                    reason="needs iproute2, openssh-client and openssh-server")
@pytest.mark.alone  # a global `mxchaos cleanup`, from a state dir of its own: it cannot see the ledger of a
# neighbour's live run, and killed a scenario's server beside it once (CI, 2026-12-03)
def test_a_lab_up_sigkilled_mid_build_leaves_no_sshd_after_cleanup(tmp_path: Path) -> None:
    """``mxchaos lab up`` SIGKILLed once its first host's sshd runs (the others still being built):
    ``mxchaos cleanup`` removes the abandoned lab, no sshd of it (nor anything in its namespaces)
    is left, nor its namespaces, links or state dir."""
    from harness.hosts import lab

    env = {**os.environ, "PYTHONPATH": str(REPO), "MXCHAOS_STATE_DIR": str(tmp_path)}
    state = tmp_path / "lab"
    builder = subprocess.Popen([sys.executable, "-m", "harness.cli", "lab", "up", "--hosts", "6"], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (state / "hosts" / "h1" / "sshd.pid").exists() and builder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(builder.pid, signal.SIGKILL)
        builder.wait(10)
        info = lab.status(state)
        assert info is not None and info["status"] == "building", "the lab was built before the kill: nothing to prove"
        sshd = _naming(state)
        assert sshd, "no sshd of the lab was running at the kill"
        done = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        left = [f"process {pid}: {_cmdline(pid)}" for pid in sshd | _naming(state) if (st := _stat(pid)) is not None and st[0] != "Z"]
        left += lab.leftovers(state)
        assert left == [], f"after `mxchaos cleanup`: {left}\ncleanup said:\n{done.stdout}{done.stderr}"
    finally:
        if builder.poll() is None:
            builder.kill()
            builder.wait(10)
        with contextlib.suppress(HarnessError):
            lab.down(state)
