"""The real ModelExpress server as a subject, without the binary: who plays which role
(``--subject``), its store, its timers, its command line, its capability, and how its log
becomes the events the checks read (``mx_serverd.LogTranslator``, fed recorded lines).

The binary itself is exercised in ``tests/integration/test_mx_server_binary.py``.
"""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.errors import ScenarioInvalid
from harness.scenario import ServerProcess, capabilities, parse_scenario
from harness.scenario.subjects import with_subjects
from harness.subjects import mx_server
from harness.subjects.mx_serverd import LogTranslator, parse_line, server_env

SCENARIO = textwrap.dedent("""
    name: tiny
    processes:
      server: {role: server, options: {heartbeat_timeout: 2500ms, reaper_interval: 250ms, store_timeout: 1s}}
      source-1: {role: source}
      reader-1: {role: reader}
    steps:
      - start: server
""")


def scenario(extra: str = "") -> Any:
    return parse_scenario(SCENARIO + extra, "tiny.yaml")


def test_parse_subjects() -> None:
    assert mx_server.parse_subjects("modelexpress") == {"client": "modelexpress"}
    assert mx_server.parse_subjects("server=modelexpress, reader=mxref") == {"server": "modelexpress", "reader": "mxref"}
    for bad, rule in [("grpc", "expected one of"), ("server=grpc", "is not a subject"), ("svr=modelexpress", "is not role=subject"),
                      ("server=mxref,server=modelexpress", "named twice")]:
        with pytest.raises(ValueError, match=rule):
            mx_server.parse_subjects(bad)


def test_server_subject_brings_a_redis_store() -> None:
    played = with_subjects(scenario(), {"server": "modelexpress", "reader": "modelexpress"})
    server = played.processes["server"]
    assert isinstance(server, ServerProcess)
    assert server.subject == "modelexpress" and server.store == "store"
    assert played.processes["store"].role == "redis"
    assert getattr(played.processes["reader-1"], "subject", None) == "modelexpress"
    assert getattr(played.processes["source-1"], "subject", None) is None and played.subject == "mxref"
    unchanged = with_subjects(scenario(), {"client": "modelexpress"})
    assert unchanged.subject == "modelexpress" and "store" not in unchanged.processes


def test_a_modelexpress_server_without_store_is_invalid() -> None:
    text = SCENARIO.replace("server: {role: server,", "server: {role: server, subject: modelexpress,")
    with pytest.raises(ScenarioInvalid, match="keeps its records only in Redis"):
        parse_scenario(text, "tiny.yaml")
    parse_scenario(text + "store: redis\n", "tiny.yaml")  # with a store: valid


def test_timers_round_up_and_say_so() -> None:
    server = scenario().processes["server"]
    assert isinstance(server, ServerProcess)
    timers = mx_server.server_timers(server)
    assert (timers.heartbeat_timeout_s, timers.reaper_interval_s, timers.gc_timeout_s) == (3, 1, None)
    assert timers.env() == {"MX_HEARTBEAT_TIMEOUT_SECS": "3", "MX_REAPER_SCAN_INTERVAL_SECS": "1"}
    assert timers.rounded == ("heartbeat_timeout 2.5s -> 3s", "reaper_interval 250ms -> 1s")
    assert timers.not_staged == ("store_timeout 1s (ModelExpress has no such setting)",)
    whole = server.model_copy(update={"options": server.options.model_copy(update={"heartbeat_timeout": 5.0})})
    assert mx_server.server_timers(whole).rounded == ("reaper_interval 250ms -> 1s",)


