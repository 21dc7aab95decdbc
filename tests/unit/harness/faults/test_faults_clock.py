"""The clock and wall_clock faults over the fake context: it stops a running target and starts its next
incarnation with the offsets (a target never started is only started); its offsets are whole
seconds with a sign, and a fault that moves no clock is refused; a process it starts counts as
started for the scenario's start order."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.fault_context import FakeContext
from pydantic import ValidationError

from harness.errors import ScenarioInvalid
from harness.faults import clock, make_fault
from harness.faults.clock import ClockSpec, WallClockSpec, parse_offset
from harness.hosts.clocks import ClockOffsets
from harness.record.witness import Witness
from harness.scenario import parse_scenario

TIMENS, FAKETIME = clock.timens_witness, clock.faketime_witness  # as written (the fixture stands in for them)


def spec(**kw: object) -> ClockSpec:
    return ClockSpec.model_validate({"kind": "clock", "target": "server-b", **kw})


@pytest.mark.parametrize(("given", "seconds"), [("+72h", 259200.0), ("-90s", -90.0), ("1.5h", 5400.0), (3600, 3600.0),
                                                ("0", 0.0), ("-0s", 0.0)])
def test_an_offset_is_signed_seconds(given: object, seconds: float) -> None:
    assert parse_offset(given) == seconds


def test_boottime_follows_monotonic_unless_given() -> None:
    assert spec(monotonic="+72h").offsets() == ClockOffsets(259200, 259200)
    assert spec(monotonic="+72h", boottime="+73h").offsets() == ClockOffsets(259200, 262800)
    assert spec(boottime="-1h").offsets() == ClockOffsets(0, -3600)


@pytest.mark.parametrize(("kw", "says"), [
    ({}, "a clock fault needs monotonic or boottime not 0"),
    ({"monotonic": 0}, "a clock fault needs monotonic or boottime not 0"),
    ({"monotonic": "1.5s"}, "a whole number of seconds"),
    ({"monotonic": "72 hours"}, "a whole number of seconds"),
    ({"monotonic": True}, "a whole number of seconds"),
    ({"monotonic": "+100000h"}, "at most 10 years"),
    ({"monotonic": "+1h", "if_gone": "skip"}, "does not need a running process"),
])
def test_bad_clock_faults_are_refused_naming_the_rule(kw: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(**kw)
    assert says in str(err.value)


def test_a_running_target_is_stopped_and_started_again_with_its_offsets() -> None:
    ctx = FakeContext()
    ctx.add_process("server-b", role="server")
    fault = make_fault(spec(monotonic="+72h", grace="2s"), "booted_earlier")
    injected = fault.inject(ctx)
    assert ctx.recorded("stop") == [("server-b", 2.0)]
    (started,) = ctx.recorded("start")
    assert started[0] == "server-b" and started[2] == {"monotonic_s": 259200.0, "boottime_s": 259200.0}
    assert injected.token is None
    assert injected.record["clocks"] == {"monotonic_s": 259200.0, "boottime_s": 259200.0}
    assert injected.record["started"]["incarnation"] == 2
    assert fault.heal(ctx, None) is None  # nothing outlives the incarnation


def test_a_target_never_started_is_only_started() -> None:
    ctx = FakeContext()
    ctx.add_process("server-b", role="server", alive=False)
    record = make_fault(spec(monotonic="-10s"), "c").inject(ctx).record
    assert "stopped" not in record and ctx.recorded("stop") == []
    assert ctx.recorded("start")[0][2] == {"monotonic_s": -10.0, "boottime_s": -10.0}


def test_a_wall_clock_fault_restarts_its_target_with_the_wall_clock_offset_alone() -> None:
    ctx = FakeContext()
    ctx.add_process("server-b", role="server")
    wall = WallClockSpec.model_validate({"kind": "wall_clock", "target": "server-b", "offset": "-2s", "grace": "1s"})
    record = make_fault(wall, "behind").inject(ctx).record
    assert record["clocks"] == {"monotonic_s": 0.0, "boottime_s": 0.0, "realtime_s": -2.0}
    assert ctx.recorded("stop") == [("server-b", 1.0)]
    assert ctx.recorded("start")[0][2] == record["clocks"]
    assert wall.started_refs() == ("server-b",)
    with pytest.raises(ValidationError, match="needs an offset not 0"):
        WallClockSpec.model_validate({"kind": "wall_clock", "target": "server-b", "offset": 0})


SCENARIO = """\
name: demo
processes:
  server: {role: server}
  source-1: {role: source}
