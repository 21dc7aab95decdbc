"""``netns`` hosts and the network faults, without touching the machine: the schema keys and
their validation errors, the transport a netns host gets, the flags the runner adds, the
capabilities such a scenario needs, names that fit the kernel's limits, the iptables rules a
fault would install, and a skipped run that creates nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from fixtures.scenario_heads import THREE_PROCESSES

from harness.engine.runner import Runner
from harness.errors import ScenarioInvalid
from harness.faults.netns import RateSpec, RejectSpec, chain_name, parse_rate
from harness.hosts import netns
from harness.scenario import FaultStep, NetnsHostSpec, capabilities, parse_scenario
from harness.scenario.capabilities import ENV_MISSING, scenario_requirements

BASE = """\
name: net
hosts: {ctl: netns, a: {kind: netns}, r: netns}
processes:
  server: {role: server, host: ctl}
  source-1: {role: source, host: a}
  source-2: {role: source, host: a}
  reader-1: {role: reader, host: r}
steps:
  - start: [server, source-1, source-2, reader-1]
"""


def scenario(extra_steps: str = "", head: str = BASE) -> str:
    """BASE plus steps (``- ...`` lines, indented or not)."""
    return textwrap.dedent(head) + textwrap.indent(textwrap.dedent(extra_steps), "  ")


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(text, "x.yaml")
    return [issue.render("x.yaml") for issue in info.value.issues]


# ---------------------------------------------------------------------------- schema


def test_netns_hosts_parse_in_both_forms_and_get_ucx_tcp_any() -> None:
    sc = parse_scenario(scenario(), "x.yaml")
    assert all(isinstance(h, NetnsHostSpec) for h in sc.hosts.values())
    assert sc.netns_hosts() == ["ctl", "a", "r"]
    assert sc.transport is None
    assert sc.transport_of("reader-1") == "ucx-tcp-any" == sc.transport_of("source-1")


def test_an_explicit_transport_wins_over_the_netns_default() -> None:
    sc = parse_scenario(scenario().replace("name: net\n", "name: net\ntransport: ucx-tcp\n"), "x.yaml")
    assert sc.transport_of("reader-1") == "ucx-tcp"


def test_an_unknown_host_kind_and_host_keys_are_errors() -> None:
    text = scenario().replace("a: {kind: netns}", "a: {kind: vm}").replace("r: netns", "r: {kind: netns, ip: 1.2.3.4}")
    found = "\n".join(problems(text))
    assert "hosts.a.kind: 'vm' is not a known kind" in found
    assert "hosts.r.ip: unknown key 'ip'" in found


def test_netns_hosts_cannot_be_mixed_with_local_ones() -> None:
    text = scenario().replace("r: netns}", "r: local}")
    (line,) = problems(text)
    assert "x.yaml:2: hosts: netns hosts cannot be mixed with other kinds (r)" in line


def test_network_faults_take_hosts_processes_or_source_of() -> None:
    sc = parse_scenario(scenario("""\
        - fault: {kind: partition, target: r, peer: {source_of: reader-1}, name: cut, duration: 2s}
        - fault: {kind: reject, target: source-1, peer: reader-1, ports: [5000, 6000], direction: in}
        - fault: {kind: link_down, target: a, name: down}
        - fault: {kind: rate, target: {source_of: reader-1}, rate: 10mbit, direction: both}
        """), "x.yaml")
    faults = [step.fault for step in sc.steps[1:] if isinstance(step, FaultStep)]
    assert [f.kind for f in faults] == ["partition", "reject", "link_down", "rate"]
    reject, rate = faults[1], faults[3]
    assert isinstance(reject, RejectSpec) and reject.ports == (5000, 6000) and reject.direction == "in"
    assert isinstance(rate, RateSpec) and rate.rate == "10mbit" and rate.latency == 0.2


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{kind: partition, target: rr, peer: a}",
         "steps[1].fault.target: no host or process named 'rr'; did you mean 'r'?"),
        ("{kind: partition, target: r, peer: {source_of: server}}",
         "steps[1].fault.peer.source_of: source_of names a reader, and 'server' is a server"),
        ("{kind: reject, target: r, peer: a, ports: [0]}", "steps[1].fault.ports: 0 is not a port (1..65535)"),
        ("{kind: reject, target: r, peer: a, ports: [" + ", ".join(str(p) for p in range(1, 17)) + "]}",
         "steps[1].fault.ports: Tuple should have at most 15 items"),
        ("{kind: partition, target: r, peer: a, direction: sideways}", "steps[1].fault.direction: Input should be"),
        ("{kind: rate, target: a, rate: fast}", "steps[1].fault.rate: 'fast' is not a rate"),
        ("{kind: rate, target: a, rate: 10bit}", "steps[1].fault.rate: '10bit' is below 8kbit"),
        ("{kind: link_down, target: a, peer: r}", "steps[1].fault.peer: unknown key 'peer'"),
        ("{kind: link_down, target: a}\n- fault: {kind: link_down, target: r, name: link_down-1}",
         "fault name 'link_down-1' is used twice"),
    ],
)
def test_network_fault_errors(fault: str, message: str) -> None:
    found = "\n".join(problems(scenario(f"- fault: {fault}\n")))
    assert message in found, found


def test_a_network_fault_on_a_local_host_is_an_error() -> None:
    local = "name: loc\n" + THREE_PROCESSES + """\
  - fault: {kind: partition, target: reader-1, peer: {source_of: reader-1}}
  - fault: {kind: rate, target: local, rate: 1mbit}
