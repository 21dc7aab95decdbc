"""Every fault proves it landed (issue 35), on the lab's ssh hosts (``mxchaos lab up``: network
namespaces running OpenSSH sshd, reached only over ssh). The kinds that land on an ssh host are
measured there: a kill, a depart, a stop and a restart by the exit the harness saw (and the new
incarnation), a partition or reject by its chain's counters read with the host's own iptables, a
link_down by its data device's flags read in the host's own shell, a rate by its qdisc's counters
there, a drain and a grow by what the source began (its live leases, the tensors it added), a
hijack by the answers of the server there, a store_wipe by the keys the harness counted in the
host's redis before and after, a tcp_reset by the host's own ``ss`` before and after its
``ss -K``. Each lands on a live target (effect seen, the run passes) and is aimed at nothing (no
effect: NOT EXERCISED). A pause's target's threads, a clock's or wall_clock's process and a
corrupted source's memory cannot be read from here: their record says "not witnessed" and why,
and the run is judged on its checks; so is a drain target's state (its SIGHUP handler, alive
after it), which its record names as unread. A syscall or disk fault has no lever on an ssh host
(strace and the FUSE layer act on this machine): such a run is a SKIP saying so, before anything
starts (as a toxic's or a proxy_down's: toxiproxy runs on the harness).

The lab is machine-wide: run these under ``flock /work/lab.lock`` (tests/integration's rule for
every test that brings one up)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures import witness_runs as wr
from fixtures.lab_hosts import lab_inventory
from fixtures.witness_runs import FAKE, effects, run_witnessed, witnessed

from harness.engine.runner import Runner
from harness.hosts.inventory import Inventory
from harness.judge.verdict import RunResult
from harness.reports.report import write_run_folder
from harness.scenario import load_scenario

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd, iptables)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen", "iptables", "tc"))
                       or not Path("/usr/sbin/sshd").exists(),
                       reason="needs iproute2, iptables, tc, openssh-client and openssh-server"),
]

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inventory]:
    yield from lab_inventory(tmp_path_factory.mktemp("lab"), 4)


def on_ssh(result: RunResult) -> RunResult:
    """The run's hosts were the lab's ssh machines (what run.json says the harness bound)."""
    hosts = json.loads((result.run_dir / "run.json").read_text())["hosts"]
    assert hosts and all(h["kind"] == "ssh" for h in hosts.values()), hosts
    return result


# ---------------------------------------------------------------------------- process faults

ONE_HOST = "step: 20s, run: 60s, stop_grace: 2s, progress: 30s"  # one_source's budgets over ssh
KILL = "      - fault: {kind: kill, target: source-1, signal: %s, name: k}\n      - sleep: 1s"
DEPART = "      - fault: {kind: depart, target: source-1, after: heartbeat, signal: %s, name: gone}\n      - sleep: 1s"


@pytest.mark.parametrize(("steps", "name"), [(KILL, "k"), (DEPART, "gone")], ids=["kill", "depart"])
def test_a_kill_or_depart_on_an_ssh_host_is_witnessed_by_its_exit_and_a_term_it_ignores_is_not_exercised(
        steps: str, name: str, inventory: Inventory, tmp_path: Path) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.one_source(steps % "KILL", budgets=ONE_HOST), inventory=inventory))
    effect, figures = witnessed(landed)[name]
    assert (landed.verdict, effect, figures["by_signal"]) == ("pass", "seen", True), landed.not_exercised
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.one_source(steps % "TERM", source=wr.IGNORE_TERM, budgets=ONE_HOST),
                                  inventory=inventory))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {name: "none"})
    assert "outlived the SIGTERM" in missed.not_exercised[0]


@pytest.mark.parametrize(("kind", "gone"), [("stop", "nothing to stop"), ("restart", "a start, not a restart")])
def test_a_stop_or_restart_on_an_ssh_host_is_witnessed_by_its_exit_and_one_of_a_source_gone_is_not_exercised(
        kind: str, gone: str, inventory: Inventory, tmp_path: Path) -> None:
    steps = f"      - fault: {{kind: {kind}, target: source-1, grace: 2s, name: leave}}\n      - sleep: 500ms"
    result = on_ssh(run_witnessed(tmp_path / "landed", wr.one_source(steps, budgets=ONE_HOST), inventory=inventory))
    assert (result.verdict, effects(result)) == ("pass", {"leave": "seen"}), result.not_exercised
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.one_source(wr.KILLED + steps, budgets=ONE_HOST), inventory=inventory))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"k": "seen", "leave": "none"})
    assert missed.not_exercised[0].endswith(f"source-1 had already exited: {gone}"), missed.not_exercised


@pytest.mark.parametrize("fault", ["kind: wall_clock, offset: -5s", "kind: clock, monotonic: +72h"])
def test_a_clock_or_wall_clock_on_an_ssh_host_is_not_witnessed_and_says_why(
        fault: str, inventory: Inventory, tmp_path: Path) -> None:
    """The lab's login is root (a clock fault's need): the fault acts; the new incarnation's /proc
    (its time namespace, its maps and environment) is the host's, not read from here."""
    steps = f"      - fault: {{{fault}, target: source-1, name: skew}}\n      - sleep: 500ms"
    result = on_ssh(run_witnessed(tmp_path, wr.one_source(steps, budgets=ONE_HOST), inventory=inventory))
    effect, _ = witnessed(result)["skew"]
    assert (result.verdict, effect) == ("pass", "unwitnessed")
    (w,) = result.history.fault_windows()
    assert w.witness is not None and "runs on ssh host" in w.witness.why and "not read from here" in w.witness.why, w.witness


