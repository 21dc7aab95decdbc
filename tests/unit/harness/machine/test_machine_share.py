"""``harness.machine.share``: shared holders run together, an alone holder runs with none of
them, a waiting alone holder is not starved by shared ones arriving after it, a wait is bounded,
and the pytest plugin says which items hold what."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.machine import runscope
from harness.machine import share as machine_share
from harness.machine.share import ShareTimeout, held_by_ancestor, hold


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(machine_share, "POLL_S", 0.005)
    return tmp_path / "state"


def _holder(alone: bool, log: list[str], name: str, stay_s: float, started: threading.Event | None = None) -> threading.Thread:
    def run() -> None:
        with hold(alone, wait_s=10):
            log.append(f"+{name}")
            if started is not None:
                started.set()
            time.sleep(stay_s)
            log.append(f"-{name}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_shared_holders_overlap() -> None:
    log: list[str] = []
    a_in, b_in = threading.Event(), threading.Event()
    a = _holder(False, log, "a", 0.3, a_in)
    assert a_in.wait(5)
    b = _holder(False, log, "b", 0.05, b_in)
    assert b_in.wait(5)  # b got in while a still held it
    a.join(5)
    b.join(5)
    assert log.index("+b") < log.index("-a")


def test_an_alone_holder_waits_for_the_shared_ones_and_keeps_later_ones_out() -> None:
    log: list[str] = []
    s1_in = threading.Event()
    s1 = _holder(False, log, "s1", 0.3, s1_in)
    assert s1_in.wait(5)
    solo = _holder(True, log, "solo", 0.2)
    time.sleep(0.05)  # solo now waits (holding the gate)
    s2 = _holder(False, log, "s2", 0.01)  # arrives after solo: must not slip in ahead of it
    for thread in (s1, solo, s2):
        thread.join(5)
    assert log.index("-s1") < log.index("+solo") < log.index("-solo") < log.index("+s2"), log


def test_a_wait_is_bounded_and_names_what_it_waited_for() -> None:
    in_, out = threading.Event(), threading.Event()

    def solo() -> None:
        with hold(True, wait_s=5):
            in_.set()
            out.wait(5)

    thread = threading.Thread(target=solo, daemon=True)
    thread.start()
    assert in_.wait(5)
    began = time.monotonic()
    with pytest.raises(ShareTimeout, match=r"waited 0\.2s for a share of the machine"), hold(False, wait_s=0.2):
        pass
    assert 0.2 <= time.monotonic() - began < 2
    out.set()
    thread.join(5)
    with hold(False, wait_s=1) as held:  # free again
        assert not held.alone and held.waited_s < 1


def test_the_plugin_says_who_holds_what() -> None:
    from harness.cli.pytest_plugin import ScenarioItem, _runs_alone

    class Item:
        def __init__(self, *markers: str) -> None:
            self.markers = set(markers)

        def get_closest_marker(self, name: str) -> object | None:
            return name if name in self.markers else None

    assert _runs_alone(Item()) is None  # type: ignore[arg-type]  # a unit test: nothing
    assert _runs_alone(Item("integration")) is False  # type: ignore[arg-type]
    assert _runs_alone(Item("integration", "alone")) is True  # type: ignore[arg-type]
    from harness.scenario import load_scenario

    root = Path(__file__).resolve().parents[4] / "scenarios"
    for name, alone in (("smoke", False), ("no_false_stall_under_cpu_load", True), ("tcp_reset_mid_read", True)):
        item = object.__new__(ScenarioItem)
        item.scenario = load_scenario(root / f"{name}.yaml")
        item.get_closest_marker = lambda _name: None  # type: ignore[method-assign,assignment]
        assert _runs_alone(item) is alone, name


def _ask_from_a_child() -> str:
    code = "from harness.machine.share import held_by_ancestor; print(held_by_ancestor())"
    # through a shell, so the holder is a grandparent: the walk goes up more than one step
    return subprocess.run(["sh", "-c", f'{sys.executable} -c "{code}"; true'], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def test_a_hold_is_seen_from_a_descendant_and_from_nowhere_else(state: Path) -> None:
    """A test of the plugin runs a pytest session of its own: that session's alone item must not
    wait for the share its own ancestor holds (it did: two such tests timed out in a CI run)."""
    assert _ask_from_a_child() == "None"
    with hold(False, wait_s=1):
        assert _ask_from_a_child() == "shared"
        assert held_by_ancestor() is None  # this process holds it; it is no ancestor of itself
    assert _ask_from_a_child() == "None"
    with hold(True, wait_s=1):
        assert _ask_from_a_child() == "alone"
    # a note of a holder that is gone (crashed) is removed, and so is one whose pid is now another
    # process's (this one's parent: a different start time); one this module did not write is left
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    parent = runscope.proc_stat(os.getppid())
    assert parent is not None
    (state / "share" / f"holder-{gone}-1-0").write_text("alone")
    (state / "share" / f"holder-{gone}-0").write_text("alone")  # an earlier version's note: no start time
    (state / "share" / f"holder-{parent.pid}-{parent.start + 1}-0").write_text("alone")
    (state / "share" / "holder-x-0").write_text("alone")
    assert held_by_ancestor() is None
    assert sorted(p.name for p in (state / "share").glob("holder-*")) == ["holder-x-0"]
    (state / "share" / f"holder-{parent.pid}-{parent.start}-0").write_text("alone")  # the parent itself
    assert held_by_ancestor() == "alone"


def test_the_plugin_takes_no_share_for_an_item_under_a_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli import pytest_plugin

    class Item:
        nodeid = "t::x"

        def __init__(self) -> None:
            self.user_properties: list[tuple[str, object]] = []

        def get_closest_marker(self, name: str) -> object | None:
            return name if name == "alone" else None

    monkeypatch.setattr(machine_share, "held_by_ancestor", lambda: "shared")
    item = Item()
    steps = pytest_plugin.pytest_runtest_protocol(item, None)  # type: ignore[arg-type]
    next(steps)
    with hold(True, wait_s=0.5):  # the item holds nothing: alone is free to take
        pass
    with pytest.raises(StopIteration):
        next(steps)
    assert item.user_properties == [("mxchaos_machine_share", "held by an ancestor (shared)")]
