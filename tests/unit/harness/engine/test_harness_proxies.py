"""Proxies in scenarios (``proxies``, ``server_via``) and the toxiproxy fault kinds (``toxic``,
``proxy_down``): the schema, its cross-references, the toxic attribute rules, and what the
capability probe and the fault registry make of them. No toxiproxy server is started here."""

from __future__ import annotations

import textwrap
import time

import pytest

from harness.errors import ScenarioInvalid
from harness.faults import REGISTRY
from harness.faults.toxiproxy import TOXIC_ATTRIBUTES, ToxicSpec
from harness.scenario import FaultStep, ReaderProcess, describe_step, parse_scenario
from harness.scenario.capabilities import scenario_requirements
from harness.toxiproxy import ToxiproxyAPI, ToxiproxyError, proxy_name

GOOD = """\
name: demo
proxies:
  mds: {upstream: server}
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader, server_via: mds, options: {rpc_timeout: 3s}}
steps:
  - start: server
  - start: source-1
  - fault: {kind: toxic, proxy: mds, name: slow, type: latency, attributes: {latency: 1s, jitter: 50}}
  - start: reader-1
  - await: {process: reader-1, exit: true}
  - heal: slow
  - fault: {kind: proxy_down, proxy: mds, duration: 2s}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(textwrap.dedent(text), "x.yaml")
    return [issue.render("x.yaml") for issue in info.value.issues]


def toxic(**keys: object) -> ToxicSpec:
    return ToxicSpec.model_validate({"kind": "toxic", "proxy": "mds", **keys})


# ----------------------------------------------------------------------------- schema


def test_a_proxied_scenario_parses_and_its_reader_reaches_the_upstream_server() -> None:
    sc = parse_scenario(GOOD, "x.yaml")
    assert sc.proxies["mds"].upstream == "server"
    reader = sc.processes["reader-1"]
    assert isinstance(reader, ReaderProcess) and reader.server_via == "mds"
    assert sc.server_of("reader-1") == "server"  # the proxy names its server
    assert sc.server_of("source-1") == "server"
    assert [a for a in reader.options.argv() if a in ("--rpc-timeout", "3")] == ["--rpc-timeout", "3"]
    fault = next(s for s in sc.steps if isinstance(s, FaultStep))
    assert isinstance(fault.fault, ToxicSpec) and fault.fault.attributes == {"latency": 1000, "jitter": 50}
    assert describe_step(fault) == "fault toxic mds (slow)"


def test_server_via_names_the_server_even_when_there_are_several() -> None:
    text = GOOD.replace("  server: {role: server}\n", "  server: {role: server}\n  other: {role: server}\n")
    text = text.replace("source-1: {role: source}", "source-1: {role: source, server: other}")
    text = text.replace("  - start: server\n", "  - start: [server, other]\n")
    assert parse_scenario(text, "x.yaml").server_of("reader-1") == "server"


def test_a_scenario_without_proxies_has_none_and_needs_no_toxiproxy() -> None:
    text = "name: plain\nprocesses:\n  server: {role: server}\nsteps:\n  - start: server\n"
    sc = parse_scenario(text, "x.yaml")
    assert sc.proxies == {}
    assert scenario_requirements(sc) == {}


# ----------------------------------------------------------------------------- cross-references


def test_server_via_must_name_a_proxy() -> None:
    assert problems(GOOD.replace("server_via: mds", "server_via: mdz")) == [
        "x.yaml:7: processes.reader-1.server_via: no proxy named 'mdz'; did you mean 'mds'? (proxies: mds)"
    ]


def test_server_via_without_any_proxy_says_none_are_defined() -> None:
    text = GOOD.replace("proxies:\n  mds: {upstream: server}\n", "")
    text = text.split("  - fault: {kind: toxic")[0] + "  - start: reader-1\n"
    assert problems(text) == ["x.yaml:5: processes.reader-1.server_via: no proxy named 'mds' (proxies: none defined)"]


def test_a_proxy_upstream_must_be_a_server_or_a_redis() -> None:
    assert problems(GOOD.replace("mds: {upstream: server}", "mds: {upstream: source-1}")) == [
        "x.yaml:3: proxies.mds.upstream: 'source-1' is a source, expected a server or redis"
    ]
    assert problems(GOOD.replace("mds: {upstream: server}", "mds: {upstream: sever}")) == [
        "x.yaml:3: proxies.mds.upstream: no server or redis process named 'sever'; did you mean 'server'? "
        "(processes: server, source-1, reader-1)",
        "x.yaml:12: steps[3].start: 'reader-1' is started before its server 'sever'",  # as for a typo in `server`
    ]


def test_server_via_must_lead_to_the_process_server() -> None:
    text = GOOD.replace("  server: {role: server}\n", "  server: {role: server}\n  other: {role: server}\n")
    text = text.replace("source-1: {role: source}", "source-1: {role: source, server: other}")
    text = text.replace("server_via: mds,", "server_via: mds, server: other,")
    text = text.replace("  - start: server\n", "  - start: [server, other]\n")
    assert problems(text) == [
        "x.yaml:8: processes.reader-1.server_via: proxy 'mds' leads to 'server', not to this reader's server 'other'"
    ]


def test_a_fault_must_name_a_proxy_of_the_scenario() -> None:
    assert problems(GOOD.replace("{kind: proxy_down, proxy: mds", "{kind: proxy_down, proxy: mdx")) == [
        "x.yaml:15: steps[6].fault.proxy: no proxy named 'mdx'; did you mean 'mds'? (proxies: mds)"
    ]


def test_proxy_keys_are_strict() -> None:
    assert problems(GOOD.replace("mds: {upstream: server}", "mds: {upstream: server, listen: 8474}")) == [
        "x.yaml:3: proxies.mds.listen: unknown key 'listen' (allowed: upstream)"
    ]
    assert problems(GOOD.replace("server_via: mds", "server_vai: mds"))[0].startswith(
        "x.yaml:7: processes.reader-1.server_vai: unknown key 'server_vai'; did you mean 'server_via'?"
    )


# ----------------------------------------------------------------------------- toxic attributes


def test_every_toxic_type_has_attribute_rules() -> None:
    kinds = ToxicSpec.model_fields["type"].annotation.__args__  # type: ignore[union-attr]
    assert set(kinds) == set(TOXIC_ATTRIBUTES)


@pytest.mark.parametrize(
    ("kind", "attributes", "sent"),
    [
        ("latency", {"latency": 1000}, {"latency": 1000}),
        ("latency", {"latency": "1.5s", "jitter": "20ms"}, {"latency": 1500, "jitter": 20}),
        ("bandwidth", {"rate": 64}, {"rate": 64}),
        ("slow_close", {"delay": "250ms"}, {"delay": 250}),
        ("timeout", {"timeout": 0}, {"timeout": 0}),  # 0: hold the connection, drop its data
        ("reset_peer", {}, {}),
        ("slicer", {"average_size": 64, "size_variation": 8, "delay": 10}, {"average_size": 64, "size_variation": 8, "delay": 10}),
        ("limit_data", {"bytes": 4096.0}, {"bytes": 4096}),
    ],
)
def test_toxic_attributes_are_checked_and_normalised_per_type(kind: str, attributes: dict[str, object], sent: dict[str, int]) -> None:
    assert toxic(type=kind, attributes=attributes).attributes == sent


@pytest.mark.parametrize(
    ("kind", "attributes", "message"),
    [
        ("latency", {}, "a latency toxic needs 'latency' (attributes: latency [ms, required], jitter [ms])"),
        ("latency", {"latncy": 5}, "'latncy' is not an attribute of a latency toxic; did you mean 'latency'?"),
        ("timeout", {"latency": 5}, "'latency' is not an attribute of a timeout toxic (attributes: timeout [ms, required])"),
        ("latency", {"latency": -1}, "latency toxic: 'latency' must be a whole number of milliseconds >= 0, or a duration"),
        ("latency", {"latency": "soon"}, "latency toxic: 'latency' must be a whole number of milliseconds"),
        ("latency", {"latency": "0.5ms"}, "latency toxic: 'latency' must be a whole number of milliseconds"),
        ("latency", {"latency": True}, "latency toxic: 'latency' must be a whole number of milliseconds"),
        ("bandwidth", {"rate": "1s"}, "bandwidth toxic: 'rate' must be a whole number >= 0 (KB/s) (got '1s')"),
        ("limit_data", {"bytes": 1.5}, "limit_data toxic: 'bytes' must be a whole number >= 0 (bytes) (got 1.5)"),
        ("slicer", {"size_variation": 3}, "a slicer toxic needs 'average_size'"),
        # toxiproxy 2.5 would recurse without end slicing into pieces of 0 bytes (its server dies)
        ("slicer", {"average_size": 0}, "slicer toxic: 'average_size' must be a whole number >= 1 (bytes) (got 0)"),
    ],
)
def test_bad_toxic_attributes_are_refused_with_the_rule(kind: str, attributes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        toxic(type=kind, attributes=attributes)
    assert message in str(info.value)


def test_toxic_type_stream_and_toxicity_are_checked() -> None:
    with pytest.raises(ValueError, match="toxicity"):
        toxic(type="latency", attributes={"latency": 1}, toxicity=1.5)
    with pytest.raises(ValueError, match="stream"):
        toxic(type="latency", attributes={"latency": 1}, stream="sideways")
    with pytest.raises(ValueError, match="type"):
        toxic(type="lag", attributes={"latency": 1})


def test_a_toxic_problem_is_located_in_the_file() -> None:
    assert problems(GOOD.replace("attributes: {latency: 1s, jitter: 50}", "attributes: {jitter: 50}")) == [
        "x.yaml:11: steps[2].fault.attributes: a latency toxic needs 'latency' "
        "(attributes: latency [ms, required], jitter [ms])"
    ]


# ----------------------------------------------------------------------------- registry, capabilities, client


def test_the_proxy_faults_heal_and_need_toxiproxy() -> None:
    for kind in ("toxic", "proxy_down"):
        cls = REGISTRY[kind]
        assert cls.healable and cls.requires == ("toxiproxy",)
        assert cls.Spec.model_validate({"kind": kind, "proxy": "p", "type": "timeout",
                                        "attributes": {"timeout": 0}} if kind == "toxic" else
                                       {"kind": kind, "proxy": "p"}).proxy_refs() == ("p",)


def test_proxies_alone_require_toxiproxy() -> None:
    sc = parse_scenario(GOOD, "x.yaml")
    assert scenario_requirements(sc) == {"toxiproxy": ["proxies (mds)", "slow (toxic)", "proxy_down-2 (proxy_down)"]}
    plain = GOOD.split("  - fault: {kind: toxic")[0] + "  - start: reader-1\n"
    assert scenario_requirements(parse_scenario(plain, "x.yaml")) == {"toxiproxy": ["proxies (mds)"]}


def test_proxy_names_carry_the_run_id() -> None:
    assert proxy_name("smoke-20260101T000000-abcdef", "mds") == "smoke-20260101T000000-abcdef.mds"


def test_the_api_client_fails_fast_and_bounded_when_nothing_answers() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connection refused
        api = ToxiproxyAPI(f"http://127.0.0.1:{port}", timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ToxiproxyError) as info:
            api.version()
    assert info.value.status is None and "did not answer" in str(info.value)
    assert time.monotonic() - started < 1.0


def test_sweep_without_a_recorded_api_removes_nothing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path))
    assert REGISTRY["toxic"].sweep("no-such-run") == []