steps:
  - FIRST
  - start: source-1
"""


def test_a_process_the_fault_starts_counts_as_started_for_the_start_order() -> None:
    sc = parse_scenario(SCENARIO.replace("FIRST", "fault: {kind: clock, target: server, monotonic: +1h}"), "x.yaml")
    assert [type(s).__name__ for s in sc.steps] == ["FaultStep", "StartStep"]
    with pytest.raises(ScenarioInvalid) as err:  # a fault that starts nothing does not count
        parse_scenario(SCENARIO.replace("FIRST", "mark: m"), "x.yaml")
    assert "'source-1' is started before its server 'server'" in str(err.value)


def fake_proc(tmp_path: Path, pid: int, offsets: str, same_namespace: bool = False) -> Path:
    """A /proc with ``pid``'s time namespace (its offsets) and the harness's own (``self``)."""
    (tmp_path / str(pid) / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / str(pid) / "timens_offsets").write_text(offsets)
    (tmp_path / "self" / "ns" / "time").symlink_to("time:[4026531834]")
    (tmp_path / str(pid) / "ns" / "time").symlink_to("time:[4026531834]" if same_namespace else "time:[4026532174]")
    return tmp_path


def test_timens_offsets_are_read_as_the_kernel_writes_them() -> None:
    assert clock.read_timens_offsets("monotonic   259200         0\nboottime  -10 500000000\n") == {
        "monotonic": 259200.0, "boottime": -9.5}
    assert clock.read_timens_offsets("garbage\n") == {}


def test_a_clock_faults_witness_is_its_targets_time_namespace(tmp_path: Path) -> None:
    asked = ClockOffsets(259200.0, 259200.0)
    seen = TIMENS(7, asked, fake_proc(tmp_path / "a", 7, "monotonic 259200 0\nboottime 259200 0\n"))
    assert seen.effect == "seen" and seen.figures["monotonic_s"] == 259200.0 and "asked" not in seen.why
    host = TIMENS(7, asked, fake_proc(tmp_path / "b", 7, "monotonic 0 0\nboottime 0 0\n", True))
    assert host.effect == "none" and "the host's own namespace" in host.why
    assert TIMENS(8, asked, tmp_path / "a").effect == "unwitnessed"  # gone


def test_a_wall_clock_witness_needs_libfaketime_in_the_targets_memory(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "maps").write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    (tmp_path / "7" / "environ").write_bytes(b"PATH=/bin\0FAKETIME=-2\0")
    missing = FAKETIME(7, ClockOffsets(realtime_s=-2.0), tmp_path)
    assert missing.effect == "none" and "no libfaketime" in missing.why
    assert FAKETIME(8, ClockOffsets(realtime_s=-2.0), tmp_path).effect == "unwitnessed"


@pytest.fixture(autouse=True)
def no_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake context's pids are no processes here: their clocks are not read from /proc."""
    for name in ("timens_witness", "faketime_witness"):
        monkeypatch.setattr(clock, name, lambda pid, offsets: Witness.seen("measured", pid=pid))


def test_the_inject_records_the_witness_of_the_new_incarnation() -> None:
    ctx = FakeContext()
    ctx.add_process("server-b", role="server")
    record = make_fault(spec(monotonic="+72h"), "c").inject(ctx).record
    assert record["witness"] == {"effect": "seen", "why": "measured", "figures": {"pid": ctx.procs["server-b"].pid}}
