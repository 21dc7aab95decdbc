"""A source's refit (``mxref.roles.source.Refit``) and its trigger: the drain waits for leases given
back or run out, bounded by its timeout; only a drain that ended writes the weights, counts a
generation and admits leases again; one that timed out writes nothing and admits again. With
``--debug-hooks`` SIGHUP asks it, and the write leaves the weights as they were."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from mxref.__main__ import parse_argv
from mxref.debug_hooks import CorruptionToggle
from mxref.events import EventLog
from mxref.model import ModelSpec, Reference, generate
from mxref.modelexpress.worker import Leases
from mxref.options import SourceFlags
from mxref.roles.source import Refit, lease_events


class Donor:
    def __init__(self, tmp_path: Path, lifetime_s: float, drain_timeout_s: float) -> None:
        self.path = tmp_path / "source.jsonl"
        self.events = EventLog(self.path, "source-1", "source")
        self.leases = Leases(lifetime_s, on_change=lease_events(self.events, lifetime_s))
        self.refit = Refit(self.leases, self.events, drain_timeout_s)
        self.writes = 0

    def mutate(self) -> int:
        assert not self.leases.accepting, "weights are written only while no lease can be taken"
        self.writes += 1
        return 8

    def log(self, name: str | None = None) -> list[dict[str, Any]]:
        records = [json.loads(line) for line in self.path.read_text().splitlines()]
        return [r for r in records if name is None or r["event"] == name]

    def names(self) -> list[str]:
        return [r["event"] for r in self.log()]


def test_a_drain_with_no_lease_writes_at_once_and_reopens(tmp_path: Path) -> None:
    donor = Donor(tmp_path, 60, 5)
    assert donor.refit.refit(donor.mutate) is True
    assert donor.names() == ["drain_started", "drain_done", "refit"]
    done = donor.log("drain_done")[0]
    assert (done["outstanding"], done["released"], done["expired"]) == (0, 0, 0) and done["waited_s"] < 1.0
    assert donor.log("refit")[0]["generation"] == 1 and donor.refit.generation == 1
    assert donor.leases.accepting and donor.writes == 1


def test_the_drain_waits_for_a_lease_given_back(tmp_path: Path) -> None:
    donor = Donor(tmp_path, 60, 5)
    held = donor.leases.prepare()
    timer = threading.Timer(0.1, donor.leases.release, args=(held,))
    timer.start()
    try:
        assert donor.refit.refit(donor.mutate) is True
    finally:
        timer.join(5)
    done = donor.log("drain_done")[0]
    assert (done["outstanding"], done["released"], done["expired"]) == (1, 1, 0) and done["waited_s"] >= 0.09
    assert donor.names() == ["lease_granted", "drain_started", "lease_returned", "drain_done", "refit"]


def test_the_lease_of_a_vanished_holder_ends_the_drain_when_it_runs_out(tmp_path: Path) -> None:
    donor = Donor(tmp_path, 0.3, 5)
    lease_id = donor.leases.prepare()  # its holder never comes back
    assert donor.refit.refit(donor.mutate) is True
    done = donor.log("drain_done")[0]
    assert (done["outstanding"], done["released"], done["expired"]) == (1, 0, 1)
    assert 0.2 <= done["waited_s"] < 2.0
    assert donor.log("lease_expired") == [{**donor.log("lease_expired")[0], "lease_id": lease_id}]
    assert donor.log("lease_granted")[0]["lifetime_s"] == 0.3


def test_a_drain_that_times_out_writes_nothing_and_admits_again(tmp_path: Path) -> None:
    donor = Donor(tmp_path, 60, 0.1)
    donor.leases.prepare()
    assert donor.refit.refit(donor.mutate) is False
    timed_out = donor.log("drain_timed_out")[0]
    assert (timed_out["live"], timed_out["timeout_s"]) == (1, 0.1) and timed_out["waited_s"] >= 0.1
    assert donor.writes == 0 and donor.refit.generation == 0 and donor.leases.accepting
    assert "drain_done" not in donor.names() and "refit" not in donor.names()


def test_a_write_that_fails_still_admits_leases_again(tmp_path: Path) -> None:
    donor = Donor(tmp_path, 60, 1)

    def broken() -> int:
        raise OSError("write failed")

    with pytest.raises(OSError):
        donor.refit.refit(broken)
    assert donor.leases.accepting and donor.refit.generation == 0


def test_sighup_asks_a_refit_whose_write_leaves_the_weights_as_they_were() -> None:
    arena = generate(ModelSpec(tensors=4, tensor_bytes=256, seed=3))
    before = Reference.from_arena(arena).digest
    done = threading.Semaphore(0)
    written: list[int] = []
    inherited = signal.getsignal(signal.SIGHUP)  # SIG_DFL, or SIG_IGN under nohup
    hooks = CorruptionToggle(lambda event, **f: None, arena).install()

    def refit() -> None:
        written.append(hooks.rewrite())
        done.release()

    hooks.on_refit(refit)
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        assert done.acquire(timeout=5), "no refit after SIGHUP"
    finally:
        hooks.close()
    assert written == [4] and Reference.from_arena(arena).digest == before
    assert signal.getsignal(signal.SIGHUP) == inherited  # given back as it was found


def parse(*argv: str) -> SourceFlags:
    args = parse_argv(["source", *argv])
    assert isinstance(args, SourceFlags)
    return args


def test_lease_and_drain_flags_are_bounded_durations(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--lease-seconds", "4s", "--drain-timeout", "500ms")
    assert (args.lease_seconds, args.drain_timeout) == (4.0, 0.5)
    assert (parse().lease_seconds, parse().drain_timeout) == (None, None)
    for flag, value in (("--lease-seconds", "2d"), ("--lease-seconds", "0"), ("--drain-timeout", "90000")):
        with pytest.raises(SystemExit):
            parse(flag, value)
    assert "at most 86400 s" in capsys.readouterr().err