def test_a_pause_on_an_ssh_host_is_not_witnessed_and_says_why(inventory: Inventory, tmp_path: Path) -> None:
    steps = "      - fault: {kind: pause, target: source-1, name: freeze, duration: 300ms}\n      - sleep: 600ms"
    result = on_ssh(run_witnessed(tmp_path, wr.one_source(steps, budgets=ONE_HOST), inventory=inventory))
    effect, _ = witnessed(result)["freeze"]
    assert (result.verdict, effect) == ("pass", "unwitnessed")  # judged on its checks, never NOT EXERCISED
    (w,) = result.history.fault_windows()
    assert w.witness is not None and "runs on ssh host" in w.witness.why and "its /proc is not read from here" in w.witness.why


# ---------------------------------------------------------------------------- network faults

NET = "step: 20s, run: 90s, progress: 100s, stop_grace: 2s"  # cut_probe's budgets over ssh


@pytest.mark.parametrize("kind", ["partition", "reject"])
def test_a_cut_on_ssh_hosts_is_counted_there_and_one_on_an_unused_port_is_not_exercised(
        kind: str, inventory: Inventory, tmp_path: Path) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.cut_probe(kind, budgets=NET), inventory=inventory))
    effect, figures = witnessed(landed)["cut"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["packets"] >= 1 and figures["hooks"] == 2
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.cut_probe(kind, fault=", ports: [9]", budgets=NET), inventory=inventory))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"cut": "none"})
    assert missed.not_exercised[0].endswith("0 packets (no packet met its rules)")


def test_a_link_down_on_an_ssh_host_is_seen_in_its_devices_flags_and_one_left_up_is_not_exercised(
        inventory: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = on_ssh(run_witnessed(tmp_path / "landed", wr.link("link_down"), inventory=inventory))
    (w,) = result.history.fault_windows()
    assert (result.verdict, [x.effect for x in w.witnesses]) == ("pass", ["seen", "seen"])  # at inject, and at its heal
    assert "UP" not in w.witnesses[0].figures["flags"].split(","), w.witnesses[0].figures  # read on the host
    # the planted regression: its `ip link set dev X down` on the host sets the device up
    wr.plant(monkeypatch, wr.link_set_up)
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.link("link_down"), inventory=inventory))
    assert (missed.verdict, effects(missed)) == ("not_exercised", {"net": "none"})
    assert "is up (" in missed.not_exercised[0], missed.not_exercised


def test_a_rate_limit_on_an_idle_ssh_host_is_not_exercised(inventory: Inventory, tmp_path: Path) -> None:
    """Aimed at nothing: the fake source sends a few bytes a second, far under the limit."""
    result = on_ssh(run_witnessed(tmp_path, wr.link("rate", ", rate: 100mbit"), inventory=inventory))
    effect, figures = witnessed(result)["net"]
    assert (result.verdict, effect) == ("not_exercised", "none"), result.not_exercised
    assert figures["overlimits"] == 0


