"""Every fault proves it landed (issue 35), for the kinds the other files leave out on this machine
and netns hosts: a stop, a restart and a depart (the harness's own record of the exit and of the new
incarnation), a grow (the growth the source announced; or, when none began, where its SIGHUP went),
a hijack (the server's answers to its writes), a store_wipe (the keys counted in the run's redis), a
tcp_reset (the connections the namespace's own ``ss`` shows gone), a link_down (its veth's flags),
a rate (its qdisc's counters), and a drain whose SIGHUP was ignored or taken by a handler that began
nothing, told apart from one still pending. Each lands on a live target (effect seen, the run
passes) and is aimed at nothing (no effect: NOT EXERCISED). The targets are the fake mxref of
tests/fixtures/fakeproc.py, or real mxref where the fault needs its hooks, its server or its redis."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import witness_runs as wr
from fixtures.witness_runs import effects, witnessed
from fixtures.witness_runs import run_witnessed as run

from harness.scenario import capabilities

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def needs(*caps: str) -> pytest.MarkDecorator:
    lacking = capabilities.missing(caps)
    return pytest.mark.skipif(bool(lacking), reason=f"this machine lacks {', '.join(lacking)}")


# ---------------------------------------------------------------------------- stop, restart, depart


def test_a_stop_of_a_live_source_is_seen_and_one_of_a_source_already_gone_is_not_exercised(tmp_path: Path) -> None:
    stop = "      - fault: {kind: stop, target: source-1, grace: 2s, name: leave}\n      - sleep: 300ms"
    landed = run(tmp_path / "landed", wr.one_source(stop))
    effect, figures = witnessed(landed)["leave"]
    assert (landed.verdict, effect, figures["escalated"]) == ("pass", "seen", False), landed.not_exercised
    missed = run(tmp_path / "missed", wr.one_source(wr.KILLED + stop))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"k": "seen", "leave": "none"})
    assert missed.not_exercised == ["fault leave (stop source-1): no effect: source-1 had already exited: nothing to stop"]


def test_a_restart_of_a_live_source_is_seen_and_one_of_a_source_already_gone_is_not_exercised(tmp_path: Path) -> None:
    restart = ("      - fault: {kind: restart, target: source-1, grace: 2s, name: again}\n"
               "      - await: {process: source-1, event: heartbeat}")
    landed = run(tmp_path / "landed", wr.one_source(restart))
    effect, figures = witnessed(landed)["again"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["incarnation"] >= 1 and figures["rc"] is not None, figures  # a new incarnation, the old one's exit
    missed = run(tmp_path / "missed", wr.one_source(wr.KILLED + restart))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"k": "seen", "again": "none"})
    assert "source-1 had already exited: a start, not a restart" in missed.not_exercised[0]


def test_a_depart_is_witnessed_by_the_exit_and_a_term_the_target_ignores_is_not_exercised(tmp_path: Path) -> None:
    depart = "      - fault: {kind: depart, target: source-1, after: heartbeat, signal: %s, name: gone}\n      - sleep: 500ms"
    landed = run(tmp_path / "landed", wr.one_source(depart % "KILL"))
    effect, figures = witnessed(landed)["gone"]
    assert (landed.verdict, effect, figures["by_signal"]) == ("pass", "seen", True), landed.not_exercised
    missed = run(tmp_path / "missed", wr.one_source(depart % "TERM", source=wr.IGNORE_TERM))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"gone": "none"})
    assert "outlived the SIGTERM" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- drain: where the SIGHUP went


@pytest.mark.parametrize(("hup", "where"), [
    ("ignore", "it ignores SIGHUP (SigIgn): the kernel discarded it"),
    ("catch", "its SIGHUP was taken by its handler, which began no drain"),
])
def test_a_drain_whose_sighup_is_ignored_or_taken_to_no_effect_is_not_exercised_saying_so(
        tmp_path: Path, hup: str, where: str) -> None:
    """Not a pending signal (test_fault_witnesses_kinds: a stopped source): this one was delivered."""
    drain = "      - fault: {kind: drain, target: source-1, name: refit, confirm: 1s}"
    missed = run(tmp_path, wr.one_source(drain, source=f", options: {{debug_hooks: true}}, extra_args: [--fake-hup, {hup}]"))
    assert (missed.verdict, missed.status) == ("not_exercised", "step_failed")
    effect, figures = witnessed(missed)["refit"]
    assert (effect, figures["hup_pending"], figures["hup_ignored"], figures["alive"]) == ("none", False, hup == "ignore", True)
    assert figures["catches_sighup"] is (hup == "catch")
    assert missed.not_exercised[0].endswith(f"still running: {where}"), missed.not_exercised


# ---------------------------------------------------------------------------- grow (real mxref: its debug hooks)



@needs("root")
def test_a_grow_is_seen_by_the_tensors_added_and_one_whose_sighup_stays_pending_is_not_exercised(tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", wr.grow("10s"), fake=False)
    effect, figures = witnessed(landed)["grow"]
    assert (landed.verdict, effect, figures["added"], figures["tensors"], figures["alive"]) == ("pass", "seen", 2, 4, True)
    # aimed at nothing: the source is stopped, the SIGHUP waits in it, no growth begins within confirm
    frozen = ("      - fault: {kind: pause, target: source-1, name: freeze}", "      - heal: freeze")
    missed = run(tmp_path / "missed", wr.grow("2s", *frozen), fake=False)
    assert (missed.verdict, missed.status) == ("not_exercised", "step_failed")
    effect, figures = witnessed(missed)["grow"]
    assert (effect, figures["hup_pending"], figures["hup_state"]) == ("none", True, "T"), figures
    (why,) = missed.not_exercised
    assert why.startswith("fault grow (grow source-1): no effect: ") and why.endswith(
        "never began a growth: no manifest_grown within 2s, still running: its SIGHUP is still pending, "
        "never taken (the process is stopped (state T))"), why


# ---------------------------------------------------------------------------- hijack (real mxref: its server)



def test_a_hijack_the_server_answers_is_seen_and_one_at_a_server_that_cannot_answer_is_not_exercised(
        tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", wr.hijack(), fake=False)
    effect, figures = witnessed(landed)["hj"]
    assert (landed.verdict, effect, figures["writes"], figures["answered"]) == ("pass", "seen", 2, 2), figures
    # aimed at nothing: the server is stopped (SIGSTOP) while the hijacker writes: no answer comes
    frozen = ("      - fault: {kind: pause, target: server, name: freeze}", "      - heal: freeze")
    missed = run(tmp_path / "missed", wr.hijack(*frozen), fake=False)
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"freeze": "seen", "hj": "none"})
    assert missed.not_exercised == ["fault hj (hijack source-1): no effect: no demote write was answered on its "
                                    "merits (DEADLINE_EXCEEDED)"]


# ---------------------------------------------------------------------------- store_wipe (the run's real redis)


@needs("redis-server")
def test_a_store_wipe_counts_the_keys_in_the_runs_redis_and_one_of_an_empty_store_is_not_exercised(
        tmp_path: Path) -> None:
    landed = run(tmp_path / "landed", wr.wipe(published=True), fake=False)
    effect, figures = witnessed(landed)["wipe"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["keys_before"] >= 1 and figures["keys_after"] < figures["keys_before"], figures
    missed = run(tmp_path / "missed", wr.wipe(published=False), fake=False)  # nothing written yet
    assert (missed.verdict, witnessed(missed)["wipe"]) == ("not_exercised", ("none", {"keys_before": 0, "keys_after": 0}))
    assert "0 keys before, 0 after" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- netns hosts: tcp_reset, link_down, rate


@pytest.mark.root
@needs("root", "netns", "ss")
def test_a_tcp_reset_on_netns_hosts_is_seen_in_the_namespaces_ss_and_one_that_resets_nothing_is_not_exercised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landed = run(tmp_path / "landed", wr.RESET, fake=False)
    effect, figures = witnessed(landed)["rst"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["connections"] >= 1 and figures["destroyed"] == figures["connections"], figures
    wr.plant(monkeypatch, wr.resets_port_nine)
    missed = run(tmp_path / "missed", wr.RESET, fake=False)
    effect, figures = witnessed(missed)["rst"]
    assert (missed.verdict, effect, figures["destroyed"]) == ("not_exercised", "none", 0), missed.not_exercised
    assert "still established after ss -K" in missed.not_exercised[0]


@pytest.mark.root
@needs("root", "netns")
def test_a_link_down_on_a_netns_host_is_seen_in_its_flags_and_one_left_up_is_not_exercised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landed = run(tmp_path / "landed", wr.link("link_down"))
    (w,) = landed.history.fault_windows()
    assert (landed.verdict, [x.effect for x in w.witnesses]) == ("pass", ["seen", "seen"])  # at inject, and at its heal
    # the planted regression: its `ip link set dev X down` sets the veth up
    wr.plant(monkeypatch, wr.link_set_up)
    missed = run(tmp_path / "missed", wr.link("link_down"))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"net": "none"})
    assert "UP" in missed.not_exercised[0], missed.not_exercised


@pytest.mark.root
@needs("root", "netns", "tc")
def test_a_rate_limit_on_an_idle_netns_host_is_not_exercised(tmp_path: Path) -> None:
    """Aimed at nothing: the fake source sends a few bytes a second, far under the limit (a rate a
    real load meets: test_harness_netns.py's test_rate_slows_the_host_and_heal_removes_our_qdisc)."""
    result = run(tmp_path, wr.link("rate", ", rate: 100mbit"))
    effect, figures = witnessed(result)["net"]
    assert (result.verdict, effect, figures["overlimits"]) == ("not_exercised", "none", 0), result.not_exercised
