"""A scenario's store (``harness.scenario.stores``) and the ``redis`` role's command line: ``store:
redis`` (or ``--store redis`` for every scenario) adds a redis process where there is none and
points every server at it, a server's ``store`` must name a redis process, the server gets
``--store redis://HOST:PORT/0``, and a restarted redis binds its previous port."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from harness.engine import launch
from harness.errors import ScenarioInvalid
from harness.scenario import RedisProcess, Scenario, ServerProcess, parse_scenario
from harness.scenario.stores import with_store

PLAIN = """\
name: plain
processes:
  server: {role: server}
  source-1: {role: source}
steps:
  - start: [server, source-1]
"""


def load(text: str) -> Scenario:
    return parse_scenario(textwrap.dedent(text), "x.yaml")


def place(tmp_path: Path, name: str, **extra: object) -> launch.Placement:
    return launch.Placement(run_dir=tmp_path, events_path=tmp_path / "procs" / f"{name}.events.jsonl",
                            log_path=tmp_path / "procs" / f"{name}.log", host_address="127.0.0.1", in_netns=False,
                            incarnation=1, **extra)  # type: ignore[arg-type]


def test_memory_is_the_default_and_changes_nothing() -> None:
    sc = load(PLAIN)
    assert sc.store == "memory" and set(sc.processes) == {"server", "source-1"}
    assert with_store(sc, "memory") is sc


def test_redis_adds_a_store_process_and_points_every_server_at_it() -> None:
    sc = with_store(load(PLAIN), "redis")
    assert sc.store == "redis"
    assert sc.processes["store"] == RedisProcess(role="redis")
    server = sc.processes["server"]
    assert isinstance(server, ServerProcess) and server.store == "store"
    assert sc.steps == load(PLAIN).steps  # steps as written
    assert with_store(sc, "redis") == sc  # idempotent


def test_the_store_key_of_a_file_does_the_same_and_a_named_redis_process_is_used() -> None:
    sc = load(PLAIN.replace("name: plain", "name: plain\nstore: redis"))
    assert isinstance(sc.processes["server"], ServerProcess) and sc.processes["server"].store == "store"
    own = load(PLAIN.replace("  source-1: {role: source}", "  source-1: {role: source}\n  kv: {role: redis, port: 6390}")
               .replace("name: plain", "name: plain\nstore: redis"))
    assert "store" not in own.processes
    assert isinstance(own.processes["server"], ServerProcess) and own.processes["server"].store == "kv"


def test_a_server_store_must_be_a_redis_process() -> None:
    with pytest.raises(ScenarioInvalid) as caught:
        load(PLAIN.replace("server: {role: server}", "server: {role: server, store: source-1}"))
    assert "processes.server.store: 'source-1' is a source, expected a redis" in str(caught.value)
    with pytest.raises(ScenarioInvalid) as caught:
        load(PLAIN.replace("server: {role: server}", "server: {role: server, store: nowhere}"))
    assert "no redis process named 'nowhere'" in str(caught.value)


def test_a_process_named_store_that_is_not_redis_is_an_error_naming_it() -> None:
    text = PLAIN.replace("  source-1: {role: source}", "  store: {role: source}").replace("[server, source-1]", "[server, store]")
    with pytest.raises(ValueError, match="cannot add a redis process named 'store': the source process has that name"):
        with_store(load(text), "redis")
    with pytest.raises(ValueError, match="store 'disk': expected one of memory, redis"):
        with_store(load(PLAIN), "disk")


def test_the_server_gets_the_redis_url_and_redis_its_port_folder_and_events(tmp_path: Path) -> None:
    sc = with_store(load(PLAIN), "redis")
    argv = launch.process_argv(sc, "server", place(tmp_path, "server", store_address="127.0.0.1:6390"))
    assert argv[argv.index("--store") + 1] == "redis://127.0.0.1:6390/0"
    with pytest.raises(ValueError, match="needs that redis process's address"):
        launch.process_argv(sc, "server", place(tmp_path, "server"))
    redis_argv = launch.process_argv(sc, "store", place(tmp_path, "store"))
    assert redis_argv[:3] == [sys.executable, "-m", "harness.subjects.redisd"]
    assert redis_argv[redis_argv.index("--port") + 1] == "0"
    assert redis_argv[redis_argv.index("--dir") + 1] == str(tmp_path / "procs" / "store.redis")
    assert redis_argv[redis_argv.index("--events") + 1] == str(tmp_path / "procs" / "store.events.jsonl")
    restarted = launch.process_argv(sc, "store", place(tmp_path, "store", last_port=41234))
    assert restarted[restarted.index("--port") + 1] == "41234"
    plain = launch.process_argv(load(PLAIN), "server", place(tmp_path, "server"))
    assert "--store" not in plain


def test_a_scenario_on_redis_needs_redis_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.scenario import capabilities

    assert "redis-server" not in capabilities.scenario_requirements(load(PLAIN))
    needs = capabilities.scenario_requirements(with_store(load(PLAIN), "redis"))
    assert needs["redis-server"] == ["processes (store)"]
    monkeypatch.setenv(capabilities.ENV_MISSING, "redis-server")
    assert capabilities.missing(needs) == ["redis-server"]


PROXIED = """\
name: proxied
store: redis
proxies:
  kv: {upstream: kv-store}
processes:
  kv-store: {role: redis}
  server: {role: server, store_via: kv}
  source-1: {role: source}
steps:
  - start: [server, source-1]
"""


def test_a_server_may_reach_its_store_through_a_proxy_that_leads_to_it() -> None:
    sc = load(PROXIED)
    server = sc.processes["server"]
    assert isinstance(server, ServerProcess) and (server.store, server.store_via) == ("kv-store", "kv")
    bad = PROXIED.replace("  kv-store: {role: redis}", "  kv-store: {role: redis}\n  other: {role: redis}").replace(
        "server: {role: server, store_via: kv}", "server: {role: server, store: other, store_via: kv}")
    with pytest.raises(ScenarioInvalid) as caught:
        load(bad)
    assert "proxy 'kv' leads to 'kv-store', not to this server's store 'other'" in str(caught.value)
    with pytest.raises(ScenarioInvalid) as caught:
        load(PROXIED.replace("store: redis\n", ""))
    assert "the server has no store to reach through a proxy" in str(caught.value)
    with pytest.raises(ScenarioInvalid) as caught:
        load(PROXIED.replace("  source-1: {role: source}", "  source-1: {role: source, server_via: kv}"))
    assert "proxy 'kv' leads to the redis 'kv-store', not to a server" in str(caught.value)


def test_an_invalid_file_on_redis_reports_its_error_not_a_missing_store() -> None:
    text = PLAIN.replace("name: plain", "name: plain\nstore: redis").replace(
        "steps:\n", "steps:\n  - fault: {kind: store_wipe, target: store}\n") + "checks:\n  - loadd: {}\n"
    with pytest.raises(ScenarioInvalid) as caught:
        load(text)
    assert "'loadd' is not a check" in str(caught.value)
    assert "no process named 'store'" not in str(caught.value)
