"""The mxref command-line contract (``harness.engine.launch``): what each role is started with, on
local and netns hosts, for a restarted server and a reader's later incarnations; what every
child carries in its environment; and that the checkpoint comes from a cache, not the run folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.engine import checkpoint, launch
from harness.machine import procscan
from harness.record.timeline import Timeline
from harness.scenario import Scenario, parse_scenario

NETNS = """\
name: net
hosts: {ctl: netns, a: {kind: netns}, r: netns}
processes:
  server: {role: server, host: ctl}
  source-1: {role: source, host: a}
  source-2: {role: source, host: a, options: {advertise_host: 10.9.9.9}}
  reader-1: {role: reader, host: r}
steps:
  - start: [server, source-1, source-2, reader-1]
"""

LOCAL = """\
name: local
seed: 7
env: {SHARED: "{run_dir}/x"}
model: {tensors: 3, tensor_mib: 0.5}
processes:
  server: {role: server}
  source-1: {role: source, env: {MINE: "{proc_dir}"}}
  reader-1: {role: reader, options: {transfer_timeout: 2s}}
  tool: {role: command, argv: ["{python}", "-c", "print('{seed}')"]}
steps:
  - start: [server, source-1, reader-1, tool]
"""


def place(tmp_path: Path, name: str, *, address: str = "127.0.0.1", netns: bool = False, **extra: object) -> launch.Placement:
    return launch.Placement(
        run_dir=tmp_path,
        events_path=tmp_path / "procs" / f"{name}.events.jsonl",
        log_path=tmp_path / "procs" / f"{name}.log",
        host_address=address,
        in_netns=netns,
        incarnation=1,
        **extra,  # type: ignore[arg-type]
    )


def flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def load(text: str) -> Scenario:
    return parse_scenario(textwrap.dedent(text), "x.yaml")


def test_netns_processes_bind_and_advertise_their_namespace_address(tmp_path: Path) -> None:
    sc = load(NETNS)
    server = flags(launch.process_argv(sc, "server", place(tmp_path, "server", address="10.213.7.10", netns=True)))
    assert server["--host"] == "10.213.7.10" and server["--metrics-host"] == "10.213.7.10"
    source = flags(launch.process_argv(sc, "source-1", place(tmp_path, "source-1", address="10.213.7.11", netns=True,
                                                            server_address="10.213.7.10:4242")))
    assert source["--server"] == "10.213.7.10:4242"
    assert source["--advertise-host"] == "10.213.7.11" == source["--metrics-host"]
    assert source["--transport"] == "ucx-tcp-any"
    pinned = launch.process_argv(sc, "source-2", place(tmp_path, "source-2", address="10.213.7.11", netns=True, server_address="s:1"))
    assert pinned.count("--advertise-host") == 1 and flags(pinned)["--advertise-host"] == "10.9.9.9"
    reader = flags(launch.process_argv(sc, "reader-1", place(tmp_path, "reader-1", address="10.213.7.12", netns=True, server_address="s:1")))
    assert reader["--advertise-host"] == "10.213.7.12" and reader["--transport"] == "ucx-tcp-any"


def test_local_processes_bind_loopback_and_get_the_model_and_their_files(tmp_path: Path) -> None:
    sc = load(LOCAL)
    server = launch.process_argv(sc, "server", place(tmp_path, "server"))
    assert server[server.index("--name") - 1] == "server" and flags(server)["--name"] == "server"
    assert "--host" not in server and "--metrics-host" not in server
    assert flags(server)["--events"] == str(tmp_path / "procs" / "server.events.jsonl")
    assert flags(server)["--metrics-port"] == "0"
    source = flags(launch.process_argv(sc, "source-1", place(tmp_path, "source-1", server_address="127.0.0.1:5000")))
    assert source["--tensors"] == "3" and source["--tensor-mib"] == "0.5" and source["--seed"] == "7"
    assert "--advertise-host" not in source


def test_a_restarted_server_binds_its_previous_port(tmp_path: Path) -> None:
    sc = load(LOCAL)
    first = flags(launch.process_argv(sc, "server", place(tmp_path, "server")))
    again = flags(launch.process_argv(sc, "server", place(tmp_path, "server", last_grpc_port=40123)))
    assert first.get("--port") in (None, "0") and again["--port"] == "40123"


def test_a_reader_gets_the_prepared_checkpoint_its_result_file_and_the_run_seed(tmp_path: Path) -> None:
    sc = load(LOCAL)
    prepared = tmp_path / "cache" / "abc.safetensors"
    where = launch.Placement(
        run_dir=tmp_path, events_path=tmp_path / "r.events", log_path=tmp_path / "procs" / "reader-1.log",
        host_address="127.0.0.1", in_netns=False, incarnation=3, server_address="127.0.0.1:1", checkpoint=prepared,
    )
    reader = flags(launch.process_argv(sc, "reader-1", where))
    assert reader["--checkpoint"] == str(prepared)
    assert reader["--result"] == str(tmp_path / "procs" / "reader-1.result-3.json")
    assert reader["--selector-seed"] == "7" and reader["--transfer-timeout"] == "2"


def test_a_reader_that_names_its_checkpoint_keeps_it(tmp_path: Path) -> None:
    sc = load(LOCAL.replace("options: {transfer_timeout: 2s}", "options: {checkpoint: mine.safetensors}"))
    reader = flags(launch.process_argv(sc, "reader-1", place(tmp_path, "reader-1", server_address="s:1", checkpoint=tmp_path / "other")))
    assert reader["--checkpoint"] == str((sc.directory / "mine.safetensors").resolve())


def test_a_source_or_reader_without_its_server_address_is_a_harness_bug(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs its server's address"):
        launch.process_argv(load(LOCAL), "reader-1", place(tmp_path, "reader-1"))


def test_commands_and_env_have_their_placeholders_filled(tmp_path: Path) -> None:
    sc = load(LOCAL)
    argv = launch.process_argv(sc, "tool", place(tmp_path, "tool"))
    assert argv[2] == "print('7')" and not argv[0].startswith("{")
    who = launch.HarnessIdentity("run-1", 4242, 99)
    base = launch.base_env({"PATH": "/bin", procscan.ENV_RUN_ID: "stale"}, who, "source-1")
    assert base[procscan.ENV_RUN_ID] == "run-1" and base[procscan.ENV_PROC] == "source-1"
    assert base[procscan.ENV_HARNESS_PID] == "4242" and base[procscan.ENV_HARNESS_START] == "99"
    env = launch.process_env(sc, "source-1", base, place(tmp_path, "source-1"))
    assert env["SHARED"] == f"{tmp_path}/x" and env["MINE"] == str(tmp_path / "procs") and env["PATH"] == "/bin"


# ---------------------------------------------------------------------------- the checkpoint cache


class _WritingHost:
    """A host whose ``exec`` plays ``mxref prepare``: writes the file named after --checkpoint."""

    name = "fake"
    address = "127.0.0.1"

    def __init__(self) -> None:
        self.calls = 0

    def exec(self, argv: list[str], *, env: object, cwd: Path, timeout: float) -> object:
        from harness.hosts.base import ExecResult

        self.calls += 1
        Path(argv[argv.index("--checkpoint") + 1]).write_bytes(b"weights")
        return ExecResult(0, "", "", 0.01)


def test_the_checkpoint_is_prepared_once_into_the_cache_and_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path / "cache"))
    sc = load(LOCAL)
    host = _WritingHost()
    paths = []
    for run in ("a", "b"):
        run_dir = tmp_path / run
        (run_dir / "procs").mkdir(parents=True)
        timeline = Timeline()
        paths.append(checkpoint.prepare(sc, host=host, run_dir=run_dir, env={}, timeline=timeline))  # type: ignore[arg-type]
        assert timeline.snapshot().last(actor="harness", f="prepare", type="ok") is not None
    assert paths[0] == paths[1] and paths[0] is not None and paths[0].read_bytes() == b"weights"
    assert host.calls == 1, "the second run reuses the cached checkpoint"
    assert tmp_path / "cache" in paths[0].parents
    other = load(LOCAL.replace("seed: 7", "seed: 8"))
    assert checkpoint.cache_key(other.model.flags(other.seed, other.directory)) != checkpoint.cache_key(sc.model.flags(sc.seed, sc.directory))


def test_a_checkpoint_another_launcher_writes_is_cached_under_its_own_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's fake launcher writes other bytes: a real run with the same model must not find them."""
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path / "cache"))
    real = load(LOCAL)
    fake = load(LOCAL.replace("seed: 7", "seed: 7\nlauncher: ['{python}', fake.py]"))
    assert fake.launcher != real.launcher and fake.model.flags(fake.seed, fake.directory) == real.model.flags(real.seed, real.directory)
    paths = []
    for sc in (fake, real):
        run_dir = tmp_path / sc.launcher[-1]
        (run_dir / "procs").mkdir(parents=True)
        paths.append(checkpoint.prepare(sc, host=_WritingHost(), run_dir=run_dir, env={}, timeline=Timeline()))  # type: ignore[arg-type]
    assert paths[0] != paths[1]
    flags = real.model.flags(real.seed, real.directory)
    assert checkpoint.cache_key(flags, ("{python}", "-m", "mxref")) == checkpoint.cache_key(flags)  # mxref's keys did not move