@pytest.mark.alone  # a stall window: a neighbour's load moves it
def test_real_bytes_on_ssh_hosts_meet_the_rate_and_the_partition(inventory: Inventory, tmp_path: Path) -> None:
    """partition_mid_read unchanged on the lab: the partition's chain drops the READ's packets and
    the READ that loads, over the next candidate's rate-limited link, meets that host's qdisc
    (overlimits), each counted on its host. (The first candidate's rate may carry nothing over
    its limit when the cut lands before the READ's first bytes: not judged here.)"""
    scenario = load_scenario(SCENARIOS / "partition_mid_read.yaml")
    result = Runner(scenario, out_dir=tmp_path, inventory=inventory, install_signal_handlers=False).run()
    assert result.status == "completed", (result.status, result.reason)
    write_run_folder(result)
    seen = witnessed(on_ssh(result))
    assert seen["cut"][0] == "seen" and seen["cut"][1]["packets"] >= 1, seen
    loaded = result.history.last(actor="reader-1", f="load_done")
    assert loaded is not None and loaded.get("path") == "rdma", loaded
    served = next(p for p in ("source-1", "source-2") if str(loaded.get("source")).startswith(f"{p}-"))
    rate = {"a": "slow-a", "b": "slow-b"}[scenario.host_of(served)]
    assert seen[rate][0] == "seen" and seen[rate][1]["overlimits"] >= 1, (rate, seen)


# ---------------------------------------------------------------------------- drain, store_wipe, tcp_reset (real mxref)

# 64 MiB at 200 mbit/s: the leased READ lasts about 2.7 s, the drain is asked inside it
MID_READ = ("      - fault: {kind: rate, target: a, rate: 200mbit, name: slow-a}\n"
            "      - start: reader-1\n      - await: {process: reader-1, event: transfer_start}",
            "      - await: {process: reader-1, exit: true, code: 0}\n      - heal: slow-a")


def test_a_drain_on_an_ssh_host_with_a_lease_out_is_seen_and_one_of_an_idle_source_is_not_exercised(
        inventory: Inventory, tmp_path: Path) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.drain(*MID_READ, hosts=True), fake=False, inventory=inventory))
    effect, figures = witnessed(landed)["refit"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    # the host's /proc is not read from here: the target's state is unread, never guessed
    assert figures["live"] >= 1 and (figures["catches_sighup"], figures["alive"]) == (None, None), figures
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.drain(hosts=True), fake=False, inventory=inventory))
    assert (missed.verdict, witnessed(missed)["refit"][0]) == ("not_exercised", "none")
    assert "began its drain with 0 live leases to wait for" in missed.not_exercised[0]


def test_a_store_wipe_on_an_ssh_host_counts_its_keys_there_and_one_of_an_empty_store_is_not_exercised(
        inventory: Inventory, tmp_path: Path) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.wipe(published=True), fake=False, inventory=inventory))
    effect, figures = witnessed(landed)["wipe"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["keys_before"] >= 1 and figures["keys_after"] < figures["keys_before"], figures
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.wipe(published=False), fake=False, inventory=inventory))  # nothing written yet
    assert (missed.verdict, witnessed(missed)["wipe"]) == ("not_exercised", ("none", {"keys_before": 0, "keys_after": 0}))
    assert "0 keys before, 0 after" in missed.not_exercised[0]


def test_a_tcp_reset_on_ssh_hosts_is_seen_in_the_hosts_own_ss_and_one_that_resets_nothing_is_not_exercised(
        inventory: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.RESET, fake=False, inventory=inventory))
    effect, figures = witnessed(landed)["rst"]
    assert (landed.verdict, effect) == ("pass", "seen"), landed.not_exercised
    assert figures["connections"] >= 1 and figures["destroyed"] == figures["connections"], figures
    wr.plant(monkeypatch, wr.resets_port_nine)
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.RESET, fake=False, inventory=inventory))
    effect, figures = witnessed(missed)["rst"]
    assert (missed.verdict, effect, figures["destroyed"]) == ("not_exercised", "none", 0), missed.not_exercised
    assert "still established after ss -K" in missed.not_exercised[0]


