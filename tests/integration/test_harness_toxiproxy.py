"""The runner with a real toxiproxy server (``.venv/bin/toxiproxy-server``) and the fake mxref
(tests/fixtures/fakeproc.py): the server starts with the run, the proxy is created once its
upstream listens and is what the source is given, a latency toxic is really on the proxy
while injected and gone after its heal, and nothing is left: no toxiproxy process and no
proxy after the run, and none after ``mxchaos cleanup`` of a SIGKILLed harness. Against a
standalone server: the fault kinds heal idempotently, and ``sweep`` deletes only its run's proxies."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.commands.cleanup import sweep
from harness.engine.runner import Runner
from harness.faults import REGISTRY
from harness.machine import procscan
from harness.machine.ports import lease_port
from harness.record.timeline import Entry, History
from harness.reports.report import write_run_folder
from harness.scenario import load_scenario
from harness.scenario.capabilities import toxiproxy_server
from harness.toxiproxy import ToxiproxyAPI, ToxiproxyError

pytestmark = [
    pytest.mark.integration,
    pytest.mark.toxiproxy,
    pytest.mark.timeout(120),
    pytest.mark.skipif(toxiproxy_server() is None, reason="no toxiproxy-server (.ci/bootstrap builds it)"),
]

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fixtures" / "fakeproc.py"

SCENARIO = """\
name: {name}
launcher: ["{{python}}", "{fake}"]
budgets: {{step: 10s, run: 60s, stop_grace: 2s, progress: 50s}}
scrape: {{interval: 200ms}}
proxies:
  mds: {{upstream: server}}
processes:
  server: {{role: server}}
  source-1: {{role: source, server_via: mds}}
steps:
  - start: server
  - start: source-1
  - await: {{process: source-1, event: status_change, where: {{status: READY}}}}
  - fault: {{kind: toxic, proxy: mds, name: slow, type: latency, attributes: {{latency: 300ms, jitter: 10}}}}
  - sleep: {sleep}
  - heal: slow
checks:
  - nothing_leaked: {{}}
