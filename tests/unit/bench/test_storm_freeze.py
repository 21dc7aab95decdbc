"""The storm's freeze (``mxref.bench.storm_procs.Freeze``) on a real child process: it stops the
child when its timer fires, thaws it when closed, and a timer that fires after the close stops
nothing; ``deferred_signals`` holds a SIGINT back until its block is done."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from mxref.bench.storm_procs import Freeze, LineChild, deferred_signals


def state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()[0]


def until(pid: int, wanted: str, within_s: float = 10.0) -> str:
    deadline = time.monotonic() + within_s
    while state(pid) != wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    return state(pid)


@pytest.fixture
def child(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = LineChild("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "sleeper.log",
                  stdin_quits=False)
    yield c
    c.stop()


def test_a_freeze_stops_the_child_and_its_close_thaws_it(child: LineChild) -> None:
    frost = Freeze(child, 0.05)
    frost.start()
    assert until(child.popen.pid, "T") == "T"
    frost.close()
    assert until(child.popen.pid, "S") == "S" and frost.landed


def test_a_timer_that_fires_after_the_close_stops_nothing(child: LineChild) -> None:
    frost = Freeze(child, 0.05)
    frost.close()  # the round ended before the freeze was due
    frost._fire()  # a timer that was already on its way
    time.sleep(0.1)
    assert state(child.popen.pid) != "T" and not frost.landed


def test_stop_ends_a_stopped_child(child: LineChild) -> None:
    os.kill(child.popen.pid, signal.SIGSTOP)
    assert until(child.popen.pid, "T") == "T"
    t0 = time.monotonic()
    assert child.stop() == -signal.SIGTERM
    assert time.monotonic() - t0 < 5  # thawed, it acts on the SIGTERM at once, no wait for SIGKILL


def test_a_sigint_while_deferred_is_raised_after_the_block() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), deferred_signals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        done.append("the block ran to its end")
    assert done == ["the block ran to its end"]


def test_cpu_s_counts_the_child_s_cpu_as_the_kernel_does(tmp_path: Path) -> None:
    spinner = LineChild("spinner", [sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                                    "while time.process_time() < end: pass\ntime.sleep(60)"],
                        tmp_path / "spinner.log", stdin_quits=False)
    sleeper = LineChild("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "sleeper.log",
                        stdin_quits=False)
    try:
        deadline = time.monotonic() + 60
        while spinner.cpu_s() < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        spun, slept = spinner.cpu_s(), sleeper.cpu_s()
        assert 0.5 <= spun < 5.0
        assert slept < spun
    finally:
        spinner.stop()
        sleeper.stop()
    assert spinner.cpu_s() == 0.0  # gone: nothing to count
