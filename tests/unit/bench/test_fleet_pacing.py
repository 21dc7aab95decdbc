"""``bench_fleet.Pacer``: the open-loop heartbeat schedule of ``--rate``."""

from __future__ import annotations

import threading

from mxref.bench.fleet import Pacer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Stop(threading.Event):
    """A stop event that records each sleep and lets the clock run through it."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.sleeps: list[float] = []
        self.set_now = False

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.sleeps.append(round(timeout, 6))
        self.clock.now += timeout
        return self.set_now

    def is_set(self) -> bool:
        return self.set_now


def test_sends_on_a_fixed_schedule_whatever_each_send_took() -> None:
    clock = Clock()
    stop = Stop(clock)
    pacer = Pacer(10.0, clock)  # one every 0.1 s
    assert pacer.wait(stop)  # the first is due at once: no sleep
    assert stop.sleeps == []
    clock.now += 0.03  # the send took 30 ms: the next one waits the rest of its interval
    assert pacer.wait(stop)
    clock.now += 0.25  # a slow send: the ones due meanwhile go at once, to keep the rate
    assert pacer.wait(stop)
    assert pacer.wait(stop)
    assert stop.sleeps == [0.07]
    assert pacer.wait(stop)  # caught up: waits again
    assert stop.sleeps == [0.07, 0.05]


def test_a_schedule_far_behind_restarts_from_now_instead_of_bursting() -> None:
    clock = Clock()
    stop = Stop(clock)
    pacer = Pacer(100.0, clock)
    assert pacer.wait(stop)
    clock.now += 5.0  # 500 sends behind
    assert pacer.wait(stop)  # goes now, and the schedule starts again from here
    assert pacer.wait(stop)
    assert stop.sleeps == [0.01]


def test_a_stop_during_the_wait_ends_it() -> None:
    clock = Clock()
    stop = Stop(clock)
    pacer = Pacer(1.0, clock)
    assert pacer.wait(stop)
    stop.set_now = True
    assert not pacer.wait(stop)
    assert stop.sleeps == [1.0]