def test_no_checkpoint_is_prepared_when_readers_name_theirs_or_there_is_no_reader(tmp_path: Path) -> None:
    named = load(LOCAL.replace("options: {transfer_timeout: 2s}", "options: {checkpoint: mine.safetensors}"))
    assert checkpoint.needed(named) == checkpoint.Needed()
    no_reader = load(NETNS.replace("  reader-1: {role: reader, host: r}\n", "").replace(", reader-1]", "]"))
    assert checkpoint.needed(no_reader) == checkpoint.Needed()
    assert checkpoint.needed(load(LOCAL)).reader == "reader-1"



def test_the_cache_evicts_the_least_recently_used_checkpoints_over_its_budget(tmp_path: Path) -> None:
    import os
    import time

    now = time.time()
    files = {}
    for name, age_h in (("old", 30), ("older", 40), ("recent", 0.5), ("kept", 50)):
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(b"x" * 100)
        os.utime(path, (now - age_h * 3600, now - age_h * 3600))
        files[name] = path
    removed = checkpoint.evict(tmp_path, files["kept"], budget=250, now=now)
    # 400 bytes over a 250 budget: the oldest not kept goes first ("older"), then "old";
    # "recent" was used within the hour and "kept" is the one just prepared
    assert removed == ["older.safetensors", "old.safetensors"]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["kept.safetensors", "recent.safetensors"]
    assert checkpoint.evict(tmp_path, files["kept"], budget=250, now=now) == []  # within budget (or too recent)


def test_a_bad_cache_budget_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.errors import HarnessError

    monkeypatch.setenv("MXCHAOS_CACHE_MAX_BYTES", "lots")
    with pytest.raises(HarnessError, match="MXCHAOS_CACHE_MAX_BYTES: 'lots' is not a positive number of bytes"):
        checkpoint.cache_max_bytes()
    monkeypatch.setenv("MXCHAOS_CACHE_MAX_BYTES", "1000")
    assert checkpoint.cache_max_bytes() == 1000
