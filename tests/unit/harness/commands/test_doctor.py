"""``mxchaos doctor``'s rules with fake places, and the environment-broken rule on written run
folders: what a scenario needs of a place, when a place blocks a scenario (and the fix it is
told), and when a failed run is a broken environment rather than a verdict on NIXL. The probes
themselves run for real in ``tests/integration/test_jobs_real.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.commands.doctor import NATIVE, ProbeSite, blocking, probe, render, scenario_needs, verdict_line
from harness.judge.envbroken import cell_reason, environment_reason, text_reason
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[4]
SMOKE = load_scenario(ROOT / "scenarios" / "smoke.yaml")
GRPCIO = load_scenario(ROOT / "scenarios" / "grpcio_server.yaml")


def _place(native: bool = True, nixl: bool = True, kind: str = "env", caps: dict[str, bool] | None = None) -> ProbeSite:
    facts: dict[str, Any] = {
        "python": "/envs/x/bin/python", "python_version": "3.11.7", "nixl_version": "1.4.1",
        "nixl_import": None if nixl else "ModuleNotFoundError: No module named 'nixl'",
        "ucx_version": "1.22.0", "ucx_transports": ["cma", "ib"],
        "native_import": None if native else "ModuleNotFoundError: No module named 'mxref_native'",
        "capabilities": {"root": True, "toxiproxy": True, **(caps or {})}, "gpus": 0, "rdma_devices": [],
    }
    return ProbeSite("nixl-1.4.1", kind, facts)


def test_a_scenario_on_the_native_server_needs_the_extension_and_one_on_grpcio_does_not() -> None:
    assert NATIVE in scenario_needs(SMOKE) and "nixl" in scenario_needs(SMOKE)
    assert NATIVE not in scenario_needs(GRPCIO)  # extra_args: [--grpc-impl, grpcio]


def test_a_place_without_the_native_extension_blocks_only_the_scenarios_that_need_it() -> None:
    bad = _place(native=False)
    lines = blocking([bad], [SMOKE, GRPCIO])
    assert len(lines) == 1 and lines[0].startswith("nixl-1.4.1: smoke cannot run: the native extension")
    assert "No module named 'mxref_native'" in lines[0] and "fix: mxchaos doctor --nixl 1.4.1 (installs the cached wheel" in lines[0]
    host = ProbeSite("host h1", "host", _place(native=False).facts)
    assert "fix: on the host, in its checkout: ./.ci/bootstrap" in blocking([host], [SMOKE])[0]
    assert blocking([_place()], [SMOKE, GRPCIO]) == []
    assert blocking([_place(nixl=False)], [GRPCIO])[0].startswith("nixl-1.4.1: grpcio_server cannot run: NIXL does not import")


def test_a_missing_capability_is_a_skip_not_a_block_and_the_table_names_the_fix() -> None:
    sc = load_scenario(ROOT / "scenarios" / "redis_paused.yaml")
    place = _place(caps={"redis-server": False})
    assert blocking([place], [sc]) == []  # it SKIPs there, as mxchaos run would
    text = render([place], [sc, SMOKE])
    assert "redis_paused" in text and "nixl-1.4.1: SKIP (" in text and "redis-server" in text
    assert "smoke" in text and "nixl-1.4.1: ok" in text
    assert "redis-server: apt-get install redis-server" in text


def test_an_unreachable_host_blocks_and_an_uninstallable_release_does_not() -> None:
    host = ProbeSite("host h1", "host", error="10.0.0.1:22: the probe failed (rc 255): Connection refused")
    assert blocking([host], [SMOKE])[0].startswith("host h1: smoke cannot run: not probed: 10.0.0.1:22")
    assert "NOT PROBED" in render([host], [SMOKE])
    gone = ProbeSite("nixl-9.9.9", "unavailable", error="nixl: ERROR: No matching distribution found for nixl-cu12==9.9.9")
    assert blocking([gone], [SMOKE]) == []  # the matrix shows that column as unavailable, as before


def test_the_probe_reports_this_interpreter() -> None:
    facts = probe(["root"])
    assert facts["nixl_version"] and facts["nixl_import"] is None
    assert set(facts["capabilities"]) >= {"root", "toxiproxy", "redis-server", "sshd"}
    assert isinstance(facts["ucx_transports"], list)
    json.dumps(facts)  # what a remote place prints and we read back


# ------------------------------------------------------------------ environment broken


def _run_folder(tmp_path: Path, name: str, verdict: str = "fail", exit_error: str = "", inject: bool = False,
                log: str = "") -> Path:
    run = tmp_path / name
    (run / "procs").mkdir(parents=True)
    (run / "verdict.json").write_text(json.dumps({"verdict": verdict, "status": "step_failed"}))
    timeline = [{"index": 0, "actor": "harness", "f": "step", "type": "invoke", "t": 0.1}]
    if inject:
        timeline.append({"index": 1, "actor": "nemesis", "f": "inject", "type": "invoke", "t": 0.5, "value": {"fault": "cut"}})
    (run / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in timeline))
    if exit_error:
        (run / "procs" / "server.events.jsonl").write_text(
            json.dumps({"event": "exit", "proc": "server", "code": 3, "error": exit_error}) + "\n")
    if log:
        (run / "procs" / "reader-1.log").write_text(log)
    return run


NATIVE_GONE = ("metadata server: --grpc-impl native: mxref_native is not installed (No module named 'mxref_native'): "
               "pip install ./mxref/native")


def test_a_run_that_died_of_its_environment_before_any_fault_says_so(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, "a", exit_error=NATIVE_GONE)
    assert environment_reason(run) == f"server: {NATIVE_GONE}"
    log = "Traceback (most recent call last):\n  File x\nModuleNotFoundError: No module named 'nixl'\n"
    assert environment_reason(_run_folder(tmp_path, "b", log=log)) == "reader-1: ModuleNotFoundError: No module named 'nixl'"


@pytest.mark.parametrize("case", ["passed", "after a fault", "no environment words"])
def test_a_run_that_is_a_verdict_on_nixl_is_never_called_environment_broken(tmp_path: Path, case: str) -> None:
    run = {
        "passed": lambda: _run_folder(tmp_path, "p", verdict="pass", exit_error=NATIVE_GONE),
        "after a fault": lambda: _run_folder(tmp_path, "f", exit_error=NATIVE_GONE, inject=True),
        "no environment words": lambda: _run_folder(tmp_path, "w", exit_error="transfer failed: NIXL_ERR_REMOTE_DISCONNECT"),
    }[case]()
    assert environment_reason(run) is None


def test_a_cell_is_environment_broken_only_when_every_run_is(tmp_path: Path) -> None:
    broken = [_run_folder(tmp_path, f"r{i}", exit_error=NATIVE_GONE) for i in range(3)]
    assert cell_reason(broken) == f"server: {NATIVE_GONE}"
    good = _run_folder(tmp_path, "good", verdict="pass")
    assert cell_reason([*broken, good]) is None  # one run worked: the environment can play the roles
    assert cell_reason([]) is None
    assert text_reason("mxchaos run exited 1: ModuleNotFoundError: No module named 'pydantic'") is not None


def test_the_verdict_line_says_whether_scenarios_run_what_is_lacking_and_names_every_subject() -> None:
    here = _place(kind="here", caps={"cuda": False, "rdma": False})
    line = verdict_line([here], False, [])
    assert line.startswith("verdict: OK, scenarios run here; lacking ") and "cuda" in line and "rdma" in line
    assert "subjects: mxref (the project's environment), modelexpress " in line
    assert verdict_line([here], True, ["modelexpress"]).startswith("verdict: BROKEN (exit 4)")
    assert "modelexpress 0.7.0 (probed above)" in verdict_line([here], True, ["modelexpress"])