def fake_binary(tmp_path: Path) -> Path:
    binary = tmp_path / "modelexpress-server"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_argv_and_capability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    played = with_subjects(scenario(), {"server": "modelexpress"})
    server = played.processes["server"]
    assert isinstance(server, ServerProcess)
    needs = capabilities.scenario_requirements(played)
    assert needs["modelexpress-server"] == ["server (subject modelexpress)"]
    assert "modelexpress-env" not in needs
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv(mx_server.ENV_BINARY, raising=False)
    assert not capabilities.have("modelexpress-server")
    with pytest.raises(ValueError, match="is not built"):
        mx_server.serverd_argv("server", server, events_path=tmp_path / "e", proc_dir=tmp_path, host="127.0.0.1",
                               port=0, store_address="127.0.0.1:6379")
    monkeypatch.setenv(mx_server.ENV_BINARY, str(fake_binary(tmp_path)))
    assert capabilities.have("modelexpress-server")
    with pytest.raises(ValueError, match="only in Redis"):
        mx_server.serverd_argv("server", server, events_path=tmp_path / "e", proc_dir=tmp_path, host="127.0.0.1",
                               port=0, store_address=None)
    argv = mx_server.serverd_argv("server", server, events_path=tmp_path / "e", proc_dir=tmp_path, host="127.0.0.1",
                                  port=4242, store_address="127.0.0.1:6379")
    assert argv[1:3] == ["-m", "harness.subjects.mx_serverd"]
    joined = " ".join(argv)
    for part in ("--port 4242", "--redis-url redis://127.0.0.1:6379/0", "--heartbeat-timeout-s 3",
                 "--reaper-interval-s 1", "--rounded reaper_interval 250ms -> 1s"):
        assert part in joined
    assert mx_server.server_versions(played)["modelexpress"]["version"] == mx_server.VERSION


def test_server_env() -> None:
    env = server_env({"PATH": os.environ.get("PATH", "")}, "redis://127.0.0.1:7/0", {"gc_timeout_s": 30})
    assert env["MX_METADATA_BACKEND"] == "redis" and env["REDIS_URL"] == "redis://127.0.0.1:7/0"
    assert env["MX_GC_TIMEOUT_SECS"] == "30" and "p2p=debug" in env["RUST_LOG"]


# ---------------------------------------------------------------------------- the log

# lines as modelexpress-server 0.7.0 writes them (tracing's text format; ANSI colours included)
PUBLISH = ("2026-12-02T17:50:00.100000Z  INFO modelexpress_server::p2p::service: PublishMetadata: model='m/a' "
           "source_id=5a5f555570065064 worker_id=w1 worker_rank=0 tensors=8")
READY = ("2026-12-02T17:50:00.200000Z DEBUG modelexpress_server::p2p::backend::redis: Updated status for source "
         "'5a5f555570065064' worker 'w1' rank 0 -> 2")
STALE = READY.replace("-> 2", "-> 3")
REAPED = "2026-12-02T17:51:00.000000Z  INFO modelexpress_server::p2p::reaper: Reaper: marked 0 stale, garbage-collected 1"
SCANNED = "2026-12-02T17:51:01.000000Z DEBUG modelexpress_server::p2p::reaper: Reaper: no action needed (2 workers scanned)"
KEY = ("5a5f555570065064", "w1")


class FakeProbe:
    def __init__(self) -> None:
        self.gone: set[tuple[str, str]] = set()
        self.stored: dict[tuple[str, str], str] = {}  # what the store holds; unset: INITIALIZING

    def published_status(self, sid: str, wid: str, rank: int) -> str | None:
        return None if (sid, wid) in self.gone else "INITIALIZING"

    def stored_status(self, sid: str, wid: str, rank: int) -> str | None:
        return None if (sid, wid) in self.gone else self.stored.get((sid, wid), "INITIALIZING")

    def exists(self, sid: str, wid: str) -> bool | None:
        return (sid, wid) not in self.gone


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.now = 100.0

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def clock(self) -> float:
        return self.now


def translator(rec: Recorder, probe: FakeProbe | None = None) -> LogTranslator:
    return LogTranslator(rec.emit, heartbeat_timeout_s=3.0, probe=probe, clock=rec.clock)  # type: ignore[arg-type]


def test_parse_line_strips_colours() -> None:
    line = parse_line("\x1b[2m2026-12-02T17:50:00Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mmodelexpress_server::server\x1b[0m: "
                      "Starting gRPC server on: 127.0.0.1:1\n")
    assert line is not None and line.level == "INFO" and line.message == "Starting gRPC server on: 127.0.0.1:1"
    assert parse_line("thread 'main' panicked at src/main.rs:1") is None
    spanned = parse_line("2026-12-02T18:10:05Z DEBUG Connection{peer=Server}: h2::codec::framed_read: received frame=Reset {}")
    assert spanned is not None and spanned.target == "h2::codec::framed_read" and spanned.message == "received frame=Reset {}"


