"""The server axis of ``mxchaos matrix`` (``--mx-server mxref,0.7.0,...``): its columns, the
``--subject``/environment each column's ``mxchaos run`` gets, who served each cell, and the one
build path (``.ci/build-mx-server``, run once per uncached version, never fatal). Nothing here
starts a server or cargo: the build script and ``mxchaos run`` are stand-ins."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.matrix.run import MatrixSpec, run_matrix
from harness.matrix.servers import prepare_servers, server_axis
from harness.record.cells import Column, columns_for
from harness.scenario.subjects import with_subjects
from harness.subjects import mx_server
from harness.subjects.mx_build import BUILD_SCRIPT, ensure_server, parse_server_versions


def test_server_columns_cross_the_subject_axis() -> None:
    cols = columns_for([], [], ["mxref", "modelexpress"], ["mxref", "0.7.0"])
    assert [c.id for c in cols] == ["subject-mxref+mx-server-mxref", "subject-modelexpress+mx-server-mxref",
                                    "subject-mxref+mx-server-0.7.0", "subject-modelexpress+mx-server-0.7.0"]
    assert cols[3].label == "subject modelexpress server modelexpress 0.7.0"
    assert cols[3].subject_arg() == ["--subject", "server=modelexpress,client=modelexpress"]
    assert cols[0].subject_arg() == ["--subject", "server=mxref,client=mxref"]
    assert cols[3].env_dict() == {"MXCHAOS_MX_SERVER_VERSION": "0.7.0"} and cols[0].env_dict() == {}
    alone = Column("", mx_server="0.8.0-nightly.20261201.gabc1234")
    assert alone.subject_arg() == ["--subject", "server=modelexpress"]
    assert Column("", subject="modelexpress").subject_arg() == ["--subject", "modelexpress"]  # as before
    assert mx_server.parse_subjects(cols[3].subject_arg()[1]) == {"server": "modelexpress", "client": "modelexpress"}


@pytest.mark.parametrize(("text", "message"), [
    ("", "give comma-separated versions"), ("0.7.0,", "give comma-separated versions"),
    ("0.7", "neither a crate version"), ("../0.7.0", "neither a crate version"), ("0.7.0,0.7.0", "once"),
])
def test_bad_server_axes_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_server_versions(text)
    assert server_axis(None) == [] and server_axis("mxref,0.8.0-nightly.20261201.gabc1234") == [
        "mxref", "0.8.0-nightly.20261201.gabc1234"]


def test_mxchaos_matrix_refuses_a_bad_server_axis(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--mx-server", "0.7", "scenarios/smoke.yaml"]) == 2
    assert "neither a crate version" in capsys.readouterr().err


def _built(root: Path, version: str) -> Path:
    home = root / "mx-server" / version
    (home / "bin").mkdir(parents=True)
    binary = home / "bin" / "modelexpress-server"
    binary.write_text("#!/bin/sh\necho modelexpress-server " + version + "\n")
    binary.chmod(0o755)
    (home / ".mxchaos-built").write_text("cargo\n")
    return binary


def test_a_cached_version_is_not_built_again_and_an_uncached_one_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MXCHAOS_MX_SERVER_BIN", raising=False)
    _built(tmp_path, "0.7.0")
    builds: list[list[str]] = []

    def runner(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        builds.append(argv)
        if argv[1] == "0.8.0":
            _built(tmp_path, "0.8.0")
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.CompletedProcess(argv, 1, "", "[build-mx-server] could not build modelexpress-server 9.9.9")

    logs: list[str] = []
    errors = prepare_servers(["mxref", "0.7.0", "0.8.0", "9.9.9"], logs.append, runner=runner)
    assert builds == [[str(BUILD_SCRIPT), "0.8.0"], [str(BUILD_SCRIPT), "9.9.9"]]  # 0.7.0 cached, mxref none
    assert errors["0.7.0"] is None and errors["0.8.0"] is None
    assert "could not build modelexpress-server 9.9.9" in str(errors["9.9.9"]) and "build.log" in str(errors["9.9.9"])
    assert any("9.9.9" in line and "not installable" in line for line in logs)
    assert ensure_server("0.7.0", logs.append, runner=runner).cached


def test_a_binary_without_its_stamp_is_not_a_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MXCHAOS_MX_SERVER_BIN", raising=False)
    binary = _built(tmp_path, "0.8.0")
    assert mx_server.server_binary("0.8.0") == binary
    (binary.parent.parent / ".mxchaos-built").unlink()  # a cut-off build's leftovers
    assert mx_server.server_binary("0.8.0") is None


def test_the_selected_version_is_what_versions_json_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MXCHAOS_MX_SERVER_BIN", raising=False)
    monkeypatch.setenv("MXCHAOS_MX_SERVER_VERSION", "0.8.0")
    binary = _built(tmp_path, "0.8.0")
    sc = with_subjects(_scenario(), {"server": "modelexpress"})
    served = mx_server.server_versions(sc)["modelexpress"]
    assert served["version"] == "0.8.0" and served["binary"] == str(binary)
    assert served["reports"] == "modelexpress-server 0.8.0"  # the binary's own word, beside the asked version


def _scenario() -> Any:
    from harness.scenario import parse_scenario

    return parse_scenario("name: s\nprocesses:\n  server: {role: server}\n  source-1: {role: source}\n"
                          "steps:\n  - start: [server, source-1]\n")


def test_a_server_matrix_runs_each_column_with_its_server(tmp_path: Path) -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []

    def execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        argv = list(argv)
        calls.append((argv, dict(env)))
        if "mxref.bench.raw" in argv:
            return 0, '{"raw_read": {"bytes": 1, "gbps": [2.0], "median_gbps": 2.0}}\n'
        if argv[3:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--repeat N]"
        roles = mx_server.parse_subjects(argv[argv.index("--subject") + 1])
        version = env.get("MXCHAOS_MX_SERVER_VERSION", "")
        out = Path(argv[argv.index("--out") + 1])
        folder = out / "smoke" / "run0"
        folder.mkdir(parents=True)
        verdict = "pass" if roles["server"] == "mxref" else "xfail"
        served = {"mxref": {"version": "this repository"}} if roles["server"] == "mxref" else {
            "modelexpress": {"version": version}}
        (folder / "verdict.json").write_text(json.dumps({"scenario": "smoke", "verdict": verdict}))
        (folder / "versions.json").write_text(json.dumps({"subjects": {"mxref": {"version": "this repository"}},
                                                          "servers": served}))
        (folder / "timeline.jsonl").write_text("")
        run: dict[str, Any] = {"verdict": verdict, "run_dir": str(folder), "seed": 0, "seconds": 1.0}
        summary = {"repeat": 1, "scenarios": {"smoke": {"cell": verdict.upper(), "rate": {"k": 1, "n": 1}, "runs": [run]}}}
        (out / "summary.json").write_text(json.dumps(summary))
        return 0, ""

    spec = MatrixSpec(scenarios=[tmp_path / "smoke.yaml"], names=["smoke"], defects={},
                      columns=columns_for([], [], [], ["mxref", "0.7.0"]), out=tmp_path / "out")
    matrix = run_matrix(spec, execute=execute, ensure=lambda v: pytest.fail(f"built an env for {v!r}")).to_json()
    runs = [(argv, env) for argv, env in calls if "--out" in argv]
    assert [argv[argv.index("--subject") + 1] for argv, _ in runs] == ["server=mxref", "server=modelexpress"]
    assert [env.get("MXCHAOS_MX_SERVER_VERSION") for _, env in runs] == [None, "0.7.0"]
    cells = matrix["cells"]["smoke"]
    assert cells["mx-server-mxref"]["verdict"] == "PASS" and cells["mx-server-mxref"]["servers"] == {"mxref": "this repository"}
    assert cells["mx-server-0.7.0"]["verdict"] == "XFAIL" and cells["mx-server-0.7.0"]["servers"] == {"modelexpress": "0.7.0"}
    assert [c["mx_server"] for c in matrix["columns"]] == ["mxref", "0.7.0"]


def test_the_build_script_refuses_a_bad_version_and_skips_a_built_one(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MXCHAOS_CACHE_DIR": str(tmp_path)}
    bad = subprocess.run([str(BUILD_SCRIPT), "0.7.0/../x"], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert bad.returncode == 2 and "not a crate version" in bad.stderr
    _built(tmp_path, "0.7.0")  # stamped: nothing to do, no cargo asked for
    done = subprocess.run([str(BUILD_SCRIPT), "0.7.0"], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert done.returncode == 0 and done.stderr == ""
    failed = tmp_path / "mx-server" / "0.6.0"
    failed.mkdir(parents=True)
    (failed / ".mxchaos-failed").write_text("build failed\n")  # remembered: not retried without the override
    again = subprocess.run([str(BUILD_SCRIPT), "0.6.0"], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert again.returncode == 1 and "MXCHAOS_REBUILD_MX_SERVER=1" in again.stderr
