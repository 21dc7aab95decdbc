"""``SshHost`` without a network: the ssh command line each inventory setting gives, how the run
folder's paths and the harness's interpreter are rewritten for the host, which environment goes
over (never this machine's whole environment), and what ssh hosts cannot do (a SKIP naming it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine.nemesis import HostView
from harness.faults import make_fault
from harness.faults.netns import LinkDownSpec
from harness.hosts.base import ExecResult, LocalHost
from harness.hosts.inventory import parse_inventory
from harness.hosts.ssh import SshHost
from harness.scenario import parse_scenario
from harness.scenario.capabilities import missing_on_ssh

INVENTORY = """\
machines:
  h1: {address: 10.0.0.1, user: root, port: 2222, identity_file: /keys/id, known_hosts: {policy: strict, file: /kh},
       python: /opt/venv/bin/python, repo: /opt/mxchaos, work_dir: /var/tmp/mx, data: {address: 10.1.0.1, device: eth1},
       env: {UCX_LOG_LEVEL: warn}}
  h2: {address: 10.0.0.2, known_hosts: off, sudo: true}
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SshHost]:
    inv = parse_inventory(INVENTORY)
    made = SshHost("a", "h1", inv.machines["h1"], "run-x-1", tmp_path / "run")
    yield made
    for leftover in made._control_dir.glob("*"):
        leftover.unlink()
    if made._control_dir.exists():
        made._control_dir.rmdir()


def _option(argv: list[str], name: str) -> str:
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o" and argv[i + 1].startswith(f"{name}=")]
    assert len(values) == 1, (name, argv)
    return values[0].split("=", 1)[1]


def test_the_ssh_command_line_is_bounded_multiplexed_and_checks_the_host_key(host: SshHost) -> None:
    argv = host.ssh_argv()
    assert argv[0] == "ssh" and argv[-1] == "root@10.0.0.1" and argv[argv.index("-p") + 1] == "2222"
    assert _option(argv, "BatchMode") == "yes" and _option(argv, "ConnectTimeout") == "5"
    assert _option(argv, "ControlMaster") == "auto" and _option(argv, "ServerAliveInterval") == "2"
    assert _option(argv, "StrictHostKeyChecking") == "yes" and _option(argv, "UserKnownHostsFile") == "/kh"
    assert argv[argv.index("-i") + 1] == "/keys/id" and _option(argv, "IdentitiesOnly") == "yes"
    assert len(_option(argv, "ControlPath").replace("%C", "x" * 40)) < 100  # a unix socket path


def test_known_hosts_off_checks_nothing(tmp_path: Path) -> None:
    inv = parse_inventory(INVENTORY)
    other = SshHost("b", "h2", inv.machines["h2"], "run-x-1", tmp_path)
    argv = other.ssh_argv()
    other._control_dir.rmdir()
    assert _option(argv, "StrictHostKeyChecking") == "no" and _option(argv, "UserKnownHostsFile") == "/dev/null"
    assert argv[-1] == "10.0.0.2" and "-i" not in argv


def test_run_folder_paths_and_the_interpreter_are_rewritten_for_the_host(host: SshHost) -> None:
    events = host.run_dir / "procs" / "reader-1.events.jsonl"
    assert host.remote(f"--events={events}") == "--events=/var/tmp/mx/run-x-1/procs/reader-1.events.jsonl"
    assert host._translate(sys.executable) == "/opt/venv/bin/python"
    assert host._translate("mxref") == "mxref"
    assert host.address == "10.1.0.1" and host.inner_link == "eth1"  # the data plane, not the ssh address


