"""Network faults on netns hosts over the fake context and a fake shell: the exact iptables /
tc / ip commands each issues, the rules it writes, the token heal undoes, heal twice, an
inject that fails or is interrupted midway leaves nothing behind, and host references that
lead to a host of the wrong kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from fixtures.fault_context import FakeContext, FakeShell, install_shell

from harness.errors import FaultError, RunInterrupted
from harness.faults import REGISTRY, make_fault
from harness.faults.netns import (
    Chain,
    LinkDownSpec,
    PartitionSpec,
    Qdiscs,
    RateSpec,
    RejectSpec,
    chain_name,
    firewall_hooks,
    firewall_rules,
)
from harness.hosts.base import Place
from harness.record.witness import Witness
from harness.spec import SourceOf

RUN = "run-fake"
NS_A, NS_B = "mxc-tok-a", "mxc-tok-b"
NOTHING_LEFT: dict[str, Any] = {"chains": {}, "jumps": {}, "qdiscs": [], "down": []}


@pytest.fixture
def ctx() -> FakeContext:
    ctx = FakeContext(RUN)
    ctx.add_host("a", address="10.9.0.2", netns=NS_A, link="mxv1", inner_link="mx0")
    ctx.add_host("b", address="10.9.0.3", netns=NS_B, link="mxv2", inner_link="mx0")
    ctx.add_host("ctl", kind="local", address="127.0.0.1")
    ctx.add_process("source-1", host="a")
    ctx.add_process("reader-1", role="reader", host="b")
    ctx.add_process("server", role="server", host="ctl")
    ctx.sources["reader-1"] = "source-1"
    return ctx


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> FakeShell:
    return install_shell(monkeypatch, FakeShell(namespaces_=[NS_A, NS_B], links={"mxv1": "up", "mxv2": "up"}))


def iptables(*args: str) -> tuple[str, ...]:
    return ("iptables", "-w", "5", *args)


def unwitnessed(value: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """A record without its witness, and the witness's effect."""
    rest = dict(value or {})
    witness = Witness.of(rest.pop("witness", None))
    assert witness is not None, f"no witness in {value}"
    return rest, witness.effect


# ---------------------------------------------------------------------------- partition / reject