# ---------------------------------------------------------------------------- grow, hijack, corrupt (real mxref)

FROZEN = "      - fault: {kind: pause, target: %s, name: freeze}"  # the pause acts on an ssh host; its witness is unread


def test_a_grow_on_an_ssh_host_is_seen_by_the_tensors_added_and_one_never_begun_is_not_exercised(
        inventory: Inventory, tmp_path: Path) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.grow("15s"), fake=False, inventory=inventory))
    effect, figures = witnessed(landed)["grow"]
    assert (landed.verdict, effect, figures["added"], figures["alive"]) == ("pass", "seen", 2, None), figures
    # aimed at nothing: the source is stopped, no growth begins within confirm; where its SIGHUP went is unread
    frozen = (FROZEN % "source-1", "      - heal: freeze")
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.grow("3s", *frozen), fake=False, inventory=inventory))
    assert (missed.verdict, missed.status) == ("not_exercised", "step_failed")
    effect, figures = witnessed(missed)["grow"]
    assert (effect, figures["hup_pending"], figures["alive"]) == ("none", None, None), figures
    assert missed.not_exercised == [f"fault grow (grow source-1): no effect: source-1 (pid {figures['pid']}) never began "
                                    "a growth: no manifest_grown within 3s"]


def test_a_hijack_of_a_server_on_an_ssh_host_is_seen_and_one_it_cannot_answer_is_not_exercised(
        inventory: Inventory, tmp_path: Path) -> None:
    landed = on_ssh(run_witnessed(tmp_path / "landed", wr.hijack(), fake=False, inventory=inventory))
    effect, figures = witnessed(landed)["hj"]
    assert (landed.verdict, effect, figures["answered"]) == ("pass", "seen", 2), figures
    frozen = (FROZEN % "server", "      - heal: freeze")
    missed = on_ssh(run_witnessed(tmp_path / "missed", wr.hijack(*frozen), fake=False, inventory=inventory))
    assert (missed.verdict, witnessed(missed)["hj"][0]) == ("not_exercised", "none")
    assert missed.not_exercised == ["fault hj (hijack source-1): no effect: no demote write was answered on its "
                                    "merits (DEADLINE_EXCEEDED)"]


def test_a_corrupt_on_an_ssh_host_is_not_witnessed_and_says_why(inventory: Inventory, tmp_path: Path) -> None:
    """The toggle acts (the source confirms it); the source's memory is not read from here."""
    result = on_ssh(run_witnessed(tmp_path, wr.corrupt(), fake=False, inventory=inventory))
    effect, _ = witnessed(result)["rot"]
    assert (result.verdict, effect) == ("pass", "unwitnessed"), result.not_exercised
    (w,) = result.history.fault_windows()
    assert w.witness is not None and "the source runs on an ssh host: its memory is not read from here" in w.witness.why


# ---------------------------------------------------------------------------- kinds with no lever on ssh hosts


@pytest.mark.parametrize(("fault", "why"), [
    ("{kind: syscall, target: source-1, calls: [write], delay: 1ms, name: crawl}",
     "fault crawl (syscall): no lever on ssh hosts yet (strace attaches here by pid"),
    ("{kind: disk, target: reader-1, mode: eio, name: crawl}",
     "fault crawl (disk): no lever on ssh hosts yet (its FUSE layer mounts over a checkpoint folder on this machine"),
])
def test_a_fault_that_acts_on_this_machine_alone_is_a_skip_on_ssh_hosts_saying_why(
        fault: str, why: str, inventory: Inventory, tmp_path: Path) -> None:
    """Before anything starts: never a run whose fault touched some other process of this machine."""
    path = tmp_path / "local_only.yaml"
    path.write_text(f"""name: local_only
launcher: ["{{python}}", "{FAKE}"]
processes:
  server: {{role: server}}
  source-1: {{role: source}}
  reader-1: {{role: reader}}
steps:
  - start: [server, source-1]
  - fault: {fault}
  - heal: crawl
checks: [{{nothing_leaked: {{}}}}]
""")
    result = Runner(load_scenario(path), out_dir=tmp_path / "runs", inventory=inventory, install_signal_handlers=False).run()
    assert (result.verdict, result.status) == ("skip", "skipped") and why in result.reason, (result.verdict, result.reason)
