"""Clock faults on ``ssh`` hosts without a network: the start's clock words (``unshare``, ``env
LD_PRELOAD=``) are the host's, put into the command line the host runs (its own libfaketime,
found there); the capability probe finds what clock faults need there; a scenario whose target's
host lacks it is a SKIP naming the host, the machine and the lack; and an ssh incarnation's
stamps are placed with its declared offset and the host's probed clock both taken off."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.engine.processes import ProcessTable, ProcState
from harness.engine.waits import RunClock
from harness.errors import FaultError
from harness.hosts.base import ExecResult, Proc, read_slice
from harness.hosts.clocks import HOST_CLOCKS, STAMP_SLACK_S, ClockOffsets
from harness.hosts.inventory import parse_inventory
from harness.hosts.ssh import SshHost
from harness.record.timeline import Timeline
from harness.scenario import parse_scenario
from harness.scenario.capabilities import missing_on_ssh

OFFSET = 259200.0  # 72 h
REMOTE_LIB = "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"  # another machine's library, not this one's

INVENTORY = """\
machines:
  h1: {address: 10.0.0.1, python: /opt/venv/bin/python, work_dir: /var/tmp/mx}
  h2: {address: 10.0.0.2, user: mx, sudo: true}
"""


class _Pid:
    pid = 4242

    def poll(self) -> int | None:
        return None


def _host(tmp_path: Path, machine: str = "h1", name: str = "replica") -> SshHost:
    inv = parse_inventory(INVENTORY)
    return SshHost(name, machine, inv.machines[machine], "run-clk-1", tmp_path / "run")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SshHost]:
    """An ssh host whose shell answers ``FAKETIME_PROBE`` with ``REMOTE_LIB`` (the lines sent
    are in ``host.sent``), whose spawn records the argv it is given and whose events files are
    read where the test writes them."""
    made = _host(tmp_path)
    sent: list[str] = []
    made.sent = sent  # type: ignore[attr-defined]
    made.answer = f"faketime-library {REMOTE_LIB}\n"  # type: ignore[attr-defined]

    def run(line: str, timeout: float) -> ExecResult:
        sent.append(line)
        return ExecResult(0, made.answer, "", 0.01)  # type: ignore[attr-defined]

    def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> Proc:
        made.spawned = list(argv)  # type: ignore[attr-defined]
        return _Pid()  # type: ignore[return-value]

    monkeypatch.setattr(made.shell, "run", run)
    monkeypatch.setattr(made, "spawn", spawn)
    monkeypatch.setattr(made, "read", lambda path, offset, limit=1 << 20: read_slice(path, offset, limit))  # no tail over ssh
    yield made
    for leftover in made._control_dir.glob("*"):
        leftover.unlink()
    if made._control_dir.exists():
        made._control_dir.rmdir()


def _table(host: SshHost, tmp_path: Path, now: list[float]) -> ProcessTable:
    timeline = Timeline(t0=900.0, clock=lambda: now[0])
    events = tmp_path / "server-b.events.jsonl"
    events.write_text("")
    state = ProcState("server-b", "server", host, events, tmp_path / "server-b.log")
    return ProcessTable(timeline, RunClock(timeline, run_budget=60, step_budget=10), [state])


def _wrapper_spec(line: str) -> dict[str, object]:
    """The JSON the remote wrapper is given (the last word of the launch line)."""
    spec = json.loads(shlex.split(line)[-1])
    assert isinstance(spec, dict)
    return spec


def test_a_monotonic_offset_starts_the_program_in_a_time_namespace_on_the_host(host: SshHost, tmp_path: Path) -> None:
    table = _table(host, tmp_path, [1000.0])
    table.spawn("server-b", [sys.executable, "-m", "mxref", "server"], {}, tmp_path, ClockOffsets(OFFSET, OFFSET))
    wrapped = host.spawned  # type: ignore[attr-defined]
    assert wrapped == ["unshare", "--time", "--monotonic=259200", "--boottime=259200", "--", sys.executable, "-m", "mxref", "server"]
    assert host.sent == []  # type: ignore[attr-defined]  # no libfaketime needed: nothing asked of the host
    spec = _wrapper_spec(host.launch_line(wrapped, env={}, cwd=tmp_path / "run", log_path=tmp_path / "run" / "procs" / "b.log"))
    # the wrapper execs unshare there, which execs the host's interpreter (the pid held is the program's)
    assert spec["argv"] == ["unshare", "--time", "--monotonic=259200", "--boottime=259200", "--", "/opt/venv/bin/python", "-m",
                            "mxref", "server"]


def test_a_wall_clock_offset_preloads_the_hosts_own_libfaketime(host: SshHost, tmp_path: Path) -> None:
    table = _table(host, tmp_path, [1000.0])
    value = table.spawn("server-b", [sys.executable, "-m", "mxref"], {}, tmp_path, ClockOffsets(realtime_s=-2))
    assert value["clocks"] == {"monotonic_s": 0.0, "boottime_s": 0.0, "realtime_s": -2.0}
    assert len(host.sent) == 1 and "libfaketimeMT.so.1" in host.sent[0]  # type: ignore[attr-defined]  # looked for there
    spec = _wrapper_spec(host.launch_line(host.spawned, env={}, cwd=tmp_path, log_path=tmp_path / "b.log"))  # type: ignore[attr-defined]
    assert spec["argv"] == ["env", f"LD_PRELOAD={REMOTE_LIB}", "FAKETIME=-2", "FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_NO_CACHE=1",
                            "/opt/venv/bin/python", "-m", "mxref"]
    host.wrap_clocks(["x"], ClockOffsets(realtime_s=5))
    assert len(host.sent) == 1  # type: ignore[attr-defined]  # found once per host


def test_a_host_without_libfaketime_is_a_fault_error_naming_it_and_nothing_is_started(host: SshHost, tmp_path: Path) -> None:
    host.answer = ""  # type: ignore[attr-defined]  # the probe printed nothing: no library there
    table = _table(host, tmp_path, [1000.0])
    with pytest.raises(FaultError, match=r"ssh host replica \(h1, 10\.0\.0\.1:22\) has no libfaketime") as caught:
        table.spawn("server-b", ["mxref"], {}, tmp_path, ClockOffsets(realtime_s=-2))
    assert "apt-get install faketime" in str(caught.value)
    assert table.timeline.entries() == [] and not hasattr(host, "spawned")


def test_the_probe_finds_root_login_unshare_timens_and_faketime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    out = {"h1": f"0\nip\nunshare\ntimens\nfaketime-library {REMOTE_LIB}\n", "h2": "1000\nunshare\nsudo\n"}

    def checked(self: SshHost, command: str, what: str, timeout: float | None = None) -> ExecResult:
        sent.append(command)
        return ExecResult(0, out[self.machine_name], "", 0.1)

    monkeypatch.setattr(SshHost, "_checked", checked)
    root = _host(tmp_path)
    assert root.capabilities() == {"root", "root-login", "ip", "unshare", "timens", "faketime"} and root.faketime == REMOTE_LIB
    assert "command -v $p" in sent[0] and " unshare;" in sent[0] and "/proc/self/ns/time" in sent[0] and REMOTE_LIB in sent[0]
    sudoer = _host(tmp_path, "h2")  # sudo makes network faults root, not the login a process starts as
    assert sudoer.capabilities() == {"root", "unshare"} and sudoer.faketime is None


def _clock_scenario(kind: str) -> str:
    fault = "{kind: clock, target: server-b, monotonic: +72h, name: early}" if kind == "clock" else \
        "{kind: wall_clock, target: server-b, offset: -2s, name: behind}"
    return f"""