def test_partition_adds_one_chain_hooked_both_ways_and_heal_removes_exactly_it(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(PartitionSpec(kind="partition", target="b", peer="a"), "cut")
    injected = fault.inject(ctx)
    chain = chain_name(RUN, "cut")
    assert injected.token == Chain(Place(NS_B), chain)
    assert shell.commands == [
        (NS_B, iptables("-S", chain)),  # a leftover of an earlier attempt? none
        (NS_B, iptables("-N", chain)),
        (NS_B, iptables("-A", chain, "-s", "10.9.0.2", "-j", "DROP")),
        (NS_B, iptables("-A", chain, "-d", "10.9.0.2", "-j", "DROP")),
        (NS_B, iptables("-I", "INPUT", "1", "-j", chain)),
        (NS_B, iptables("-I", "OUTPUT", "1", "-j", chain)),
    ]
    assert injected.record == {"host": "b", "peer_host": "a", "between": ["10.9.0.3", "10.9.0.2"], "netns": NS_B,
                               "chain": chain, "direction": "both", "rules": ["-s 10.9.0.2 -j DROP", "-d 10.9.0.2 -j DROP"],
                               "ports": []}
    assert shell.left()["jumps"] == {NS_B: {"INPUT": [chain], "OUTPUT": [chain]}}
    assert unwitnessed(fault.heal(ctx, injected.token)) == ({"chain": chain, "removed": True}, "none")
    assert shell.left() == NOTHING_LEFT
    assert unwitnessed(fault.heal(ctx, injected.token)) == ({"chain": chain, "removed": False}, "unwitnessed")
    assert shell.left() == NOTHING_LEFT


def test_partition_heal_leaves_another_faults_chain_alone(ctx: FakeContext, shell: FakeShell) -> None:
    one = make_fault(PartitionSpec(kind="partition", target="a", peer="b"), "one")
    other = make_fault(PartitionSpec(kind="partition", target="a", peer="b", ports=(7000,)), "other")
    token = one.inject(ctx).token
    kept = other.inject(ctx).token
    one.heal(ctx, token)
    assert shell.left()["chains"] == {NS_A: [kept.chain]}
    other.heal(ctx, kept)
    assert shell.left() == NOTHING_LEFT


def test_partition_of_a_process_target_acts_on_its_host(ctx: FakeContext, shell: FakeShell) -> None:
    spec = PartitionSpec(kind="partition", target=SourceOf(source_of="reader-1"), peer="reader-1", direction="in")
    injected = make_fault(spec, "cut").inject(ctx)
    assert injected.token.place.name == NS_A and injected.record["between"] == ["10.9.0.2", "10.9.0.3"]
    assert shell.left()["jumps"] == {NS_A: {"INPUT": [injected.token.chain]}}


def test_a_failed_rule_leaves_no_chain_behind(ctx: FakeContext, shell: FakeShell) -> None:
    shell.fail("-I", "OUTPUT", out="iptables: Resource temporarily unavailable.")
    with pytest.raises(FaultError, match=r"iptables -I OUTPUT 1 -j mxc-.* failed .*Resource temporarily"):
        make_fault(PartitionSpec(kind="partition", target="a", peer="b"), "cut").inject(ctx)
    assert shell.left() == NOTHING_LEFT


def test_an_interrupt_mid_inject_leaves_no_chain_behind(ctx: FakeContext, shell: FakeShell) -> None:
    shell.fail("-A", exc=RunInterrupted(15))
    with pytest.raises(RunInterrupted):
        make_fault(RejectSpec(kind="reject", target="a", peer="b"), "rst").inject(ctx)
    assert shell.left() == NOTHING_LEFT


def test_an_undo_that_fails_too_is_noted_on_the_original_error(ctx: FakeContext, shell: FakeShell) -> None:
    shell.fail("-I", "INPUT", out="no")
    shell.fail("-F", out="also no")
    with pytest.raises(FaultError, match="iptables -I INPUT") as raised:
        make_fault(PartitionSpec(kind="partition", target="a", peer="b"), "cut").inject(ctx)
    assert any("undoing it failed too: FaultError: iptables -F" in note for note in raised.value.__notes__)


def test_a_leftover_chain_of_an_earlier_attempt_is_replaced(ctx: FakeContext, shell: FakeShell) -> None:
    chain = chain_name(RUN, "cut")
    shell.chains[NS_A] = {chain: [["-j", "DROP"]]}
    shell.hooks[NS_A] = {"INPUT": [chain], "OUTPUT": []}
    make_fault(PartitionSpec(kind="partition", target="a", peer="b", direction="out"), "cut").inject(ctx)
    assert shell.chains[NS_A] == {chain: [["-d", "10.9.0.3", "-j", "DROP"]]}
    assert shell.hooks[NS_A] == {"INPUT": [], "OUTPUT": [chain]}


def test_a_chain_whose_namespace_is_gone_heals_as_a_noop(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(PartitionSpec(kind="partition", target="a", peer="b"), "cut")
    token = fault.inject(ctx).token
    shell.namespaces_.remove(NS_A)
    assert unwitnessed(fault.heal(ctx, token)) == ({"chain": token.chain, "removed": False}, "unwitnessed")


@pytest.mark.parametrize(("target", "peer", "error"), [
    ("ctl", "a", "partition: ctl is on host ctl .local.; it needs a netns host"),
    ("server", "a", "partition: server is on host ctl .local.; it needs a netns host"),
    ("a", "source-1", "partition: a and source-1 are both on host a"),
    (SourceOf(source_of="nobody"), "a", "source_of nobody"),
])
def test_host_references_that_lead_to_no_netns_host_are_reported(
    ctx: FakeContext, shell: FakeShell, target: str | SourceOf, peer: str, error: str
) -> None:
    with pytest.raises(FaultError, match=error):
        make_fault(PartitionSpec(kind="partition", target=target, peer=peer), "cut").inject(ctx)
    assert shell.commands == []


def test_without_iptables_nothing_runs(ctx: FakeContext, shell: FakeShell) -> None:
    shell.programs.discard("iptables")
    with pytest.raises(FaultError, match="reject needs iptables"):
        make_fault(RejectSpec(kind="reject", target="a", peer="b"), "rst").inject(ctx)
    assert shell.commands == []


def test_partition_rules_cut_both_ways_or_one_and_only_the_given_ports() -> None:
    both = PartitionSpec(kind="partition", target="r", peer="a")
    assert firewall_rules(both, "10.0.0.2") == [["-s", "10.0.0.2", "-j", "DROP"], ["-d", "10.0.0.2", "-j", "DROP"]]
    assert [hook for _f, hook in firewall_hooks(both)] == ["INPUT", "OUTPUT"]
    one = PartitionSpec(kind="partition", target="r", peer="a", direction="out", ports=(80, 443))
    assert [hook for _f, hook in firewall_hooks(one)] == ["OUTPUT"]
    assert firewall_rules(one, "10.0.0.2") == [
        ["-d", "10.0.0.2", "-p", "tcp", "-m", "multiport", "--ports", "80,443", "-j", "DROP"],
        ["-d", "10.0.0.2", "-p", "udp", "-m", "multiport", "--ports", "80,443", "-j", "DROP"],
    ]


def test_reject_resets_tcp_lets_resets_pass_and_refuses_the_rest() -> None:
    assert firewall_rules(RejectSpec(kind="reject", target="r", peer="a", direction="in"), "10.0.0.2") == [
        ["-s", "10.0.0.2", "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "RETURN"],
        ["-s", "10.0.0.2", "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["-s", "10.0.0.2", "-j", "REJECT", "--reject-with", "icmp-port-unreachable"],
    ]


def test_reject_of_given_ports_resets_tcp_and_refuses_udp() -> None:
    spec = RejectSpec(kind="reject", target="r", peer="a", ports=(53,), direction="out")
    ports = ["-m", "multiport", "--ports", "53"]
    assert firewall_rules(spec, "10.0.0.2") == [
        ["-d", "10.0.0.2", "-p", "tcp", *ports, "--tcp-flags", "RST", "RST", "-j", "RETURN"],
        ["-d", "10.0.0.2", "-p", "tcp", *ports, "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["-d", "10.0.0.2", "-p", "udp", *ports, "-j", "REJECT", "--reject-with", "icmp-port-unreachable"],
    ]


def test_sweep_removes_the_runs_chains_in_the_runs_namespaces_only(ctx: FakeContext, shell: FakeShell) -> None:
    from harness.hosts import netns

    mine = netns.names_for(RUN).ns("a")
    shell.namespaces_ = [mine, "mxc-other-a", "unrelated"]
    chain, foreign = chain_name(RUN, "cut"), chain_name("run-other", "cut")
    shell.chains = {mine: {chain: [], "DOCKER": []}, "mxc-other-a": {foreign: []}}
    shell.hooks = {mine: {"INPUT": [chain], "OUTPUT": [chain]}, "mxc-other-a": {"INPUT": [foreign], "OUTPUT": []}}
    assert REGISTRY["partition"].sweep(RUN) == [f"{mine} iptables chain {chain}"]
    assert shell.chains == {mine: {"DOCKER": []}, "mxc-other-a": {foreign: []}}
    assert REGISTRY["partition"].sweep(RUN) == []
    assert REGISTRY["reject"].sweep(RUN) == []  # the same chains: swept by partition


# ---------------------------------------------------------------------------- link_down


def test_link_down_sets_the_bridge_end_down_and_heal_sets_that_link_up(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(LinkDownSpec(kind="link_down", target="reader-1"), "down")
    injected = fault.inject(ctx)
    assert injected.token == "mxv2" and unwitnessed(injected.record) == ({"host": "b", "link": "mxv2"}, "seen")
    assert shell.commands == [(None, ("ip", "link", "set", "dev", "mxv2", "down")),
                              (None, ("ip", "-o", "link", "show", "dev", "mxv2"))]  # its witness
    assert shell.left()["down"] == ["mxv2"]
    assert unwitnessed(fault.heal(ctx, injected.token)) == ({"link": "mxv2", "up": True}, "seen")  # down until now
    assert unwitnessed(fault.heal(ctx, injected.token)) == ({"link": "mxv2", "up": True}, "none")  # it was up
    assert shell.commands[2:] == [(None, ("ip", "-o", "link", "show", "dev", "mxv2")),
                                  (None, ("ip", "link", "set", "dev", "mxv2", "up"))] * 2
    assert shell.left() == NOTHING_LEFT


def test_link_down_heal_after_the_network_is_gone_is_a_noop(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(LinkDownSpec(kind="link_down", target="a"), "down")
    token = fault.inject(ctx).token
    del shell.links["mxv1"]
    assert unwitnessed(fault.heal(ctx, token)) == ({"link": "mxv1", "up": False}, "unwitnessed")


def test_link_down_interrupted_sets_the_link_up_again(ctx: FakeContext, shell: FakeShell) -> None:
    original = shell.run

    def down_then_interrupted(place: Place | None, argv: object) -> tuple[int, str]:
        done = original(place, argv)  # type: ignore[arg-type]
        if "down" in argv:  # type: ignore[operator]
            raise RunInterrupted(2)
        return done

    shell.run = down_then_interrupted  # type: ignore[method-assign]
    with pytest.raises(RunInterrupted):
        make_fault(LinkDownSpec(kind="link_down", target="a"), "down").inject(ctx)
    assert shell.left() == NOTHING_LEFT


def test_link_down_of_a_local_host_is_reported(ctx: FakeContext, shell: FakeShell) -> None:
    with pytest.raises(FaultError, match="link_down: ctl is on host ctl"):
        make_fault(LinkDownSpec(kind="link_down", target="ctl"), "down").inject(ctx)
    assert shell.commands == []


# ---------------------------------------------------------------------------- rate


def tbf(dev: str, rate: str = "8mbit", burst: str = "20000", latency: str = "200ms") -> tuple[str, ...]:
    return ("tc", "qdisc", "replace", "dev", dev, "root", "handle", "1de:", "tbf", "rate", rate, "burst", burst, "latency", latency)


def test_rate_on_both_directions_puts_tbf_on_both_veth_ends_and_heal_removes_them(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(RateSpec(kind="rate", target="a", rate="8mbit", direction="both"), "slow")
    injected = fault.inject(ctx)
    assert injected.token == Qdiscs(((Place(NS_A), "mx0"), (None, "mxv1")))
    assert shell.commands == [(NS_A, tbf("mx0")), (None, tbf("mxv1"))]  # burst: 20 ms of 1 MB/s
    assert injected.record == {"host": "a", "rate": "8mbit", "bits_per_s": 8e6, "burst": 20000,
                               "devices": [f"{NS_A}:mx0", "root:mxv1"]}
    shell.commands.clear()
    assert unwitnessed(fault.heal(ctx, injected.token)) == ({"removed": [f"{NS_A}:mx0", "root:mxv1"]}, "none")
    assert (NS_A, ("tc", "qdisc", "del", "dev", "mx0", "root", "handle", "1de:")) in shell.commands
    assert shell.left() == NOTHING_LEFT
    assert unwitnessed(fault.heal(ctx, injected.token)) == ({"removed": []}, "unwitnessed")


def test_rate_heal_leaves_the_qdiscs_of_other_hosts(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(RateSpec(kind="rate", target="a", rate="1mbit", burst=4000, latency=0.05), "slow")
    assert fault.inject(ctx).token == Qdiscs(((Place(NS_A), "mx0"),))
    assert shell.commands == [(NS_A, tbf("mx0", "1mbit", "4000", "50ms"))]
    shell.qdiscs.add((NS_B, "mx0"))
    fault.heal(ctx, Qdiscs(((Place(NS_A), "mx0"),)))
    assert shell.qdiscs == {(NS_B, "mx0")}


def test_rate_whose_second_qdisc_fails_removes_the_first(ctx: FakeContext, shell: FakeShell) -> None:
    shell.fail("tc", "qdisc", "replace", "dev", "mxv1", rc=2, out="RTNETLINK answers: Invalid argument")
    with pytest.raises(FaultError, match=r"tc qdisc replace dev mxv1 \(bridge side\) failed \(rc 2\)"):
        make_fault(RateSpec(kind="rate", target="a", rate="8mbit", direction="both"), "slow").inject(ctx)
    assert shell.left() == NOTHING_LEFT


def test_rate_of_a_local_host_is_reported(ctx: FakeContext, shell: FakeShell) -> None:
    with pytest.raises(FaultError, match="rate: server is on host ctl"):
        make_fault(RateSpec(kind="rate", target="server", rate="8mbit"), "slow").inject(ctx)
    assert shell.commands == []


# ---------------------------------------------------------------------------- references


def test_network_specs_declare_host_references_and_the_kinds_they_need() -> None:
    partition = PartitionSpec(kind="partition", target="a", peer=SourceOf(source_of="r"))
    assert partition.host_refs() == (("target", "a"), ("peer", SourceOf(source_of="r")))
    assert RejectSpec(kind="reject", target="a", peer="b").host_refs() == (("target", "a"), ("peer", "b"))
    assert LinkDownSpec(kind="link_down", target="a").host_refs() == (("target", "a"),)
    assert RateSpec(kind="rate", target="a", rate="1mbit").host_refs() == (("target", "a"),)
    for kind in ("partition", "reject", "link_down", "rate"):
        assert REGISTRY[kind].Spec.host_kinds == ("netns",)
    assert partition.process_refs() == () and partition.proxy_refs() == ()


# ---------------------------------------------------------------------------- witnesses


def test_a_partition_whose_rules_met_packets_is_witnessed_at_heal_by_its_counters(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(PartitionSpec(kind="partition", target="b", peer="a"), "cut")
    injected = fault.inject(ctx)
    shell.hits[injected.token.chain] = 7
    witness = Witness.of((fault.heal(ctx, injected.token) or {})["witness"])
    assert witness is not None and witness.effect == "seen"
    assert dict(witness.figures) == {"chain": injected.token.chain, "packets": 14, "bytes": 840, "hooks": 2}


def test_a_chain_nothing_jumps_to_is_no_effect_and_says_so(ctx: FakeContext, shell: FakeShell) -> None:
    """The planted regression of the issue: rules in a chain no hook reaches."""
    fault = make_fault(RejectSpec(kind="reject", target="b", peer="a"), "cut")
    injected = fault.inject(ctx)
    shell.hooks[NS_B] = {"INPUT": [], "OUTPUT": []}
    witness = Witness.of((fault.heal(ctx, injected.token) or {})["witness"])
    assert witness is not None and witness.effect == "none"
    assert "no hook jumps to it" in witness.why and witness.figures["hooks"] == 0


def test_a_rate_limit_that_held_packets_back_is_seen(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(RateSpec(kind="rate", target="a", rate="8mbit"), "slow")
    injected = fault.inject(ctx)
    shell.overlimits = 12
    healed, effect = unwitnessed(fault.heal(ctx, injected.token))
    assert effect == "seen" and healed == {"removed": [f"{NS_A}:mx0"]}
