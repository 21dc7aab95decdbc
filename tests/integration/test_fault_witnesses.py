"""Every fault proves it landed (issue 35), for real: a fault that lands on a live target records a
witness of its effect and the run passes; the same fault aimed at nothing, or with its inject
broken on purpose (a planted regression: the chain nothing jumps to, a SIGSTOP that is not sent),
makes the run NOT EXERCISED, never PASS nor FAIL. Process faults on this machine (the fake mxref
in tests/fixtures/fakeproc.py); network faults on netns hosts (root, ip, iptables)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from fixtures.witness_runs import IGNORE_TERM, cut_probe, effects, one_source
from fixtures.witness_runs import run_witnessed as run

from harness.faults import netns as netns_faults
from harness.faults import process as process_faults

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")
NEEDS_TOOLS = pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "iptables")), reason="needs ip and iptables")


# ---------------------------------------------------------------------------- process faults


def test_a_pause_of_a_live_source_is_seen_and_one_that_sends_nothing_is_not_exercised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = "      - fault: {kind: pause, target: source-1, name: freeze, duration: 300ms}\n      - sleep: 500ms"
    landed = run(tmp_path / "landed", one_source(steps))
    assert (landed.verdict, effects(landed)) == ("pass", {"freeze": "seen"})
    (w,) = landed.history.fault_windows()
    assert [x.effect for x in w.witnesses] == ["seen", "seen"]  # at inject, and still at its heal
    assert w.witnesses[0].figures["threads"] == w.witnesses[0].figures["stopped"] >= 1

    # the planted regression: the pause's SIGSTOP is a SIGCONT (an inject that silently does nothing)
    broken = SimpleNamespace(SIGSTOP=signal.SIGCONT, SIGCONT=signal.SIGCONT, Signals=signal.Signals)
    monkeypatch.setattr(process_faults, "signal", broken)
    missed = run(tmp_path / "missed", one_source(steps))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"freeze": "none"})
    (why,) = missed.not_exercised
    assert why.startswith("fault freeze (pause source-1): no effect: 0 of ") and "in state T" in why


def test_a_kill_is_witnessed_by_the_exit_and_a_term_the_target_ignores_is_not_exercised(tmp_path: Path) -> None:
    kill = "      - fault: {kind: kill, target: source-1, signal: %s, name: k}\n      - sleep: 500ms"
    landed = run(tmp_path / "landed", one_source(kill % "KILL"))
    assert (landed.verdict, effects(landed)) == ("pass", {"k": "seen"})
    # aimed at nothing: a TERM to a source that ignores it (the teardown ends it, not the fault)
    missed = run(tmp_path / "missed", one_source(kill % "TERM", source=IGNORE_TERM))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"k": "none"})
    assert "outlived the SIGTERM" in missed.not_exercised[0]


def test_a_negative_control_passes_without_effect_and_is_not_exercised_with_one(tmp_path: Path) -> None:
    kill = "      - fault: {kind: kill, target: source-1, signal: TERM, name: k, expect_effect: false}\n      - sleep: 500ms"
    control = run(tmp_path / "control", one_source(kill, source=IGNORE_TERM))
    assert (control.verdict, effects(control)) == ("pass", {"k": "none"})
    hit = run(tmp_path / "hit", one_source(kill))  # this source ends on TERM: the control is wrong
    assert hit.verdict == "not_exercised" and "a negative control (expect_effect: false)" in hit.not_exercised[0]


# ---------------------------------------------------------------------------- network faults (netns)


@pytest.mark.root
@NEEDS_ROOT
@NEEDS_TOOLS
@pytest.mark.parametrize("kind", ["partition", "reject"])
def test_a_cut_packets_met_is_seen_one_on_an_unused_port_is_not_exercised(kind: str, tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", cut_probe(kind))  # the probe's SYNs to the server met it
    assert (landed.verdict, effects(landed)) == ("pass", {"cut": "seen"})
    (w,) = landed.history.fault_windows()
    assert w.witness is not None and w.witness.figures["packets"] >= 1 and w.witness.figures["hooks"] == 2

    missed = run(tmp_path / "missed", cut_probe(kind, fault=", ports: [9]"))  # a port nothing of the run uses
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"cut": "none"})
    assert missed.not_exercised[0].endswith("0 packets (no packet met its rules)")


@pytest.mark.root
@NEEDS_ROOT
@NEEDS_TOOLS
def test_a_chain_nothing_jumps_to_turns_pass_into_not_exercised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted regression of the issue: the rules go into our chain, but no hook jumps to it."""
    monkeypatch.setattr(netns_faults, "firewall_hooks", lambda spec: [])
    missed = run(tmp_path, cut_probe())
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"cut": "none"})
    assert missed.not_exercised[0].endswith("0 packets (no hook jumps to it)")
