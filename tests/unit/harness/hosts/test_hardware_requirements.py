"""Hosts that require hardware (``hosts: {a: {requires: {accelerator: cuda, transport: rdma}}}``):
validation, the capability they need here (an inventory), what the hardware probe reports and
how a machine's declaration and probe are judged (``hardware_lacks``), the ssh per-host probe
that runs it, the ``outcome`` check the hardware set records its findings with, and the device
id a host gives a process that names the host's own accelerator."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fixtures.scenario_heads import THREE_PROCESSES

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.engine import launch
from harness.errors import ScenarioInvalid
from harness.hosts.base import ExecResult
from harness.hosts.hardware import Hardware, hardware_lacks, local_hardware, parse_hardware
from harness.hosts.inventory import parse_inventory
from harness.hosts.ssh import SshHost
from harness.record.timeline import History
from harness.scenario import capabilities, parse_scenario
from harness.scenario.capabilities import describe_missing, missing_on_ssh, scenario_requirements

HW = """\
name: hw
transport: {transport}
hosts:
  a: {{requires: {{accelerator: cuda, transport: rdma}}}}
  b: {{kind: local, requires: {{accelerator: cuda}}}}
processes:
  server: {{role: server, host: b}}
  source-1: {{role: source, host: a, options: {{accelerator: {acc}}}}}
  reader-1: {{role: reader, host: b, options: {{accelerator: cuda}}}}