"""
    found = "\n".join(problems(textwrap.dedent(local)))
    assert "steps[1].fault.target: a partition fault acts on netns hosts, and host 'local' is local" in found
    assert "steps[1].fault.peer: a partition fault acts on netns hosts, and source(s) source-1 run on local hosts" in found
    assert "steps[2].fault.target: a rate fault acts on netns hosts, and host 'local' is local" in found


def test_a_name_that_is_a_host_and_a_process_elsewhere_is_ambiguous() -> None:
    text = scenario("- fault: {kind: link_down, target: a}\n").replace("hosts: {ctl: netns,", "hosts: {source-1: netns, ctl: netns,")
    text = text.replace("source-2: {role: source, host: a}", "source-2: {role: source, host: source-1}")
    found = "\n".join(problems(text.replace("target: a}", "target: source-1}")))
    assert "'source-1' is both a host and a process on host 'a'; rename one" in found


# ---------------------------------------------------------------------------- capabilities


def test_netns_scenarios_need_root_netns_and_what_their_faults_use() -> None:
    sc = parse_scenario(scenario("""\
        - fault: {kind: partition, target: r, peer: a, name: cut}
        - fault: {kind: rate, target: a, rate: 1mbit, name: slow}
        - fault: {kind: link_down, target: a, name: down}
        """), "x.yaml")
    needs = scenario_requirements(sc)
    assert needs["root"][0] == "hosts (ctl, a, r)"
    assert needs["netns"] == ["hosts (ctl, a, r)", "cut (partition)", "slow (rate)", "down (link_down)"]
    assert needs["iptables"] == ["cut (partition)"]
    assert needs["tc"] == ["slow (rate)"]


def test_a_machine_without_netns_skips_the_run_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MISSING, "netns")
    created: list[str] = []
    monkeypatch.setattr(netns.Network, "create", classmethod(lambda cls, *a, **k: created.append("net")))
    sc = parse_scenario(scenario(), "x.yaml")
    result = Runner(sc, out_dir=tmp_path, install_signal_handlers=False).run()
    assert (result.verdict, result.missing_capabilities) == ("skip", ["netns"])
    assert "this machine lacks netns (for hosts (ctl, a, r))" in result.reason
    assert created == []
    assert not capabilities.have("netns")


# ---------------------------------------------------------------------------- names and rules


def test_names_fit_the_kernel_limits_and_are_stable_per_run() -> None:
    run_id = "a-very-long-scenario-name-with-dots.and-more-20260101T000000-abcdef"
    names = netns.names_for(run_id)
    assert names == netns.names_for(run_id) and names != netns.names_for(run_id + "x")
    assert len(names.bridge) <= 15 and len(names.veth(999)) <= 15
    assert names.ns("r").startswith("mxc-") and len(chain_name(run_id, "a" * 60)) <= 28
    assert chain_name(run_id, "cut").startswith(f"mxc-{names.token}-")


def test_link_aliases_name_the_run_and_its_harness() -> None:
    assert netns._parse_alias("mxchaos run-1 4242 99") == ("run-1", 4242, 99)
    assert netns._parse_alias("mxchaos run-1 4242 -") == ("run-1", 4242, None)
    assert netns._parse_alias("docker bridge") is None


@pytest.mark.parametrize(("text", "bits"), [("10mbit", 1e7), ("500kbit", 5e5), ("2mbps", 1.6e7), ("1Gbit", 1e9)])
def test_rates_use_tc_units(text: str, bits: float) -> None:
    assert parse_rate(text) == bits
    assert RateSpec(kind="rate", target="a", rate=text).rate == text.lower()


def test_subnets_are_leased_exclusively_and_skip_what_the_machine_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    import ipaddress

    pool = ipaddress.IPv4Network("10.213.0.0/22")  # four /24s
    first = netns.lease_subnet("run-x", pool)
    second = netns.lease_subnet("run-x", pool)  # same start, but the first is locked
    try:
        assert first.network != second.network and first.network.prefixlen == 24
    finally:
        second.release()
    monkeypatch.setattr(netns, "_root_ipv4_networks", lambda: [second.network])
    third = netns.lease_subnet("run-x", pool)
    try:
        assert third.network not in (first.network, second.network)  # in use on the machine: skipped
    finally:
        third.release()
        first.release()
    again = netns.lease_subnet("run-x", pool)
    assert again.network == first.network  # released: the same run id starts at the same /24
    again.release()
