"""``toxic`` and ``proxy_down`` over the fake context and a fake toxiproxy server: the exact
API calls, the token heal undoes (on the server and proxy the inject used), heal twice, an
inject that fails or is interrupted midway, and a proxy the scenario does not have."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fixtures.fault_context import FakeContext, FakeToxiproxy, install_toxiproxy

from harness.errors import FaultError, RunInterrupted
from harness.faults import REGISTRY, _toxic_effect, commands, make_fault
from harness.faults import toxiproxy as toxiproxy_faults
from harness.faults._toxic_effect import Load, Probe, plan, toxic_effect
from harness.faults.netns import chain_name
from harness.faults.toxiproxy import AddedToxic, DisabledProxy, ProxyDownSpec, ToxicSpec, Traffic
from harness.toxiproxy import ToxiproxyError

API = "http://127.0.0.1:8474"
PROXY = "run-fake.mds"
LISTEN = "127.0.0.1:20001"  # the fake proxy's listener


@pytest.fixture
def ctx() -> FakeContext:
    ctx = FakeContext("run-fake")
    ctx.add_proxy("mds", API)
    return ctx


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeToxiproxy:
    server = install_toxiproxy(monkeypatch, FakeToxiproxy(API))
    server.add(PROXY)
    return server


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], int]:
    """What the server's /metrics says each (proxy, stream) has received on closed connections,
    and (listen, "open") the connections ss counts open on a listener."""
    received: dict[tuple[str, str], int] = {}

    def stream_bytes(api: str, proxy: str, stream: str) -> int | None:
        assert api == API
        return received.get((proxy, stream))

    monkeypatch.setattr(toxiproxy_faults, "stream_bytes", stream_bytes)
    monkeypatch.setattr(toxiproxy_faults, "connections", lambda listen: received.get((listen, "open")))
    return received


REMOVE = toxiproxy_faults.remove_refusal_counter  # as written (the fixture below stands in for it)


@pytest.fixture(autouse=True)
def refusals(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """proxy_down's counting chains, by name -> the SYNs each counted (never this machine's
    firewall in a unit test), and no ``ss`` (connections open: none unless ``counters`` says)."""
    chains: dict[str, int] = {}

    def add(chain: str, listen: str) -> str:
        assert listen == LISTEN
        chains[chain] = 0
        return chain

    monkeypatch.setattr(toxiproxy_faults, "add_refusal_counter", add)
    monkeypatch.setattr(toxiproxy_faults, "refused_syns", lambda chain: chains.get(chain))
    monkeypatch.setattr(toxiproxy_faults, "remove_refusal_counter", lambda chain: chains.pop(chain, None) is not None)
    monkeypatch.setattr(toxiproxy_faults, "connections", lambda listen: 0)
    monkeypatch.setattr(toxiproxy_faults, "listening", lambda listen: False)  # its listener closed once down
    return chains


@pytest.fixture(autouse=True)
def probes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Probe]:
    """The toxic's probe, by address (the fake proxy's upstream and listener): never a real call
    in a unit test; the upstream answers in 10 ms, the proxy as the test says (default: +1 s)."""
    answers = {"127.0.0.1:20000": Probe("127.0.0.1:20000", 0.01, "ACK"),
               LISTEN: Probe(LISTEN, 1.01, "ACK")}
    monkeypatch.setattr(toxiproxy_faults, "probe", lambda address, bound, load=None: answers[address])
    monkeypatch.setattr(toxiproxy_faults, "baseline", lambda address, how: answers[address])
    monkeypatch.setattr(toxiproxy_faults, "SETTLE_S", 0.0)
    return answers


def latency() -> ToxicSpec:
    return ToxicSpec.model_validate({"kind": "toxic", "proxy": "mds", "type": "latency", "stream": "upstream",
                                     "toxicity": 0.5, "attributes": {"latency": "1s", "jitter": 50}})


def test_toxic_adds_one_toxic_and_heal_removes_exactly_it(ctx: FakeContext, server: FakeToxiproxy,
                                                          counters: dict[tuple[str, str], int]) -> None:
    counters[(PROXY, "upstream")] = 100
    fault = make_fault(latency(), "slow")
    injected = fault.inject(ctx)
    body = {"name": "slow", "type": "latency", "stream": "upstream", "toxicity": 0.5, "attributes": {"latency": 1000, "jitter": 50}}
    assert server.calls == [("add_toxic", PROXY, body), ("toxics", PROXY)]  # added, then read back
    assert ctx.recorded("proxy") == [("mds",)]
    assert injected.token == AddedToxic(API, "mds", PROXY, "slow", "upstream", LISTEN, Traffic(100, None))
    effect = injected.record.pop("witness")
    assert (effect["effect"], effect["figures"]["added_ms"], effect["figures"]["expected_ms"]) == ("seen", 1000.0, 950)
    assert injected.record == {"proxy": "mds", "toxiproxy_name": PROXY, "toxic": "slow", "type": "latency",
                               "stream": "upstream", "toxicity": 0.5, "attributes": {"latency": 1000, "jitter": 50}}
    server.proxies[PROXY]["toxics"]["other"] = {"name": "other"}
    counters[(PROXY, "upstream")] = 1300  # what a client sent through it meanwhile, and closed
    seen = {"effect": "seen", "why": "proxy mds: None connections open at inject, None at heal, 1200 bytes upstream "
            "on connections closed meanwhile",
            "figures": {"stream": "upstream", "closed_bytes": 1200, "open_at_inject": None, "open_at_heal": None}}
    assert fault.heal(ctx, injected.token) == {"proxy": "mds", "toxic": "slow", "removed": True, "witness": seen}
    assert fault.heal(ctx, injected.token) == {"proxy": "mds", "toxic": "slow", "removed": False, "witness": seen}
    assert list(server.proxies[PROXY]["toxics"]) == ["other"]
    assert ctx.recorded("proxy") == [("mds",)]  # heal needs no proxy from the context


def test_a_toxic_no_connection_went_through_is_no_effect_and_one_unread_is_not_witnessed(
        ctx: FakeContext, server: FakeToxiproxy, counters: dict[tuple[str, str], int]) -> None:
    fault = make_fault(latency(), "slow")
    token = fault.inject(ctx).token  # neither /metrics nor ss answer
    assert ((fault.heal(ctx, token) or {})["witness"]["effect"]) == "unwitnessed"
    counters[(PROXY, "upstream")] = 7
    counters[(LISTEN, "open")] = 0
    token = fault.inject(ctx).token
    witness = (fault.heal(ctx, token) or {})["witness"]
    assert (witness["effect"], witness["figures"]["closed_bytes"]) == ("none", 0)  # a toxic on a proxy no client used
    token = fault.inject(ctx).token
    counters[(LISTEN, "open")] = 1  # a gRPC channel open through it (its bytes count only when it closes)
    assert (fault.heal(ctx, token) or {})["witness"]["effect"] == "seen"


def listed(toxicity: float) -> list[dict[str, object]]:
    return [{"name": "slow", "type": "latency", "toxicity": toxicity, "attributes": {"latency": 1000}}]


UP, THROUGH = Probe("u", 0.010, "ACK"), Probe("p", 1.012, "ACK")
LATE = Probe("p", 0.9, "TIMEOUT")
LAT = {"latency": 1000}


@pytest.mark.parametrize(("kind", "attributes", "toxics", "direct", "through", "effect", "said"), [
    ("latency", LAT, listed(1.0), UP, THROUGH, "seen", "+1002 ms for the 1000 ms a latency toxic adds"),
    ("latency", LAT, listed(1.0), UP, Probe("p", 0.011, "ACK"), "none", "+1 ms for the 1000 ms a latency toxic adds"),
    ("latency", LAT, listed(0.5), UP, Probe("p", 0.011, "ACK"), "unwitnessed", "may have been spared"),
    ("latency", LAT, listed(0.0), UP, THROUGH, "none", "toxicity 0.0: it applies to no connection"),  # whatever it probed
    ("latency", LAT, [], UP, THROUGH, "none", "toxiproxy lists no toxic slow"),
    ("latency", LAT, None, UP, THROUGH, "unwitnessed", "could not be read back"),
    ("latency", LAT, listed(1.0), Probe("u", 0.9, "NOT_HTTP2"), None, "unwitnessed", "did not answer the probe"),
    ("latency", {"latency": 100, "jitter": 100}, listed(1.0), None, None, "unwitnessed", "cannot be told apart"),
    ("timeout", {"timeout": 0}, listed(1.0), UP, LATE, "seen", "held or cut"),
    ("timeout", {"timeout": 0}, listed(1.0), UP, Probe("p", 0.012, "ACK"), "none", "answered as directly"),
    # a load of 30000 bytes at 100 KB/s: 300 ms more; the upstream's own time under a quarter of it
    ("bandwidth", {"rate": 100}, listed(1.0), UP, Probe("p", 0.31, "ACK"), "seen", "carrying 30000 bytes downstream"),
    ("bandwidth", {"rate": 100}, listed(1.0), UP, Probe("p", 0.02, "ACK"), "none", "+10 ms for the 300 ms"),
    ("bandwidth", {"rate": 100}, listed(1.0), Probe("u", 0.1, "ACK"), Probe("p", 0.3, "ACK"), "unwitnessed",
     "the upstream alone took more than a quarter"),
    ("bandwidth", {"rate": 0}, listed(1.0), UP, LATE, "seen", "held or cut"),  # toxiproxy passes nothing on
    ("bandwidth", {"rate": 100000}, listed(1.0), None, None, "unwitnessed", "under the 100 ms a probe can tell apart"),
    ("slicer", {"average_size": 64, "delay": 1000}, listed(1.0), UP, Probe("p", 0.5, "ACK"), "seen", "for the 300 ms"),
    ("slicer", {"average_size": 64, "delay": 1000}, listed(1.0), UP, Probe("p", 0.01, "ACK"), "none", "+0 ms"),
    ("slicer", {"average_size": 64}, listed(1.0), None, None, "unwitnessed", "a slicer without delay"),
    ("limit_data", {"bytes": 1000}, listed(1.0), UP, Probe("p", 0.001, "CLOSED"), "seen", "held or cut"),
    ("limit_data", {"bytes": 1000}, listed(1.0), UP, Probe("p", 0.012, "ACK"), "none", "answered as directly"),
    ("limit_data", {"bytes": 1 << 30}, listed(1.0), None, None, "unwitnessed", "more than a probe moves"),
    ("reset_peer", {"timeout": 0}, listed(1.0), None, None, "unwitnessed", "a reset_peer toxic is not probed"),
])
def test_a_toxics_effect_is_read_back_from_toxiproxy_and_probed_through_its_proxy(
        kind: str, attributes: dict[str, int], toxics: list[dict[str, object]] | None, direct: Probe | None,
        through: Probe | None, effect: str, said: str) -> None:
    witness = toxic_effect("mds", "slow", plan(kind, "downstream", attributes), toxics, direct, through)
    assert witness.effect == effect and said in witness.why, witness


@pytest.mark.parametrize(("kind", "stream", "attributes", "load", "expected_ms"), [
    ("bandwidth", "upstream", {"rate": 1000}, Load("upstream", 300_000), 300.0),  # toxiproxy: len / rate ms
    ("bandwidth", "downstream", {"rate": 1000}, Load("downstream", 300_000), 300.0),
    ("bandwidth", "downstream", {"rate": 2000}, Load("downstream", 512 << 10), 262.1),  # at most 512 KiB back
    ("slicer", "upstream", {"average_size": 1000, "size_variation": 24, "delay": 2000}, Load("upstream", 153_600), 300.0),
    ("limit_data", "downstream", {"bytes": 100}, Load("downstream", 4196), 0.0),
    ("latency", "upstream", {"latency": 300, "jitter": 100}, None, 200.0),
])
def test_a_probes_load_is_sized_to_show_its_toxic(kind: str, stream: str, attributes: dict[str, int], load: Load | None,
                                                  expected_ms: float) -> None:
    how = plan(kind, stream, attributes)
    assert (how.load, how.expected_ms, how.cuts, how.skip) == (load, expected_ms, kind == "limit_data", "")


def test_a_load_upstream_is_frames_the_server_discards_and_downstream_settings_it_acknowledges() -> None:
    up, acks = Load("upstream", 40_000).frames()
    assert acks == 2 and len(up) in range(40_000, 40_000 + 9 + 9)  # filler frames, then one SETTINGS
    assert _toxic_effect._acknowledged(up) == (0, True, b"")  # a frame type HTTP/2 does not define
    down, acks = Load("downstream", 100).frames()
    assert (acks, down) == (1 + 12, frame(4, 0) * 12)  # twelve empty SETTINGS, each acknowledged


def test_a_toxic_of_toxicity_zero_is_no_effect_at_its_inject(ctx: FakeContext, server: FakeToxiproxy,
                                                            probes: dict[str, Probe]) -> None:
    spec = ToxicSpec.model_validate({"kind": "toxic", "proxy": "mds", "type": "timeout", "toxicity": 0,
                                     "attributes": {"timeout": 0}})
    probes[LISTEN] = Probe(LISTEN, 0.012, "ACK")  # toxiproxy spared the probe's connection
    witness = make_fault(spec, "cut").inject(ctx).record["witness"]
    assert witness["effect"] == "none" and "with toxicity 0" in witness["why"]


def frame(kind: int, flags: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags, 0, 0, 0, 0)) + payload


@pytest.mark.parametrize(("received", "acks", "foreign", "left"), [
    (frame(4, 0, bytes(6)) + frame(4, 1), 1, False, b""),  # the server's SETTINGS, then its ACK of ours
    (frame(4, 1) + frame(4, 0, bytes(6)) + frame(4, 1), 2, False, b""),
    (frame(4, 0, bytes(6)) + frame(8, 0, bytes(4)), 0, False, b""),  # no ACK yet: read on
    (frame(4, 0, bytes(6))[:7], 0, False, frame(4, 0, bytes(6))[:7]),  # half a header
    (frame(4, 1)[:5] , 0, False, frame(4, 1)[:5]),
    (b"-ERR unknown command 'PRI'\r\n", 0, True, b""),  # a redis
])
def test_the_probe_reads_http2_frames_counting_its_settings_acknowledged(received: bytes, acks: int, foreign: bool,
                                                                         left: bytes) -> None:
    assert _toxic_effect._acknowledged(received) == (acks, foreign, left)


def test_a_toxic_before_an_upstream_that_is_no_grpc_server_is_not_probed_through_its_proxy(
        ctx: FakeContext, server: FakeToxiproxy, probes: dict[str, Probe]) -> None:
    probes["127.0.0.1:20000"] = Probe("127.0.0.1:20000", 0.004, "NOT_HTTP2")  # a redis answers no HTTP/2
    del probes[LISTEN]  # a probe through the proxy would raise KeyError
    witness = make_fault(latency(), "slow").inject(ctx).record["witness"]
    assert witness["effect"] == "unwitnessed" and "did not answer the probe directly (NOT_HTTP2)" in witness["why"]


def test_a_toxic_the_server_refuses_removes_nothing(ctx: FakeContext, server: FakeToxiproxy) -> None:
    server.proxies[PROXY]["toxics"]["slow"] = {"name": "slow", "type": "timeout"}  # someone else's, same name
    with pytest.raises(FaultError, match=r"toxic slow on proxy mds: .*HTTP 409"):
        make_fault(latency(), "slow").inject(ctx)
    assert server.proxies[PROXY]["toxics"] == {"slow": {"name": "slow", "type": "timeout"}}


def test_a_toxic_whose_answer_never_came_is_removed(ctx: FakeContext, server: FakeToxiproxy) -> None:
    server.fail("add_toxic", ToxiproxyError("POST: toxiproxy did not answer: timed out"), after=True)
    with pytest.raises(FaultError, match="did not answer"):
        make_fault(latency(), "slow").inject(ctx)
    assert server.proxies[PROXY]["toxics"] == {}
    assert server.calls[-1] == ("remove_toxic", PROXY, "slow")


def test_a_toxic_interrupted_mid_inject_is_removed(ctx: FakeContext, server: FakeToxiproxy) -> None:
    server.fail("add_toxic", RunInterrupted(2), after=True)
    with pytest.raises(RunInterrupted):
        make_fault(latency(), "slow").inject(ctx)
    assert server.proxies[PROXY]["toxics"] == {}


def test_proxy_down_disables_and_heal_enables_the_same_proxy(ctx: FakeContext, server: FakeToxiproxy,
                                                             refusals: dict[str, int]) -> None:
    fault = make_fault(ProxyDownSpec(kind="proxy_down", proxy="mds"), "down")
    injected = fault.inject(ctx)
    chain = chain_name("run-fake", "down")
    assert server.calls == [("update_proxy", PROXY, {"enabled": False})]
    assert injected.token == DisabledProxy(API, "mds", PROXY, LISTEN, 0, chain, False)
    assert injected.record == {"proxy": "mds", "toxiproxy_name": PROXY, "enabled": False, "cut": 0, "counter": chain}
    assert server.proxies[PROXY]["enabled"] is False and refusals == {chain: 0}
    refusals[chain] = 3  # three SYNs met its closed listener
    healed = fault.heal(ctx, injected.token)
    assert healed is not None and healed.pop("witness") == {
        "effect": "seen", "figures": {"cut": 0, "refused_syns": 3},
        "why": "proxy mds: 0 connections cut as it went down, 3 SYNs refused while down"}
    assert healed == {"proxy": "mds", "enabled": True, "listen": "127.0.0.1:20001"} and refusals == {}
    again = fault.heal(ctx, injected.token)  # the chain is gone: its refusals cannot be read again
    assert again is not None and again["enabled"] is True and again["witness"]["effect"] == "unwitnessed"
    del server.proxies[PROXY]
    assert fault.heal(ctx, injected.token)["gone"] is True  # type: ignore[index]


@pytest.mark.parametrize(("cut", "counter", "refused", "listening", "effect"), [
    (2, None, None, False, "seen"),  # connections were open: going down cut them, whatever was refused
    (0, "c", 1, False, "seen"),
    (0, "c", 0, False, "none"),  # nothing tried it
    (0, None, None, None, "unwitnessed"),  # no root or iptables: its refusals went uncounted
    # the mutant inject_proxy_stays_up: the proxy never went down, so the open connections were not
    # cut and the SYNs counted were accepted, not refused
    (2, "c", 3, True, "none"),
])
def test_a_down_proxys_witness_is_the_connections_it_cut_and_refused(cut: int, counter: str | None, refused: int | None,
                                                                     listening: bool | None, effect: str) -> None:
    token = DisabledProxy(API, "mds", PROXY, LISTEN, cut, counter, listening)
    assert toxiproxy_faults.down_witness(token, refused).effect == effect


def test_the_refusal_rule_counts_first_packets_to_the_listener_only() -> None:
    assert toxiproxy_faults._refusal_rule("10.9.0.1:20001") == [
        "-d", "10.9.0.1", "-p", "tcp", "--dport", "20001", "--tcp-flags", "SYN,ACK,RST", "SYN", "-j", "RETURN"]
    assert toxiproxy_faults._refusal_rule("nowhere") is None


def test_proxy_down_interrupted_mid_inject_enables_it_again(ctx: FakeContext, server: FakeToxiproxy) -> None:
    server.fail("update_proxy", RunInterrupted(15), after=True)
    with pytest.raises(RunInterrupted):
        make_fault(ProxyDownSpec(kind="proxy_down", proxy="mds"), "down").inject(ctx)
    assert server.proxies[PROXY]["enabled"] is True


def test_proxy_down_of_a_proxy_the_server_lacks_changes_nothing(ctx: FakeContext, server: FakeToxiproxy) -> None:
    del server.proxies[PROXY]
    with pytest.raises(FaultError, match=r"proxy_down mds: .*HTTP 404"):
        make_fault(ProxyDownSpec(kind="proxy_down", proxy="mds"), "down").inject(ctx)
    assert server.calls == [("update_proxy", PROXY, {"enabled": False})]


@pytest.mark.parametrize("spec", [ToxicSpec.model_validate({"kind": "toxic", "proxy": "nope", "type": "timeout",
                                                             "attributes": {"timeout": 0}}),
                                  ProxyDownSpec(kind="proxy_down", proxy="nope")])
def test_a_proxy_the_scenario_lacks_is_reported(ctx: FakeContext, server: FakeToxiproxy, spec: ToxicSpec) -> None:
    with pytest.raises(FaultError, match="no proxy named 'nope'"):
        make_fault(spec, "f").inject(ctx)
    assert server.calls == []


def test_proxy_specs_declare_their_proxy() -> None:
    assert latency().proxy_refs() == ("mds",)
    assert ProxyDownSpec(kind="proxy_down", proxy="mds").proxy_refs() == ("mds",)
    assert latency().process_refs() == () and latency().host_refs() == ()


def test_sweep_deletes_the_runs_proxies_from_its_recorded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.faults.toxiproxy as toxiproxy_faults

    server = install_toxiproxy(monkeypatch, FakeToxiproxy(API))
    for name in ("run-a.mds", "run-a.other", "run-ab.mds"):
        server.add(name)
    monkeypatch.setattr(toxiproxy_faults, "recorded_toxiproxy_api", lambda run_id: API if run_id == "run-a" else None)
    assert sorted(REGISTRY["toxic"].sweep("run-a")) == [f"toxiproxy proxy run-a.mds at {API}", f"toxiproxy proxy run-a.other at {API}"]
    assert list(server.proxies) == ["run-ab.mds"]
    assert REGISTRY["toxic"].sweep("run-b") == []  # no server recorded
    assert REGISTRY["proxy_down"].sweep("run-a") == []


class RootFirewall:
    """``commands.shell`` with this machine's (root namespace) iptables: the chains by name."""

    def __init__(self, chains: dict[str, list[str]]) -> None:
        self.chains = chains
        self.jumps = [name for name in chains]  # each hooked from INPUT once
        self.commands: list[tuple[str, ...]] = []

    def have(self, program: str) -> bool:
        return program == "iptables"

    def namespaces(self) -> list[str]:
        return []

    def run(self, place: object, argv: Sequence[str]) -> tuple[int, str]:
        assert place is None and tuple(argv[:3]) == ("iptables", "-w", "5")
        words = tuple(argv[3:])
        self.commands.append(words)
        if words == ("-S",):
            return 0, "\n".join(["-P INPUT ACCEPT", *(f"-N {c}" for c in self.chains), *(f"-A INPUT -j {c}" for c in self.jumps)])
        if words[0] == "-S":
            return (0, "") if words[1] in self.chains else (1, "No chain/target/match by that name.")
        if words[:2] == ("-D", "INPUT") and words[3] in self.jumps:
            self.jumps.remove(words[3])
            return 0, ""
        if words[0] == "-X" and words[1] in self.chains:
            del self.chains[words[1]]
            return 0, ""
        return (0, "") if words[0] == "-F" else (1, "no such rule")


def test_sweep_removes_the_refusal_counters_of_its_run_only(monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs = chain_name("run-a", "down"), chain_name("run-b", "down")
    shell = RootFirewall({mine: [], theirs: []})
    monkeypatch.setattr(commands, "shell", shell)
    monkeypatch.setattr(toxiproxy_faults, "remove_refusal_counter", REMOVE)
    assert REGISTRY["proxy_down"].sweep("run-a") == [f"iptables chain {mine}"]
    assert list(shell.chains) == [theirs] and shell.jumps == [theirs]
    assert REGISTRY["proxy_down"].sweep("run-a") == []  # idempotent