"""


def scenario_file(tmp_path: Path, name: str, sleep: str = "500ms") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SCENARIO.format(name=name, fake=FAKE, sleep=sleep))
    return path


def api_answers(url: str) -> bool:
    try:
        ToxiproxyAPI(url, timeout=1.0).version()
    except ToxiproxyError:
        return False
    return True


def round_trip(address: str) -> float:
    """Seconds until the fake server's answer (it accepts and closes) arrives through ``address``."""
    host, _, port = address.rpartition(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.settimeout(5)
        conn.recv(1)  # the greeting of the fake server (it accepts, greets and closes)
    return time.monotonic() - started


def test_a_latency_toxic_is_on_the_proxy_until_healed_and_nothing_is_left(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def observe(entry: Entry) -> None:  # runs in the thread that records the entry
        if entry.actor == "harness" and entry.f == "proxy" and entry.type == "ok":
            seen["proxy"] = entry.value
        if entry.actor == "nemesis" and entry.type == "ok" and entry.f in ("inject", "heal"):
            api = ToxiproxyAPI(str(seen["api"]))
            seen[f"{entry.f}_toxics"] = api.toxics(str(seen["proxy"]["name"]))
            seen[f"{entry.f}_round_trip"] = round_trip(str(seen["proxy"]["listen"]))
        if entry.actor == "harness" and entry.f == "toxiproxy" and entry.type == "ok":
            seen["api"] = entry.get("api")

    sc = load_scenario(scenario_file(tmp_path, "latency"))
    result = Runner(sc, out_dir=tmp_path / "runs", install_signal_handlers=False, observers=[observe]).run()
    folder = write_run_folder(result)
    assert result.verdict == "pass", (result.reason, [(c.name, c.summary) for c in result.checks])

    # the proxy was made after the server listened, named after the run, and given to the source
    history = History.from_jsonl(folder / "timeline.jsonl")
    server_port = history.first(actor="server", f="listening", where={"what": "grpc"}).get("port")  # type: ignore[union-attr]
    proxy = seen["proxy"]
    assert proxy["name"] == f"{result.run_id}.mds" and proxy["upstream"] == f"127.0.0.1:{server_port}"
    argv = history.first(actor="source-1", f="start", type="ok").get("argv")  # type: ignore[union-attr]
    assert argv[argv.index("--server") + 1] == proxy["listen"]
    created = history.first(actor="harness", f="proxy", type="ok")
    assert created is not None and created.t < history.first(actor="source-1", f="start").t  # type: ignore[union-attr]

    # while injected the toxic is there and delays the answer; after the heal it is gone
    (toxic,) = seen["inject_toxics"]
    assert (toxic["name"], toxic["type"], toxic["stream"]) == ("slow", "latency", "downstream")
    assert toxic["attributes"] == {"latency": 300, "jitter": 10}
    assert seen["inject_round_trip"] >= 0.25
    assert seen["heal_toxics"] == []
    assert seen["heal_round_trip"] < 0.25
    # its witness: the greeting that went downstream through the proxy while the toxic held
    (window,) = history.fault_windows()
    assert window.witness is not None and window.witness.effect == "seen" and window.witness.figures["closed_bytes"] >= 1

    # teardown removed the proxy and stopped the server: no process, no API, no listener
    stop = history.last(actor="harness", f="toxiproxy_stop")
    assert stop is not None and stop.get("removed") == [proxy["name"]] and stop.get("rc") is not None
    assert [p for p in procscan.scan() if p.run_id == result.run_id] == []
    assert not api_answers(str(seen["api"]))
    leak = history.last(actor="harness", f="leak_scan")
    api_port = int(str(seen["api"]).rpartition(":")[2])
    listen_port = int(str(proxy["listen"]).rpartition(":")[2])
    assert {api_port, listen_port} <= set(leak.get("checked_ports"))  # type: ignore[union-attr]
    assert (folder / "procs" / "toxiproxy.log").stat().st_size > 0
    assert json.loads((folder / "run.json").read_text())["toxiproxy"]["api"] == seen["api"]


def test_cleanup_after_sigkill_of_the_harness_leaves_no_toxiproxy(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, "crashed", sleep="60s")
    out = tmp_path / "runs"
    harness = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "-v", str(path), "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    run_id = None
    try:
        assert harness.stdout is not None
        deadline = time.monotonic() + 30
        for line in harness.stdout:
            if "step 5: sleep" in line or time.monotonic() > deadline:
                break
        (run_json,) = [p for p in out.glob("crashed/*/run.json") if not p.parent.is_symlink()]
        info = json.loads(run_json.read_text())
        run_id, url = str(info["run_id"]), str(info["toxiproxy"]["api"])
        harness.kill()  # SIGKILL: no finally, no teardown
        harness.wait(timeout=30)
        time.sleep(0.3)
        orphans = [p for p in procscan.scan() if p.run_id == run_id]
        assert {p.proc for p in orphans} == {"server", "source-1", "toxiproxy"}, orphans
        assert f"{run_id}.mds" in ToxiproxyAPI(url).proxies()  # the toxic is still on it, too
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "cleanup", "--run-id", run_id],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert [p for p in procscan.scan() if p.run_id == run_id] == []
        assert not api_answers(url)
        assert (run_json.parent / "CRASHED").is_file()
    finally:
        if harness.poll() is None:
            harness.kill()
        harness.wait(timeout=30)
        if harness.stdout is not None:
            harness.stdout.close()
        if run_id:
            sweep(run_id)


@pytest.fixture
def standalone() -> Iterator[ToxiproxyAPI]:
    """A toxiproxy server of no run (as a crashed run's would be, still answering)."""
    with lease_port() as lease:
        server = subprocess.Popen(
            [str(toxiproxy_server()), "-host", "127.0.0.1", "-port", str(lease.port), "-proxy-metrics"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            api = ToxiproxyAPI(f"http://127.0.0.1:{lease.port}")
            deadline = time.monotonic() + 10
            while not api_answers(api.url):
                assert time.monotonic() < deadline and server.poll() is None, "toxiproxy-server did not start"
                time.sleep(0.05)
            yield api
        finally:
            server.kill()
            server.wait(timeout=10)


@dataclass(frozen=True)
class View:
    name: str
    proxy: str
    api: str
    listen: str
    upstream: str


class Ctx:
    """Just enough of ``FaultContext`` for the proxy faults."""

    run_id = "run-x"

    def __init__(self, view: View) -> None:
        self.view = view

    def proxy(self, name: str) -> View:
        assert name == self.view.name
        return self.view


def test_toxic_and_proxy_down_heal_idempotently(standalone: ToxiproxyAPI) -> None:
    created = standalone.create_proxy("run-x.mds", "127.0.0.1:1")
    ctx = Ctx(View("mds", "run-x.mds", standalone.url, str(created["listen"]), "127.0.0.1:1"))
    spec = REGISTRY["toxic"].Spec.model_validate(
        {"kind": "toxic", "proxy": "mds", "type": "timeout", "stream": "upstream", "toxicity": 0.5, "attributes": {"timeout": 0}}
    )
    toxic = REGISTRY["toxic"](spec, "hold")
    injected = toxic.inject(ctx)  # type: ignore[arg-type]
    value = injected.record
    assert value["attributes"] == {"timeout": 0} and value["toxiproxy_name"] == "run-x.mds"
    (on,) = standalone.toxics("run-x.mds")
    assert (on["name"], on["type"], on["stream"], on["toxicity"]) == ("hold", "timeout", "upstream", 0.5)
    # no client used the proxy while it held: its witness is no effect (a toxic aimed at nothing)
    none = {"effect": "none", "why": "no connection through proxy mds while it held",
            "figures": {"stream": "upstream", "closed_bytes": 0, "open_at_inject": 0, "open_at_heal": 0}}
    assert toxic.heal(ctx, injected.token) == {"proxy": "mds", "toxic": "hold", "removed": True,  # type: ignore[arg-type]
                                               "witness": none}
    assert toxic.heal(ctx, injected.token) == {"proxy": "mds", "toxic": "hold", "removed": False,  # type: ignore[arg-type]
                                               "witness": none}
    assert standalone.toxics("run-x.mds") == []

    down = REGISTRY["proxy_down"](REGISTRY["proxy_down"].Spec.model_validate({"kind": "proxy_down", "proxy": "mds"}), "down")
    token = down.inject(ctx).token  # type: ignore[arg-type]
    port = int(str(created["listen"]).rpartition(":")[2])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    effects = []
    for _ in range(2):
        healed = down.heal(ctx, token)  # type: ignore[arg-type]
        assert healed is not None
        effects.append(healed.pop("witness"))
        assert healed == {"proxy": "mds", "enabled": True, "listen": created["listen"]}
    socket.create_connection(("127.0.0.1", port), timeout=2).close()  # listening again, same port
    standalone.delete_proxy("run-x.mds")
    assert (down.heal(ctx, token) or {})["gone"] is True  # type: ignore[arg-type]
    if token.counter is not None:  # root and iptables: the refused connect was counted, and its chain is gone
        assert effects[0]["effect"] == "seen" and effects[0]["figures"]["refused_syns"] >= 1
        assert effects[1]["effect"] == "unwitnessed"  # healed twice: the count was read once


def test_sweep_deletes_only_the_proxies_of_its_run(
    standalone: ToxiproxyAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    for name in ("run-a.mds", "run-a.other", "run-ab.mds", "run-b.mds"):
        standalone.create_proxy(name, "127.0.0.1:1")
    ledger = tmp_path / "state" / "runs"
    ledger.mkdir(parents=True)
    (ledger / "run-a.json").write_text(json.dumps({"run_id": "run-a", "toxiproxy": {"api": standalone.url}}))
    url = standalone.url
    removed = REGISTRY["toxic"].sweep("run-a")
    assert sorted(removed) == [f"toxiproxy proxy run-a.mds at {url}", f"toxiproxy proxy run-a.other at {url}"]
    assert sorted(standalone.proxies()) == ["run-ab.mds", "run-b.mds"]
    assert REGISTRY["proxy_down"].sweep("run-a") == []  # idempotent


def test_a_fault_on_a_proxy_whose_server_never_started_fails_its_step(tmp_path: Path) -> None:
    path = tmp_path / "early.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: early
        launcher: ["{{python}}", "{FAKE}"]
        budgets: {{step: 3s, run: 30s, stop_grace: 2s}}
        proxies:
          mds: {{upstream: server}}
        processes:
          server: {{role: server}}
        steps:
          - fault: {{kind: proxy_down, proxy: mds, name: down}}
        checks:
          - nothing_leaked: {{}}
        """))
    result = Runner(load_scenario(path), out_dir=tmp_path / "runs", install_signal_handlers=False).run()
    assert result.verdict == "fail" and result.failed_step == "1"
    assert "server is not running, so it has no grpc port" in result.reason
    assert [p for p in procscan.scan() if p.run_id == result.run_id] == []
    assert result.history.last(actor="harness", f="toxiproxy_stop") is not None