steps: [{{start: [server, source-1, reader-1]}}]
checks: [{{nothing_leaked: {{}}}}]
"""


def hw(transport: str = "rdma", acc: str = "cuda") -> str:
    return HW.format(transport=transport, acc=acc)


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(capabilities.ENV_MISSING, raising=False)


# ---------------------------------------------------------------- the scenario side


def test_requires_is_read_per_host_and_a_mapping_without_kind_is_a_local_host() -> None:
    sc = parse_scenario(hw())
    assert sc.hosts["a"].kind == "local"
    assert {name: req.describe() for name, req in sc.hardware_hosts().items()} == {
        "a": "accelerator cuda, transport rdma", "b": "accelerator cuda"}
    assert parse_scenario(hw().replace("requires: {accelerator: cuda}}", "}")).hardware_hosts().keys() == {"a"}


@pytest.mark.parametrize(("text", "where", "rule"), [
    (hw().replace("{accelerator: cuda, transport: rdma}", "{}"), "hosts.a.requires", "names accelerator: cuda, transport: rdma"),
    (hw().replace("transport: rdma}}", "transport: tcp}}"), "hosts.a.requires.transport", "rdma"),
    (hw().replace("{accelerator: cuda, transport: rdma}", "{accelerator: gpu}"), "hosts.a.requires.accelerator", "cuda"),
    (hw().replace("{accelerator: cuda, transport: rdma}", "{accelerator: cuda, nic: mlx5}"), "hosts.a.requires.nic", "unknown"),
    (hw(acc="cpu"), "processes.source-1.options.accelerator", "host 'a' requires accelerator cuda"),
    (hw(transport="ucx-tcp"), "transport", "hosts a require transport rdma, but the scenario's transport is 'ucx-tcp'"),
])
def test_a_requirement_that_is_wrong_or_contradicted_is_a_located_error(text: str, where: str, rule: str) -> None:
    with pytest.raises(ScenarioInvalid) as bad:
        parse_scenario(text)
    rendered = str(bad.value)
    assert where in rendered and rule in rendered, rendered


def test_without_an_inventory_the_scenario_needs_one_and_says_which_hosts_need_what() -> None:
    needs = scenario_requirements(parse_scenario(hw()))
    assert needs["inventory"] == ["host a requires accelerator cuda, transport rdma", "host b requires accelerator cuda"]
    lacking, why = describe_missing(needs)
    assert lacking == ["inventory"]
    assert why.startswith("needs an inventory with GPU/RDMA hosts (--inventory FILE")
    assert why.endswith("host a requires accelerator cuda, transport rdma; host b requires accelerator cuda")
    plain = parse_scenario(hw().replace("requires: {accelerator: cuda, transport: rdma}", "kind: local")
                           .replace(", requires: {accelerator: cuda}", ""))
    assert "inventory" not in scenario_requirements(plain)


def test_with_other_lacks_both_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(capabilities.ENV_MISSING, "tc")
    lacking, why = describe_missing({"inventory": ["host a requires accelerator cuda"], "tc": ["slow (rate)"]})
    assert lacking == ["inventory", "tc"]
    assert "host a requires accelerator cuda; this machine lacks tc (for slow (rate))" in why


# ---------------------------------------------------------------- the probe and its judgement


def test_the_probe_parses_gpus_rdma_devices_and_the_data_devices_port() -> None:
    out = "0\nhw-cuda-gpus 8\nhw-rdma-devices mlx5_0 mlx5_1 \nhw-rdma-netdev mlx5_1 \nother\n"
    assert parse_hardware(out) == Hardware(gpus=8, rdma=("mlx5_0", "mlx5_1"), netdev_rdma=("mlx5_1",))
    assert parse_hardware("hw-cuda-gpus \nhw-rdma-devices \n") == Hardware(gpus=0, rdma=(), netdev_rdma=None)
    assert "/sys/class/net/ens1f0/device/infiniband" in capabilities.hardware_probe("ens1f0")


def test_the_local_probe_agrees_with_what_this_machine_has() -> None:
    """The same shell line the ssh hosts run, here, against independent evidence."""
    gpus = [p for p in glob.glob("/dev/nvidia*") if os.path.basename(p)[6:].isdigit()]
    ib = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    found = local_hardware()
    if gpus:
        assert found.gpus > 0
    elif shutil.which("nvidia-smi") is None:
        assert found.gpus == 0
    if ib:
        assert sorted(found.rdma) == ib
    elif shutil.which("ibv_devices") is None:
        assert found.rdma == ()
    assert capabilities.have("cuda") == (found.gpus > 0) and capabilities.have("rdma") == bool(found.rdma)
    assert not capabilities.have("inventory")  # never here: hardware hosts are an inventory's machines


BOTH = parse_scenario(hw()).hosts["a"].requires


@pytest.mark.parametrize(("probe", "declared", "expect"), [
    (Hardware(gpus=2, rdma=("mlx5_0",)), {"accelerator": "cuda", "device": 1, "transport": "rdma"}, []),
    (Hardware(gpus=0, rdma=()), {"accelerator": "cpu", "device": None, "transport": "ucx-tcp-any"},
     ["no cuda: the inventory declares accelerator cpu", "no rdma: the inventory declares transport ucx-tcp-any"]),
    (Hardware(gpus=0, rdma=("mlx5_0",)), {"accelerator": "cuda", "device": 0, "transport": "rdma"},
     ["no cuda: probed: nvidia-smi -L lists no GPU"]),
    (Hardware(gpus=2, rdma=()), {"accelerator": "cuda", "device": 2, "transport": None},
     ["no cuda: probed: cuda device 2 declared, 2 GPU(s) found",
      "no rdma: the inventory declares transport none (give transport: rdma); probed: no /sys/class/infiniband"]),
])
def test_a_machine_must_declare_the_hardware_and_have_it(probe: Hardware, declared: dict[str, Any], expect: list[str]) -> None:
    assert BOTH is not None
    lacks = hardware_lacks(BOTH, probe, accelerator=declared["accelerator"], device=declared["device"],
                           transport=declared["transport"])
    assert len(lacks) == len(expect) and all(lack.startswith(want) for lack, want in zip(lacks, expect, strict=True)), lacks


def test_a_network_fault_needs_the_data_device_to_carry_the_rdma_traffic() -> None:
    assert BOTH is not None
    probe = Hardware(gpus=1, rdma=("mlx5_0",), netdev_rdma=())
    kwargs: dict[str, Any] = {"accelerator": "cuda", "device": 0, "transport": "rdma", "data_device": "eth0"}
    assert hardware_lacks(BOTH, probe, **kwargs) == []
    (lack,) = hardware_lacks(BOTH, probe, netdev_needed=True, **kwargs)
    assert lack.startswith("no rdma: probed: data device eth0 has no RDMA device behind it")
    assert hardware_lacks(BOTH, probe.model_copy(update={"netdev_rdma": ("mlx5_0",)}), netdev_needed=True, **kwargs) == []


# ---------------------------------------------------------------- the ssh per-host probe

INVENTORY = """\
machines:
  gpu-a: {address: 10.0.0.1, transport: rdma, accelerator: {kind: cuda, device: 1}, data: {device: ens1f0}, sudo: true}
  cpu-b: {address: 10.0.0.2}