def test_publish_then_ready_then_heartbeats() -> None:
    rec = Recorder()
    tr = translator(rec, FakeProbe())
    for line in (PUBLISH, READY, READY, READY):
        tr.feed(line)
        rec.now += 0.5
    assert rec.events == [
        ("source_published", {"mx_source_id": "5a5f555570065064", "worker_id": "w1", "worker_rank": 0, "status": "INITIALIZING"}),
        ("source_status", {"mx_source_id": "5a5f555570065064", "worker_id": "w1", "status": "READY",
                           "previous": "INITIALIZING", "by": "rpc"}),
    ]


def test_stale_after_silence_is_the_reapers_and_gc_deletes() -> None:
    rec, probe = Recorder(), FakeProbe()
    tr = translator(rec, probe)
    tr.feed(PUBLISH)
    tr.feed(READY)
    rec.now += 3.5  # longer than the heartbeat timeout without an update
    tr.feed(STALE)
    probe.stored[KEY] = "STALE"
    assert rec.events[-1][1]["by"] == "reaper"
    tr.feed(REAPED)  # nothing gone yet: no deletion
    assert rec.events[-1][0] == "source_status"
    probe.gone.add(("5a5f555570065064", "w1"))
    tr.feed(REAPED)
    assert rec.events[-1] == ("source_deleted", {"mx_source_id": "5a5f555570065064", "worker_id": "w1", "by": "reaper"})


def test_a_change_made_through_another_server_is_read_back_after_each_reaper_pass() -> None:
    """Two servers over one store: this one's reaper marked a just-published record STALE before
    its first heartbeat, which went through the other server (READY, never in this log). When this
    reaper later marks it STALE again, that is a change, not a repeat."""
    rec, probe = Recorder(), FakeProbe()
    tr = translator(rec, probe)
    tr.feed(STALE)  # a worker this log never saw published
    assert rec.events[-1][1]["status"] == "STALE"
    probe.stored[KEY] = "READY"  # its heartbeats, through the other server
    tr.feed(SCANNED)
    assert len(rec.events) == 1  # read back silently: this server did not change it
    rec.now += 3.5
    tr.feed(STALE)
    assert rec.events[-1] == ("source_status", {"mx_source_id": KEY[0], "worker_id": "w1", "status": "STALE",
                                                "previous": "READY", "by": "reaper"})


def test_a_store_read_ahead_of_the_log_loses_no_change() -> None:
    """The store may already hold what a line not yet read says: the READY still counts once."""
    rec, probe = Recorder(), FakeProbe()
    tr = translator(rec, probe)
    tr.feed(PUBLISH)
    probe.stored[KEY] = "READY"  # this server's own update, its log line still to come
    tr.feed(SCANNED)
    tr.feed(READY)
    tr.feed(READY)
    assert [e for e, f in rec.events if e == "source_status"] == ["source_status"]
    assert rec.events[-1][1]["previous"] == "INITIALIZING"


def test_stale_from_a_live_worker_is_its_own() -> None:
    rec = Recorder()
    tr = translator(rec)
    tr.feed(PUBLISH)
    tr.feed(READY)
    rec.now += 0.5
    tr.feed(STALE)
    assert rec.events[-1][1] == {"mx_source_id": "5a5f555570065064", "worker_id": "w1", "status": "STALE",
                                 "previous": "READY", "by": "rpc"}
    assert rec.events[0] == ("source_published", {"mx_source_id": "5a5f555570065064", "worker_id": "w1", "worker_rank": 0})


def test_launch_runs_the_role_process_on_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``launch.process_argv``: a ModelExpress server runs ``mx_serverd`` with its store's URL, the
    host's address, and after a restart its previous port (as mxref's server keeps its address)."""
    from harness.engine import launch

    monkeypatch.setenv(mx_server.ENV_BINARY, str(fake_binary(tmp_path)))
    played = with_subjects(scenario(), {"server": "modelexpress"})
    where = launch.Placement(run_dir=tmp_path, events_path=tmp_path / "procs" / "server.events.jsonl",
                             log_path=tmp_path / "procs" / "server.log", host_address="10.0.0.2", in_netns=True,
                             incarnation=2, store_address="10.0.0.2:7777", last_grpc_port=5151)
    argv = launch.process_argv(played, "server", where)
    assert argv[1:3] == ["-m", "harness.subjects.mx_serverd"]
    given = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert given["--redis-url"] == "redis://10.0.0.2:7777/0"
    assert (given["--host"], given["--port"]) == ("10.0.0.2", "5151")
    mxref_played = launch.process_argv(scenario(), "server", where)
    assert "harness.subjects.mx_serverd" not in mxref_played
