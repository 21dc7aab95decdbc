"""``netns`` hosts for real (root): a run's namespaces and bridge come up and go away, a
process in one namespace talks TCP to another and to the harness, each network fault really
stops the traffic and its heal really restores it, a scenario on netns hosts runs end to end
(the fake mxref), and ``mxchaos cleanup`` after a SIGKILLed harness leaves no namespace, veth,
bridge, chain or qdisc of the run. Skipped without root, ``ip``, ``iptables`` or ``tc``."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.commands.cleanup import sweep
from harness.engine.nemesis import HostView
from harness.engine.runner import Runner
from harness.faults import make_fault
from harness.faults.netns import LinkDownSpec, PartitionSpec, RateSpec, RejectSpec
from harness.hosts import netns
from harness.machine import procscan
from harness.record.timeline import History
from harness.record.witness import Witness
from harness.reports.report import write_run_folder
from harness.scenario import load_scenario

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "iptables", "tc")), reason="needs ip, iptables and tc"),
]

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fakeproc.py"
REPO = Path(__file__).resolve().parents[2]

# A TCP server that answers every connection with one line, and streams bytes on demand.
SERVER = """
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
def serve(c):
    try:
        want = int(c.recv(32).strip() or 0)
        c.sendall(b"x" * want if want else b"hello\\n")
    except OSError:
        pass
    finally:
        c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# Connect, ask for N bytes, read them; prints ok <seconds> | timeout | refused | reset | error.
CLIENT = """
import socket, sys, time
host, port, want, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
t = time.monotonic()
try:
    c = socket.create_connection((host, port), timeout=limit)
    c.sendall(str(want).encode() + b"\\n"); got = 0
    while got < max(want, 1):
        d = c.recv(1 << 16)
        if not d: break
        got += len(d)
    print("ok", round(time.monotonic() - t, 3), got)
except socket.timeout: print("timeout")
except ConnectionRefusedError: print("refused")
except ConnectionResetError: print("reset")
except OSError as e: print("error", e)
"""


class Ctx:
    """The part of ``FaultContext`` the network faults use: hosts by name."""

    def __init__(self, run_id: str, net: netns.Network) -> None:
        self.run_id, self._net = run_id, net

    def locate(self, target: object) -> HostView:
        h = self._net.hosts[str(target)]
        return HostView(h.name, h.kind, h.address, h.fault_place(), h.link, h.inner_link)