name: t
hosts: {{main: local, replica: local}}
processes:
  server-a: {{role: server, host: main}}
  server-b: {{role: server, host: replica}}
steps:
  - start: server-a
  - fault: {fault}
checks: [{{nothing_leaked: {{}}}}]
"""


@pytest.mark.parametrize(("kind", "lacking", "named"), [
    ("clock", {"root-login", "timens"}, "fault early (clock): host replica (machine h2) lacks root-login (the ssh login is not "
                                        "uid 0; a process starts as the login, never through sudo), timens (no /proc/self/ns/time"),
    ("wall_clock", {"faketime"}, "fault behind (wall_clock): host replica (machine h2) lacks faketime (no libfaketime in"),
], ids=["clock", "wall_clock"])
def test_a_clock_fault_whose_targets_host_lacks_its_needs_is_a_skip_naming_host_and_lack(
    kind: str, lacking: set[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = {"root", "root-login", "unshare", "timens", "faketime"}
    probed: list[str] = []

    def caps(self: SshHost, *, hardware: bool = False) -> set[str]:
        probed.append(self.machine_name)
        return full - lacking if self.machine_name == "h2" else full

    monkeypatch.setattr(SshHost, "capabilities", caps)
    monkeypatch.setattr(SshHost, "close_master", lambda self: None)
    inv = parse_inventory(INVENTORY)
    sc = parse_scenario(_clock_scenario(kind))
    found, why = missing_on_ssh(sc, inv, "run-clk-2", tmp_path)
    assert found == ["ssh-host"] and named in why, why
    assert sorted(probed) == ["h1", "h2"]
    # the same lacks on the host that only runs server-a: the replica's host has all, nothing lacks
    swapped = parse_inventory(INVENTORY.replace("h1:", "hx:").replace("h2:", "h1:").replace("hx:", "h2:"))
    assert missing_on_ssh(sc, swapped, "run-clk-3", tmp_path) == ([], "")


def test_an_ssh_incarnations_stamps_lose_its_offset_and_the_hosts_clock_and_are_still_bounded(host: SshHost, tmp_path: Path) -> None:
    host.clock = {"start": {"offset_s": 2.5, "error_s": 0.25}}  # the host's monotonic is ours + 2.5 s (probed at open)
    now = [1000.0]
    table = _table(host, tmp_path, now)
    table.spawn("server-b", ["mxref"], {}, tmp_path, ClockOffsets(OFFSET, OFFSET))
    events = tmp_path / "server-b.events.jsonl"

    def emit(event: str, mono: float, pid: int = 4242) -> tuple[float, Any]:
        with open(events, "a") as out:
            out.write(json.dumps({"event": event, "mono": mono, "pid": pid}) + "\n")
        table.drain(["server-b"])
        entry = [e for e in table.timeline.entries() if e.f == event][-1]
        return entry.t, entry.value.get("clock_rejected")

    now[0] = 1002.0
    t, rejected = emit("listening", 1001.5 + 2.5 + OFFSET)  # written at our 1001.5
    assert t == pytest.approx(101.5) and rejected is None
    # the slack is the stamp bound's plus the host's probe error: 0.7 s after the read is believed, 0.8 s is not
    t, rejected = emit("late_but_within", 1002.0 + 2.5 + OFFSET + STAMP_SLACK_S + 0.2)
    assert t == pytest.approx(102.7) and rejected is None
    t, rejected = emit("too_late", 1002.0 + 2.5 + OFFSET + STAMP_SLACK_S + 0.3)
    assert t == pytest.approx(102.0) and "after the harness read it" in str(rejected)
    # an incarnation started on the host's clocks whose stamps are 72 h ahead anyway: not believed
    table.state("server-b").exit_recorded = True
    table.spawn("server-b", ["mxref"], {}, tmp_path, HOST_CLOCKS)
    t, rejected = emit("undeclared", 1001.5 + 2.5 + OFFSET)
    assert t == pytest.approx(102.0) and "after the harness read it" in str(rejected)