def test_only_what_the_harness_set_goes_over_with_the_machines_env(host: SshHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_OF_THIS_MACHINE", "x")
    env = {**os.environ, "MXCHAOS_RUN_ID": "run-x-1", "MX_OUT": str(host.run_dir / "procs"), "PYTHONPATH": "/here"}
    got = host._remote_env(env)
    assert "SECRET_OF_THIS_MACHINE" not in got
    assert got["MXCHAOS_RUN_ID"] == "run-x-1" and got["MX_OUT"] == "/var/tmp/mx/run-x-1/procs"
    assert got["PYTHONPATH"] == "/opt/mxchaos" and got["UCX_LOG_LEVEL"] == "warn"


def test_the_clock_maps_remote_times_by_the_probed_offset(host: SshHost) -> None:
    assert host.local_mono(100.0) == 100.0  # not probed yet
    host.clock = {"start": {"offset_s": 2.5, "error_s": 0.001}}
    assert host.local_mono(102.5) == 100.0


def test_proxies_and_faults_without_an_ssh_lever_are_a_skip_naming_them(tmp_path: Path) -> None:
    inv = parse_inventory(INVENTORY)
    sc = parse_scenario("""
name: t
hosts: {a: netns, b: netns}
processes:
  server: {role: server, host: a}
  source-1: {role: source, host: a}
  reader-1: {role: reader, host: b, server_via: ctl}
proxies: {ctl: {upstream: server}}
steps:
  - start: [server, source-1, reader-1]
  - fault: {kind: toxic, proxy: ctl, type: latency, attributes: {latency: 100}, name: slow}
checks: [{nothing_leaked: {}}]
""")
    lacking, why = missing_on_ssh(sc, inv, "run-x-2", tmp_path)
    assert lacking == ["ssh-host"]
    assert "proxies (ctl)" in why and "fault slow (toxic): no lever on ssh hosts yet" in why


def test_more_hosts_than_machines_is_a_skip_naming_the_host(tmp_path: Path) -> None:
    inv = parse_inventory("machines: {h1: {address: 10.0.0.1}}")
    sc = parse_scenario("""
name: t
hosts: {a: netns, b: netns}
processes:
  server: {role: server, host: a}
  source-1: {role: source, host: b}
steps: [{start: [server, source-1]}]
checks: [{nothing_leaked: {}}]
""")
    lacking, why = missing_on_ssh(sc, inv, "run-x-3", tmp_path)
    assert lacking and "host 'b' cannot be bound" in why


def test_a_hosts_profile_sets_transport_and_accelerator_unless_the_process_names_its_own(tmp_path: Path) -> None:
    from harness.engine import launch

    sc = parse_scenario("""
name: t
hosts: {a: netns, b: netns}
processes:
  server: {role: server, host: a}
  source-1: {role: source, host: a}
  reader-1: {role: reader, host: b, options: {accelerator: cpu}}
steps: [{start: [server, source-1, reader-1]}]
checks: [{nothing_leaked: {}}]
""")

    def argv(name: str, **profile: object) -> list[str]:
        where = launch.Placement(run_dir=tmp_path, events_path=tmp_path / "e", log_path=tmp_path / "procs" / f"{name}.log",
                                 host_address="10.1.0.1", in_netns=True, incarnation=1, server_address="10.1.0.1:1",
                                 checkpoint=tmp_path / "c", **profile)  # type: ignore[arg-type]
        return launch.process_argv(sc, name, where)

    plain = argv("source-1")
    assert plain[plain.index("--transport") + 1] == "ucx-tcp-any" and "--accelerator" not in plain
    gpu = argv("source-1", transport="rdma", accelerator=("cuda", 1))
    assert gpu[gpu.index("--transport") + 1] == "rdma"
    assert gpu[gpu.index("--accelerator") + 1] == "cuda" and gpu[gpu.index("--device-id") + 1] == "1"
    own = argv("reader-1", transport="rdma", accelerator=("cuda", 1))
    assert own.count("--accelerator") == 1 and own[own.index("--accelerator") + 1] == "cpu"


def test_an_ssh_host_carries_its_machines_profile(tmp_path: Path) -> None:
    inv = parse_inventory("machines: {g: {address: 10.0.0.9, transport: rdma, accelerator: {kind: cuda, device: 2}}, "
                          "c: {address: 10.0.0.8}}")
    gpu = SshHost("a", "g", inv.machines["g"], "run-x-4", tmp_path)
    cpu = SshHost("b", "c", inv.machines["c"], "run-x-4", tmp_path)
    assert (gpu.transport, gpu.accelerator) == ("rdma", ("cuda", 2))
    assert (cpu.transport, cpu.accelerator) == (None, None)


class _OneHost:
    """The part of ``FaultContext`` ``link_down`` uses: every target is this host."""

    run_id = "run-x-1"

    def __init__(self, host: SshHost) -> None:
        self.host = host

    def locate(self, target: object) -> HostView:
        h = self.host
        return HostView(h.name, h.kind, h.address, h.fault_place(), h.link, h.inner_link)


def test_a_network_faults_commands_reach_an_ssh_host_through_its_own_shell_while_it_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = parse_inventory(INVENTORY)
    host = SshHost("b", "h2", inv.machines["h2"], "run-x-1", tmp_path)  # h2: sudo, no data device in the inventory
    host.inner_link = "eth9"
    lines: list[str] = []

    up = {"eth9": True}

    def answer(line: str, timeout: float) -> ExecResult:
        lines.append(line)
        if line.startswith("sudo -n ip link set dev eth9 "):
            up["eth9"] = line.endswith(" up")
        if " -o link show " in line:  # the witness reads the device's flags on the host
            flags = "BROADCAST,MULTICAST,UP,LOWER_UP" if up["eth9"] else "BROADCAST,MULTICAST"
            return ExecResult(0, f"3: eth9: <{flags}> mtu 1500 state DOWN", "", 0.0)
        return ExecResult(0, "", "", 0.0)

    monkeypatch.setattr(host.shell, "run", answer)
    place = host.fault_place()
    assert place.remote is host and place.name == "ssh:run-x-1:b"  # the name is only what records show
    host.connected = True  # as ``open`` leaves it
    fault = make_fault(LinkDownSpec(kind="link_down", target="b"), "down")
    injected = fault.inject(_OneHost(host))  # type: ignore[arg-type]
    assert lines == ["sudo -n ip link set dev eth9 down", "sudo -n ip -o link show dev eth9"]
    assert injected.record["on_host"] is True and injected.record["witness"]["effect"] == "seen"
    healed = fault.heal(_OneHost(host), injected.token) or {}  # type: ignore[arg-type]
    assert healed.pop("witness")["effect"] == "seen" and healed == {"link": "eth9", "up": True}
    assert lines[-2:] == ["sudo -n ip -o link show dev eth9", "sudo -n ip link set dev eth9 up"]
    host.connected = False  # closed: its heal has nothing left to reach
    healed = fault.heal(_OneHost(host), injected.token) or {}  # type: ignore[arg-type]
    assert healed.pop("witness")["effect"] == "unwitnessed" and healed == {"link": "eth9", "up": False}
    assert len(lines) == 4
    assert LocalHost("l").fault_place() is None


@pytest.mark.parametrize(("fault", "why"), [
    ("{kind: syscall, target: source-1, calls: [write], delay: 1ms, name: crawl}",
     "fault crawl (syscall): no lever on ssh hosts yet (strace attaches here by pid, and an ssh host's pids are not "
     "this machine's)"),
    ("{kind: disk, target: reader-1, mode: eio, name: failing}",
     "fault failing (disk): no lever on ssh hosts yet (its FUSE layer mounts over a checkpoint folder on this machine, "
     "and a reader on an ssh host reads its own)"),
])
def test_a_fault_that_acts_on_this_machine_alone_is_a_skip_on_ssh_hosts_saying_why(
        tmp_path: Path, fault: str, why: str) -> None:
    sc = parse_scenario(f"""
name: t
hosts: {{a: netns}}
processes:
  server: {{role: server, host: a}}
  source-1: {{role: source, host: a}}
  reader-1: {{role: reader, host: a}}
steps:
  - start: [server, source-1]
  - fault: {fault}
checks: [{{nothing_leaked: {{}}}}]
""")
    lacking, said = missing_on_ssh(sc, parse_inventory(INVENTORY), "run-x-3", tmp_path)
    assert lacking == ["ssh-host"] and why in said, said