"""


def test_the_ssh_probe_runs_the_hardware_probe_on_the_data_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = parse_inventory(INVENTORY)
    host = SshHost("a", "gpu-a", inv.machines["gpu-a"], "run-hw-1", tmp_path)
    sent: list[str] = []

    def checked(self: SshHost, command: str, what: str, timeout: float | None = None) -> ExecResult:
        sent.append(command)
        return ExecResult(0, "1000\niptables\nip\nsudo\nhw-cuda-gpus 2\nhw-rdma-devices mlx5_0 \nhw-rdma-netdev mlx5_0 \n", "", 0.1)

    monkeypatch.setattr(SshHost, "_checked", checked)
    assert host.capabilities() == {"iptables", "ip", "root", "data-device"} and host.hardware is None
    assert "nvidia-smi" not in sent[0]  # no hardware asked for: not probed (it can take a second)
    found = host.capabilities(hardware=True)
    assert found == {"iptables", "ip", "root", "data-device", "cuda", "rdma", "rdma-netdev"}
    assert "nvidia-smi -L" in sent[1] and "/sys/class/net/ens1f0/device/infiniband" in sent[1]
    assert host.hardware == Hardware(gpus=2, rdma=("mlx5_0",), netdev_rdma=("mlx5_0",))


def _fake_machines(monkeypatch: pytest.MonkeyPatch, probes: dict[str, Hardware]) -> None:
    def caps(self: SshHost, *, hardware: bool = False) -> set[str]:
        self.hardware = probes[self.machine_name] if hardware else None
        return {"root", "ip", "iptables", "data-device"}

    monkeypatch.setattr(SshHost, "capabilities", caps)
    monkeypatch.setattr(SshHost, "close_master", lambda self: None)


def test_on_an_inventory_a_host_without_the_hardware_is_a_skip_naming_host_machine_and_lack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = parse_scenario(hw())
    inv = parse_inventory(INVENTORY)
    _fake_machines(monkeypatch, {"gpu-a": Hardware(gpus=2, rdma=("mlx5_0",)), "cpu-b": Hardware()})
    lacking, why = missing_on_ssh(sc, inv, "run-hw-2", tmp_path)
    assert lacking == ["ssh-host", "hardware"]
    assert "host a (machine gpu-a)" not in why  # it has what it requires
    assert "host b (machine cpu-b): no cuda: the inventory declares accelerator cpu" in why, why
    assert "no rdma" not in why  # b requires no rdma


def test_on_an_inventory_of_gpu_rdma_machines_nothing_is_lacking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = parse_scenario(hw())
    inv = parse_inventory(INVENTORY.replace("cpu-b: {address: 10.0.0.2}",
                                            "cpu-b: {address: 10.0.0.2, transport: rdma, accelerator: cuda}"))
    _fake_machines(monkeypatch, {"gpu-a": Hardware(gpus=2, rdma=("mlx5_0",)), "cpu-b": Hardware(gpus=1, rdma=("mlx5_0",))})
    assert missing_on_ssh(sc, inv, "run-hw-3", tmp_path) == ([], "")
    # declared, but the probe finds none: still a skip (the declaration is not believed alone)
    _fake_machines(monkeypatch, {"gpu-a": Hardware(gpus=2, rdma=()), "cpu-b": Hardware(gpus=1, rdma=("mlx5_0",))})
    lacking, why = missing_on_ssh(sc, inv, "run-hw-4", tmp_path)
    assert lacking == ["ssh-host", "hardware"] and "host a (machine gpu-a): no rdma: probed: no /sys/class/infiniband" in why


# ---------------------------------------------------------------- the device id of a cuda host


def test_a_process_naming_the_hosts_accelerator_still_gets_the_hosts_device(tmp_path: Path) -> None:
    sc = parse_scenario(hw())

    def argv(name: str) -> list[str]:
        where = launch.Placement(run_dir=tmp_path, events_path=tmp_path / "e", log_path=tmp_path / "procs" / f"{name}.log",
                                 host_address="10.1.0.1", in_netns=False, incarnation=1, server_address="10.1.0.1:1",
                                 checkpoint=tmp_path / "c", transport="rdma", accelerator=("cuda", 3))
        return launch.process_argv(sc, name, where)

    for name in ("source-1", "reader-1"):
        got = argv(name)
        assert got.count("--accelerator") == 1 and got[got.index("--accelerator") + 1] == "cuda", got
        assert got[got.index("--device-id") + 1] == "3", got


# ---------------------------------------------------------------- the outcome check

ROLES = RunFacts(roles={"source-1": "source", "reader-1": "reader"})
OUTCOMES = {
    "completed_despite_the_freeze": [{"fault": "freeze"}, {"process": "reader-1", "event": "transfer_done", "where": {"index": 0}}],
    "stalled_then_next_candidate": [{"fault": "freeze"},
                                    {"process": "reader-1", "event": "transfer_timeout", "where": {"index": 0}},
                                    {"process": "reader-1", "event": "attempt_start", "where": {"index": 1}}],
}
START = [(1.0, "ok", "reader-1", "start", {}), (1.5, "info", "reader-1", "transfer_start", {"index": 0})]
FREEZE = (1.6, "invoke", "nemesis", "inject", {"fault": "freeze"})


def outcome(rows: list[tuple[Any, ...]]) -> checks.NamedResult:
    params = checks.REGISTRY["outcome"].params.model_validate({"of": OUTCOMES})
    return evaluate(0, "outcome", params, History.build(rows), ROLES)


def test_outcome_names_the_alternative_that_happened() -> None:
    done = outcome([*START, FREEZE, (1.7, "info", "reader-1", "transfer_done", {"index": 0})])
    assert done.valid is True and done.details["outcome"] == "completed_despite_the_freeze"
    assert done.summary.startswith("outcome: completed_despite_the_freeze: fault freeze (1.600s) < reader-1 transfer_done")
    stalled = outcome([*START, FREEZE, (2.5, "info", "reader-1", "transfer_timeout", {"index": 0}),
                       (2.6, "info", "reader-1", "attempt_start", {"index": 1}),
                       (3.0, "info", "reader-1", "transfer_done", {"index": 1})])
    assert stalled.valid is True and stalled.details["outcome"] == "stalled_then_next_candidate"
    assert stalled.details["held"] == ["stalled_then_next_candidate"]


def test_outcome_fails_when_none_happened_saying_where_each_chain_broke() -> None:
    # the READ completed before the freeze landed: nothing learned about a frozen source
    early = outcome([*START, (1.55, "info", "reader-1", "transfer_done", {"index": 0}), FREEZE])
    assert early.valid is False
    assert "completed_despite_the_freeze: reader-1 transfer_done index=0 never happened after fault freeze (1.600s)" in early.summary
    assert "stalled_then_next_candidate: reader-1 transfer_timeout index=0 never happened after fault freeze" in early.summary
    # a chain is ordered: the next candidate before the stall does not count
    order = outcome([*START, FREEZE, (2.0, "info", "reader-1", "attempt_start", {"index": 1}),
                     (2.5, "info", "reader-1", "transfer_timeout", {"index": 0})])
    assert order.valid is False and "attempt_start index=1 never happened after reader-1 transfer_timeout" in order.summary


def test_outcome_alternatives_are_validated_like_any_reference() -> None:
    text = "name: t\n" + THREE_PROCESSES + """\
  - fault: {kind: pause, target: source-1, name: freeze}
