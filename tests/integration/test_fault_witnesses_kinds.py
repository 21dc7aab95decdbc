"""Every fault proves it landed (issue 35), for the kinds whose witness is a measurement of their
own machinery: the disk fault's FUSE layer counts the calls it faulted, strace marks the calls
it failed or delayed, a disabled proxy's refusals are counted at the listener, a clock fault's
time namespace is read from /proc, a drain's start and its live leases, with the target's
SIGHUP handler read from /proc, a toxic read back from toxiproxy and probed through its proxy.
Each lands on a live target (effect seen, the run passes) and is aimed at nothing (no effect:
NOT EXERCISED). The targets are the fake mxref of tests/fixtures/fakeproc.py on this machine,
or real mxref where the fault needs its hooks (or, for the toxic's probe, a gRPC server)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from fixtures.witness_runs import SMALL, corrupt, drain, one_source, toxic_on, witnessed
from fixtures.witness_runs import run_witnessed as run

from harness.hosts.base import LocalHost
from harness.scenario import capabilities

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

def needs(*caps: str) -> pytest.MarkDecorator:
    lacking = capabilities.missing(caps)
    return pytest.mark.skipif(bool(lacking), reason=f"this machine lacks {', '.join(lacking)}")


# ---------------------------------------------------------------------------- disk

DISK = """\
    budgets: {step: 15s, run: 40s, stop_grace: 2s}
    processes:
      server: {role: server}
      reader-1: {role: reader, extra_args: [--fake-read-checkpoint]}
    steps:
      - start: server
      - fault: {kind: disk, target: reader-1, mode: eio, name: failing%s}
      - start: reader-1
      - await: {process: reader-1, exit: true, code: any}
      - heal: failing
    checks:
      - nothing_leaked: {}
"""


@needs("root", "fuse")
def test_a_disk_fault_a_read_met_is_seen_and_one_matching_no_file_is_not_exercised(tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", DISK % "")
    effect, figures = witnessed(landed)["failing"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["faulted"] >= 1 and figures["by_call"]["read"] >= 1
    missed = run(tmp_path / "missed", DISK % ', match: ["*.nothing"]')  # no file of the folder matches
    assert (missed.verdict, witnessed(missed)["failing"][0]) == ("not_exercised", "none")
    assert "no call through the FUSE layer" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- syscall

def syscall(calls: str) -> str:
    """A syscall fault named ``crawl`` delaying ``calls`` of the fake source by 1 ms, for 1 s."""
    return one_source(f"      - fault: {{kind: syscall, target: source-1, calls: [{calls}], delay: 1ms, name: crawl}}\n"
                      "      - sleep: 1s\n      - heal: crawl", budgets="step: 10s, run: 40s, stop_grace: 2s")


@needs("root", "strace")
def test_a_syscall_fault_strace_delayed_is_seen_and_one_on_a_call_never_made_is_not_exercised(tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", syscall("write"))  # each heartbeat event is a write(2)
    effect, figures = witnessed(landed)["crawl"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["delayed"]["write"] >= 1
    missed = run(tmp_path / "missed", syscall("mknodat"))  # a call the source never makes
    assert (missed.verdict, witnessed(missed)["crawl"][0]) == ("not_exercised", "none")
    assert "0 calls failed, 0 delayed of 0 traced" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- proxy_down

PROXY_DOWN = """\
    budgets: {step: 10s, run: 40s, stop_grace: 2s}
    proxies:
      mds: {upstream: server}
    processes:
      server: {role: server}
      source-1: {role: source, server_via: mds}
      reader-1: {role: reader, server_via: mds}
    steps:
      - start: [server, source-1]
      - await: {process: source-1, event: status_change, where: {status: READY}}
      - fault: {kind: proxy_down, proxy: mds, name: down}
%s
      - heal: down
    checks:
      - nothing_leaked: {}