@pytest.fixture
def net() -> Iterator[tuple[netns.Network, Ctx, subprocess.Popen[bytes]]]:
    run_id = f"pytest-netns-{os.getpid()}-{time.monotonic_ns()}"
    network = netns.Network.create(run_id, ["a", "b"])
    a = network.hosts["a"]
    server = subprocess.Popen([*a._wrap([sys.executable, "-c", SERVER, a.address, "7000"])], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not a.port_open(7000) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield network, Ctx(run_id, network), server
    finally:
        server.kill()
        server.wait(10)
        result = network.close()
        assert result["leftovers"] == []
        assert netns.leftovers(run_id) == []


def talk(host: netns.NetnsHost, to: str, want: int = 0, limit: float = 1.0) -> str:
    done = host.exec([sys.executable, "-c", CLIENT, to, "7000", str(want), str(limit)], env=dict(os.environ),
                     cwd=Path("/"), timeout=limit + 20)
    return done.stdout.strip()


def chains(ns: str) -> list[str]:
    return [line for line in netns.ns_run(ns, ["iptables", "-S"]).stdout.splitlines() if "mxc-" in line]


def test_a_run_network_isolates_namespaces_on_their_own_subnet(net: tuple[netns.Network, Ctx, subprocess.Popen[bytes]]) -> None:
    network, _ctx, _server = net
    a, b = network.hosts["a"], network.hosts["b"]
    assert talk(b, a.address).startswith("ok")  # namespace to namespace over the bridge
    assert a.port_open(7000)  # the harness (root namespace) reaches it too
    assert {a.netns, b.netns} <= set(netns.namespaces())
    routes = netns.ns_run(b.netns, ["ip", "-4", "route"]).stdout
    assert "default" not in routes and str(network.subnet) in routes  # its /24 only
    # nothing beyond it: no route (asked of the routing table; no packet is sent anywhere)
    assert "unreachable" in netns.ip("-n", b.netns, "route", "get", "192.0.2.1", check=False).stderr.lower()
    run_processes = [p for p in procscan.scan() if p.run_id == network.run_id]
    assert run_processes == []  # the server was started without MXCHAOS_RUN_ID


def test_partition_blackholes_the_peer_and_heal_restores_it(net: tuple[netns.Network, Ctx, subprocess.Popen[bytes]]) -> None:
    network, ctx, _server = net
    a, b = network.hosts["a"], network.hosts["b"]
    fault = make_fault(PartitionSpec(kind="partition", target="b", peer="a"), "cut")
    injected = fault.inject(ctx)  # type: ignore[arg-type]
    value = injected.record
    assert value["host"] == "b" and len(chains(b.netns)) == 5  # -N, 2 rules, 2 jumps
    assert talk(b, a.address, limit=0.7) == "timeout"  # a blackhole: no refusal, no reset
    assert a.port_open(7000)  # only b <-> a is cut
    healed = fault.heal(ctx, injected.token) or {}  # type: ignore[arg-type]
    witness = Witness.of(healed.pop("witness"))
    assert healed == {"chain": value["chain"], "removed": True}
    # its witness: the counters of the chain's rules, read before it went (the SYNs the blackhole ate)
    assert witness is not None and witness.effect == "seen" and witness.figures["packets"] >= 1, witness
    healed = fault.heal(ctx, injected.token) or {}  # type: ignore[arg-type]
    assert healed["removed"] is False and healed["witness"]["effect"] == "unwitnessed"  # idempotent: nothing to read
    assert chains(b.netns) == []
    assert talk(b, a.address).startswith("ok")


def test_partition_of_other_ports_leaves_this_one_alone(net: tuple[netns.Network, Ctx, subprocess.Popen[bytes]]) -> None:
    network, ctx, _server = net
    a, b = network.hosts["a"], network.hosts["b"]
    fault = make_fault(PartitionSpec(kind="partition", target="a", peer="b", ports=[7001]), "other")
    token = fault.inject(ctx).token  # type: ignore[arg-type]
    try:
        assert talk(b, a.address).startswith("ok")
    finally:
        fault.heal(ctx, token)  # type: ignore[arg-type]
    port = make_fault(PartitionSpec(kind="partition", target="a", peer="b", ports=[7000], direction="in"), "this")
    token = port.inject(ctx).token  # type: ignore[arg-type]
    try:
        assert talk(b, a.address, limit=0.7) == "timeout"
    finally:
        port.heal(ctx, token)  # type: ignore[arg-type]
    assert talk(b, a.address).startswith("ok")


def test_reject_answers_with_a_reset_at_once(net: tuple[netns.Network, Ctx, subprocess.Popen[bytes]]) -> None:
    network, ctx, _server = net
    a, b = network.hosts["a"], network.hosts["b"]
    fault = make_fault(RejectSpec(kind="reject", target="a", peer="b"), "rst")
    token = fault.inject(ctx).token  # type: ignore[arg-type]
    started = time.monotonic()
    assert talk(b, a.address, limit=5) == "refused"  # the SYN got a RST: ECONNREFUSED
    assert time.monotonic() - started < 4
    fault.heal(ctx, token)  # type: ignore[arg-type]
    assert chains(a.netns) == []
    assert talk(b, a.address).startswith("ok")
    port = make_fault(RejectSpec(kind="reject", target="a", peer="b", ports=[7000]), "port")
    injected = port.inject(ctx)  # type: ignore[arg-type]
    assert len(injected.record["rules"]) == 6  # TCP: RST passes, reset; UDP: refused
    try:
        assert talk(b, a.address, limit=5) == "refused"
    finally:
        port.heal(ctx, injected.token)  # type: ignore[arg-type]
    assert talk(b, a.address).startswith("ok")


def test_link_down_cuts_the_host_off_and_up_restores_it(net: tuple[netns.Network, Ctx, subprocess.Popen[bytes]]) -> None:
    network, ctx, _server = net
    a, b = network.hosts["a"], network.hosts["b"]
    fault = make_fault(LinkDownSpec(kind="link_down", target="a"), "down")
    injected = fault.inject(ctx)  # type: ignore[arg-type]
    assert {k: v for k, v in injected.record.items() if k != "witness"} == {"host": "a", "link": a.link}
    assert injected.record["witness"]["effect"] == "seen"  # no UP among its flags
    assert talk(b, a.address, limit=0.7) == "timeout"
    assert not a.port_open(7000, timeout=0.3)  # from the harness too
    fault.heal(ctx, injected.token)  # type: ignore[arg-type]
    fault.heal(ctx, injected.token)  # type: ignore[arg-type]
    assert talk(b, a.address, limit=3).startswith("ok")


def test_rate_slows_the_host_and_heal_removes_our_qdisc(net: tuple[netns.Network, Ctx, subprocess.Popen[bytes]]) -> None:
    network, ctx, _server = net
    a, b = network.hosts["a"], network.hosts["b"]
    size = 1 << 20  # 1 MiB
    fault = make_fault(RateSpec(kind="rate", target="a", rate="8mbit"), "slow")  # a's egress: 1 MB/s
    injected = fault.inject(ctx)  # type: ignore[arg-type]
    assert injected.record["devices"] == [f"{a.netns}:mx0"]
    slow = talk(b, a.address, want=size, limit=10).split()
    assert slow[0] == "ok" and int(slow[2]) == size and float(slow[1]) > 0.6, slow
    assert "tbf 1de:" in netns.ns_run(a.netns, ["tc", "qdisc", "show", "dev", "mx0"]).stdout
    healed = fault.heal(ctx, injected.token) or {}  # type: ignore[arg-type]
    witness = Witness.of(healed.pop("witness"))
    assert healed == {"removed": [f"{a.netns}:mx0"]}
    assert witness is not None and witness.effect == "seen" and witness.figures["sent_bytes"] >= size, witness
    assert "tbf" not in netns.ns_run(a.netns, ["tc", "qdisc", "show", "dev", "mx0"]).stdout
    fast = talk(b, a.address, want=size, limit=10).split()
    assert fast[0] == "ok" and float(fast[1]) < 0.5, fast
    ingress = make_fault(RateSpec(kind="rate", target="b", rate="8mbit", direction="ingress"), "in")
    injected = ingress.inject(ctx)  # type: ignore[arg-type]
    assert injected.record["devices"] == [f"root:{b.link}"]
    try:
        slow = talk(b, a.address, want=size, limit=10).split()
        assert slow[0] == "ok" and float(slow[1]) > 0.6, slow
    finally:
        ingress.heal(ctx, injected.token)  # type: ignore[arg-type]
    assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", b.link], capture_output=True, text=True).stdout


SCENARIO = """\
name: {name}
launcher: ["{{python}}", "{fake}"]
hosts: {{ctl: netns, a: netns}}
budgets: {{step: 10s, run: 60s, progress: 100s, stop_grace: 2s}}
scrape: {{interval: 200ms}}
processes:
  server: {{role: server, host: ctl}}
  source-1: {{role: source, host: a}}
  reader-1: {{role: reader, host: a, extra_args: [--fake-load-seconds, "0.5"]}}
  probe: {{role: reader, host: a}}
steps:
  - start: [server, source-1]
  - await: {{process: source-1, event: heartbeat}}
{steps}
checks:
  - nothing_leaked: {{}}
"""


def test_a_scenario_on_netns_hosts_runs_scrapes_and_leaves_nothing(tmp_path: Path) -> None:
    steps = """\
  # held while a probe on a connects to the server (the fake reader's first act, 2 s timeout):
  # its SYNs are what the cut's witness counts, whatever the machine's load
  - fault: {kind: partition, target: a, peer: ctl, name: cut}
  - start: probe
  - await: {process: probe, exit: true, code: any}
  - heal: cut
  # a negative control: the fake source sends only its scrapes' answers, never 10 mbit/s
  - fault: {kind: rate, target: source-1, rate: 10mbit, name: slow, expect_effect: false}
  - fault: {kind: link_down, target: ctl, name: down}
  - heal: down
  - start: reader-1
  - await: {process: reader-1, exit: true, code: 0}
"""
    path = tmp_path / "t.yaml"
    path.write_text(SCENARIO.format(name="netns_fake", fake=FAKE, steps=steps))
    result = Runner(load_scenario(path), out_dir=tmp_path / "runs", install_signal_handlers=False).run()
    folder = write_run_folder(result)
    assert result.verdict == "pass", (result.reason, result.not_exercised, [(c.name, c.summary) for c in result.checks])
    history = History.from_jsonl(folder / "timeline.jsonl")
    network = history.first(actor="harness", f="network", type="ok")
    assert network is not None and set(network.get("hosts")) == {"ctl", "a"}
    addresses = {name: host["address"] for name, host in network.get("hosts").items()}
    start = history.first(actor="source-1", f="start", type="ok")
    argv = start.get("argv")  # type: ignore[union-attr]
    assert start.get("host") == "a"  # type: ignore[union-attr]
    assert argv[argv.index("--advertise-host") + 1] == addresses["a"] == argv[argv.index("--metrics-host") + 1]
    assert argv[argv.index("--server") + 1].startswith(addresses["ctl"] + ":")
    assert argv[argv.index("--transport") + 1] == "ucx-tcp-any"
    scrapes = history.select(actor="source-1", f="scrape")
    assert scrapes and all(s.get("ok") for s in scrapes)  # the harness reaches the namespace
    healed = [e.get("fault") for e in history.select(actor="nemesis", f="heal", type="ok")]
    assert sorted(healed) == ["cut", "down", "slow"]
    witnesses = {w.name: w.witness.effect for w in history.fault_windows() if w.witness is not None}
    assert witnesses == {"cut": "seen", "slow": "none", "down": "seen"}  # the control held nothing back
    down = history.last(actor="harness", f="network_down")
    assert down is not None and down.get("leftovers") == []
    assert netns.leftovers(result.run_id) == []
    assert [p for p in procscan.scan() if p.run_id == result.run_id] == []


def test_cleanup_after_a_sigkilled_harness_removes_the_network_and_its_faults(tmp_path: Path) -> None:
    steps = """\
  - fault: {kind: partition, target: a, peer: ctl, name: cut}
  - fault: {kind: rate, target: a, rate: 10mbit, direction: both, name: slow}
  - fault: {kind: link_down, target: ctl, name: down}
  - sleep: 50s
"""
    path = tmp_path / "crash.yaml"
    path.write_text(SCENARIO.format(name="netns_crash", fake=FAKE, steps=steps))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "-v", str(path), "--out", str(tmp_path / "runs")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout
    assert stdout is not None

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    run_id = None
    try:
        deadline = time.monotonic() + 60
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if "step 6: sleep" in line:
                break
        info = json.loads(next((tmp_path / "runs" / "netns_crash").glob("*/run.json")).read_text())
        run_id = info["run_id"]
        hosts = info["network"]["hosts"]
        # what the run holds, checked while its harness lives (no other `mxchaos cleanup` touches it)
        left = netns.leftovers(run_id)
        assert sum(x.startswith("netns ") for x in left) == 2 and any(x.startswith("link mxb") for x in left)
        assert len(chains(hosts["a"]["netns"])) == 5
        assert "tbf 1de:" in subprocess.run(["tc", "qdisc", "show", "dev", hosts["a"]["link"]],
                                            capture_output=True, text=True).stdout
        assert len([p for p in procscan.scan() if p.run_id == run_id]) == 2
        proc.kill()  # SIGKILL: no teardown, no heal
        proc.wait(30)
        assert netns.leftovers(run_id) != []
        # --run-id: a global cleanup would also sweep the crashed runs of tests running in parallel
        # (pytest -n 2); which sweep removed what is test_cleanup_sweeps_a_run_by_its_id's business
        out = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup", "--run-id", run_id], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert netns.leftovers(run_id) == []
        assert [p for p in procscan.scan() if p.run_id == run_id] == []
        assert run_id not in netns.leftover_runs()
        assert netns.token(run_id) not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
        if run_id:
            sweep(run_id)


@pytest.mark.alone  # a global sweep: nothing of a neighbour's may be caught mid-start
def test_cleanup_leaves_a_live_run_alone_and_sweeps_a_run_by_its_id(tmp_path: Path) -> None:
    run_id = f"pytest-live-{os.getpid()}-{time.monotonic_ns()}"
    network = netns.Network.create(run_id, ["a", "b"])  # owned by this (live) process, no ledger entry
    try:
        cut = make_fault(PartitionSpec(kind="partition", target="a", peer="b"), "cut")
        chain = cut.inject(Ctx(run_id, network)).record["chain"]  # type: ignore[arg-type]
        report = sweep()
        assert run_id in report.skipped_live_runs and len(netns.leftovers(run_id)) == 5
        dry = sweep(run_id, dry_run=True)
        assert sorted(dry.network[run_id]) == sorted(netns.leftovers(run_id))
        swept = sweep(run_id)  # an explicit run id is swept, live or not
        assert swept.fault_leftovers["partition"] == [f"{network.hosts['a'].netns} iptables chain {chain}"]
        assert {x for x in swept.network[run_id] if x.startswith("netns ")} == {
            f"netns {h.netns}" for h in network.hosts.values()}
        assert f"link {network.names.bridge}" in swept.network[run_id]
    finally:
        assert network.close()["leftovers"] == []