checks:
  - outcome:
      of:
        a: [{fault: freez}]
        b: [{process: reader-1, event: transfer_dne}]
"""
    with pytest.raises(ScenarioInvalid) as bad:
        parse_scenario(text)
    rendered = str(bad.value)
    assert "checks[0].outcome.of.a[0].fault: no fault named 'freez'" in rendered, rendered
    assert "checks[0].outcome.of.b[0].event" in rendered and "transfer_done" in rendered, rendered
    with pytest.raises(ScenarioInvalid, match="at least 2"):
        parse_scenario(text.replace("        b: [{process: reader-1, event: transfer_dne}]\n", "").replace("freez", "freeze"))


# ---------------------------------------------------------------- the hardware set's own checks

HARDWARE = Path(__file__).resolve().parents[4] / "scenarios" / "hardware"
JUDGED = ("outcome", "count", "elapsed", "ordering", "loaded")  # integrity/exit_codes/nothing_leaked need a real run


def judge_file(name: str, rows: list[tuple[Any, ...]]) -> dict[str, checks.NamedResult]:
    """The scenario file's own checks of the kinds above, judged on a made-up timeline."""
    from harness.scenario import load_scenario

    sc = load_scenario(HARDWARE / name)
    facts = RunFacts(roles=sc.roles())
    history = History.build(rows)
    return {params.label(kind): evaluate(i, kind, params, history, facts)
            for i, (kind, params) in enumerate(sc.check_entries()) if kind in JUDGED}


def _failed(results: dict[str, checks.NamedResult]) -> dict[str, str]:
    return {name: r.summary for name, r in results.items() if r.valid is not True}