"""


@needs("root", "iptables", "toxiproxy")
def test_a_proxy_down_a_connection_met_is_seen_and_one_nothing_tried_is_not_exercised(tmp_path: Path) -> None:
    # the fake reader's first act is a connect to its server, here through the disabled proxy: refused
    tried = "      - start: reader-1\n      - await: {process: reader-1, exit: true, code: any}"
    landed = run(tmp_path / "landed", PROXY_DOWN % tried)
    effect, figures = witnessed(landed)["down"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["refused_syns"] >= 1
    missed = run(tmp_path / "missed", PROXY_DOWN % "      - sleep: 500ms")  # nothing connects while it is down
    assert (missed.verdict, witnessed(missed)["down"]) == ("not_exercised", ("none", {"cut": 0, "refused_syns": 0}))
    assert "nothing tried it while it was down" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- toxic (real mxref: a gRPC server)

LATENCY = "type: latency, toxicity: %s, attributes: {latency: 300ms}"


@needs("toxiproxy")
def test_a_latency_toxic_is_seen_by_a_probe_through_its_proxy_and_one_applied_to_no_connection_is_not_exercised(
        tmp_path: Path) -> None:
    # the source heartbeats through the proxy (its clients' traffic); the probe is the harness's own call
    landed = run(tmp_path / "landed", toxic_on("mds", LATENCY % 1, name="slow"), fake=False)
    assert landed.verdict == "pass", landed.not_exercised
    (inject, heal) = next(w for w in landed.history.fault_windows() if w.name == "slow").witnesses
    assert (inject.effect, heal.effect) == ("seen", "seen"), (inject, heal)
    figures = dict(inject.figures)
    assert figures["listed_toxicity"] == 1 and figures["through_code"] == figures["direct_code"] == "ACK"
    assert figures["added_ms"] >= 150, figures  # at least half the 300 ms toxiproxy adds to the probe's round trip
    # the same toxic applied to no connection: the source's traffic still went through the proxy
    missed = run(tmp_path / "missed", toxic_on("mds", LATENCY % 0, name="slow"), fake=False)
    assert (missed.verdict, witnessed(missed)["slow"][0]) == ("not_exercised", "none")
    assert "with toxicity 0" in missed.not_exercised[0] and "applies to no connection" in missed.not_exercised[0]
    # a toxic that works on a proxy no client uses: the probe's own connection is not its clients' traffic
    # (a held probe too: its connection is closed, not left open in the proxy's counts)
    for toxic in (LATENCY % 1, "type: timeout, stream: downstream, attributes: {timeout: 0}"):
        idle = run(tmp_path / "idle", toxic_on("idle", toxic, name="slow"), fake=False)
        (inject, heal) = next(w for w in idle.history.fault_windows() if w.name == "slow").witnesses
        assert (idle.verdict, inject.effect, heal.effect) == ("not_exercised", "seen", "none"), (toxic, inject, heal)
        assert heal.figures["closed_bytes"] == 0 and "no connection through proxy idle" in idle.not_exercised[0]


# ---------------------------------------------------------------------------- clock, wall_clock

def clock(fault: str) -> str:
    """A clock fault (``fault``: its kind and keys) named ``skew`` on the fake source, 500 ms."""
    return one_source(f"      - fault: {{{fault}, target: source-1, name: skew}}\n      - sleep: 500ms",
                      budgets="step: 10s, run: 40s, stop_grace: 2s")


def _clocks_ignored(self: object, argv: Sequence[str], offsets: object) -> list[str]:
    return list(argv)  # the planted regression: a host that starts the program on its own clocks


@needs("root", "unshare", "timens")
def test_a_clock_fault_is_seen_in_its_targets_time_namespace_and_one_not_applied_is_not_exercised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landed = run(tmp_path / "landed", clock("kind: clock, monotonic: +72h"))
    effect, figures = witnessed(landed)["skew"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert (figures["monotonic_s"], figures["boottime_s"], figures["own_namespace"]) == (259200.0, 259200.0, True)
    monkeypatch.setattr(LocalHost, "wrap_clocks", _clocks_ignored)
    missed = run(tmp_path / "missed", clock("kind: clock, monotonic: +72h"))
    assert (missed.verdict, witnessed(missed)["skew"][0]) == ("not_exercised", "none")
    assert "monotonic +0s, boottime +0s (the host's own namespace)" in missed.not_exercised[0]


@needs("faketime")
def test_a_wall_clock_fault_is_seen_in_its_targets_memory_and_one_not_applied_is_not_exercised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landed = run(tmp_path / "landed", clock("kind: wall_clock, offset: -5s"))
    effect, figures = witnessed(landed)["skew"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["measured_s"] == pytest.approx(-5.0, abs=0.5) and "libfaketime" in figures["library"]
    monkeypatch.setattr(LocalHost, "wrap_clocks", _clocks_ignored)
    missed = run(tmp_path / "missed", clock("kind: wall_clock, offset: -5s"))
    assert (missed.verdict, witnessed(missed)["skew"][0]) == ("not_exercised", "none")
    assert "no libfaketime in pid" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- drain (real mxref: its debug hooks)

MID_READ = ("      - start: reader-1\n      - await: {process: reader-1, event: transfer_start}",
            "      - await: {process: reader-1, exit: true, code: 0}")


@needs("root")
def test_a_drain_with_a_lease_out_is_seen_and_one_of_an_idle_source_is_not_exercised(tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", drain(*MID_READ), fake=False)  # reader-1's lease is out mid-READ
    effect, figures = witnessed(landed)["refit"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["live"] >= 1 and figures["catches_sighup"] is True and figures["alive"] is True
    missed = run(tmp_path / "missed", drain(), fake=False)  # nobody reads: nothing to wait for
    assert (missed.verdict, witnessed(missed)["refit"][0]) == ("not_exercised", "none")
    assert "began its drain with 0 live leases to wait for" in missed.not_exercised[0]


FROZEN_DRAIN = one_source("      - fault: {kind: pause, target: source-1, name: freeze}\n"
                          "      - fault: {kind: drain, target: source-1, name: refit, confirm: 2s}\n      - heal: freeze",
                          source=", options: {debug_hooks: true, drain_timeout: 5s}", budgets="step: 15s, run: 60s", model=SMALL)


@needs("root")
def test_a_drain_whose_signal_lands_on_a_stopped_source_is_not_exercised_with_its_step_still_failed(
        tmp_path: Path) -> None:
    # the SIGHUP stays pending in a stopped process: no drain begins while the drain waits for it
    missed = run(tmp_path / "frozen", FROZEN_DRAIN, fake=False)
    assert (missed.verdict, missed.status) == ("not_exercised", "step_failed")
    assert "source-1 did not emit drain_started within 2s" in missed.reason
    effect, figures = witnessed(missed)["refit"]
    assert (effect, figures["drain_started"], figures["alive"], figures["catches_sighup"]) == ("none", False, True, True)
    (why,) = missed.not_exercised
    assert why.startswith("fault refit (drain source-1): no effect:") and "never began a drain" in why
    # delivered, never taken: told apart from a source that ignored it (test_fault_witnesses_more)
    assert why.endswith("its SIGHUP is still pending, never taken (the process is stopped (state T))"), why
    assert (figures["hup_pending"], figures["hup_state"]) == (True, "T")


# ---------------------------------------------------------------------------- corrupt (real mxref: its debug hooks)



@needs("root")
def test_a_corruption_is_seen_in_the_sources_memory_and_a_toggle_that_flips_nothing_is_not_exercised(
        tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", corrupt(), fake=False)
    effect, figures = witnessed(landed)["rot"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["changed"] == figures["bytes"] == figures["held"] == 4  # byte 0 of each of the 4 tensors
    # the planted regression: a source whose toggle confirms corrupted: true and flips nothing
    missed = run(tmp_path / "missed", corrupt(", env: {MXREF_SIMULATED_BUG: corrupt_in_word_only}"), fake=False)
    assert (missed.verdict, witnessed(missed)["rot"][0]) == ("not_exercised", "none")
    assert "0 of 4 bytes" in missed.not_exercised[0]