READY = [(0.5, "ok", "source-1", "start", {}), (1.0, "info", "source-1", "agent_ready", {"mem_type": "VRAM"}),
         (1.1, "info", "source-1", "published", {"worker_id": "w1"}), (2.0, "ok", "reader-1", "start", {}),
         (2.5, "info", "reader-1", "candidates", {"listed": 2, "accelerator_matched": 2}),
         (2.6, "info", "reader-1", "attempt_start", {"index": 0, "worker_id": "w1"}),
         (3.0, "info", "reader-1", "transfer_start", {"index": 0})]
LOADED = {"path": "rdma", "integrity": True}


def test_the_smoke_passes_on_a_vram_load_and_fails_on_a_cpu_reader() -> None:
    rows = [*READY[:4], (2.5, "info", "reader-1", "candidates", {"listed": 1, "accelerator_matched": 1}), *READY[5:],
            (3.2, "info", "reader-1", "transfer_done", {"index": 0}), (3.5, "info", "reader-1", "load_done", {**LOADED, "source": "source-1"})]
    assert _failed(judge_file("smoke_rdma.yaml", rows)) == {}
    cpu: list[tuple[Any, ...]] = [
        (2.5, "info", "reader-1", "candidates", {"listed": 1, "accelerator_matched": 0}) if r[3] == "candidates"
        else (r[0], r[1], r[2], "fallback", {}) if r[3] == "load_done" else r
        for r in rows if r[3] not in ("attempt_start", "transfer_start", "transfer_done")]
    assert set(_failed(judge_file("smoke_rdma.yaml", cpu))) == {
        "the reader is a cuda reader: the VRAM source matched its accelerator", "loaded(reader-1, rdma, from source-1)",
        "count(reader-1 fallback <= 0)"}


def test_the_frozen_source_records_either_finding_and_fails_when_the_freeze_came_too_late() -> None:
    freeze = (3.05, "invoke", "nemesis", "inject", {"fault": "freeze"})
    nic = [*READY, freeze, (3.2, "info", "reader-1", "transfer_done", {"index": 0}),
           (3.5, "info", "reader-1", "load_done", {**LOADED, "source": "source-1"})]
    results = judge_file("frozen_source_rdma.yaml", nic)
    assert _failed(results) == {}
    (found,) = [r for r in results.values() if r.kind == "outcome"]
    assert found.details["outcome"] == "completed_despite_the_freeze"
    stall = [*READY, freeze, (3.9, "info", "reader-1", "transfer_timeout", {"index": 0, "stalled": True}),
             (4.0, "info", "reader-1", "attempt_start", {"index": 1}), (4.1, "info", "reader-1", "transfer_start", {"index": 1}),
             (4.4, "info", "reader-1", "transfer_done", {"index": 1}), (4.6, "info", "reader-1", "load_done", {**LOADED, "source": "source-2"})]
    results = judge_file("frozen_source_rdma.yaml", stall)
    assert _failed(results) == {}
    (found,) = [r for r in results.values() if r.kind == "outcome"]
    assert found.details["outcome"] == "stalled_then_next_candidate"
    late = [*READY, (3.02, "info", "reader-1", "transfer_done", {"index": 0}), freeze,
            (3.5, "info", "reader-1", "load_done", {**LOADED, "source": "source-1"})]
    assert list(_failed(judge_file("frozen_source_rdma.yaml", late))) == [
        "what a frozen source does to a one-sided RDMA READ (a finding)"]


def test_the_link_down_wants_the_transports_error_not_the_budget() -> None:
    unplug = (3.05, "invoke", "nemesis", "inject", {"fault": "unplug"})
    retry = [*READY, unplug, (5.2, "info", "reader-1", "transfer_error", {"index": 0}),
             (5.3, "info", "reader-1", "attempt_start", {"index": 1}),
             (12.0, "info", "reader-1", "load_done", {**LOADED, "source": "source-2"})]
    results = judge_file("rdma_link_down.yaml", retry)
    assert _failed(results) == {}
    (found,) = [r for r in results.values() if r.kind == "outcome"]
    assert found.details["outcome"] == "next_candidate_loaded_over_rdma"
    budget = [*READY, unplug, (63.0, "info", "reader-1", "transfer_timeout", {"index": 0}),
              (63.1, "info", "reader-1", "attempt_start", {"index": 1}),
              (70.0, "info", "reader-1", "load_done", {**LOADED, "source": "source-2"})]
    failed = _failed(judge_file("rdma_link_down.yaml", budget))
    assert set(failed) == {"the READ ended by the transport's retry timeout (~2.1 s), not at once and not at the 60 s budget",
                           "no READ ran into its budget", "then the next candidate"}, failed
