"""``latest-nightly`` in ``mxchaos matrix --mx-server`` and ``--subject modelexpress@...``: resolved
from the registry's answer (here a fake command runner: no registry is asked), the column named
by the version, the spelling recorded beside it, and a nightly that does not resolve, build or
install a column that says "not installable" with its reason, never a failing cell."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.matrix.run import MatrixSpec, run_matrix
from harness.matrix.servers import prepare_clients, prepare_servers, resolve_latest
from harness.record.cells import columns_for
from harness.subjects import mx_server
from harness.subjects.envs import ENV_CLIENT_VERSION, subject_env_dir, subject_spec
from harness.subjects.mx_build import parse_server_versions
from harness.subjects.releases import Resolved, resolve_client, resolve_server

CARGO_INFO = """modelexpress-server #llm #inference #nvidia
High-performance gRPC server for model serving and management
version: 0.8.0-nightly.20261102.g234497f
license: Apache-2.0
"""
PIP_INDEX = """modelexpress (0.8.0.dev20261026)
Available versions: 0.8.0.dev20261026, 0.8.0.dev20261025, 0.8.0.dev20261015, 0.7.0, 0.6.0, 0.5.1
"""


def answering(rc: int, out: str, err: str = "") -> Any:
    asked: list[list[str]] = []

    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, rc, out, err)

    run.asked = asked  # type: ignore[attr-defined]
    return run


def test_the_server_nightly_is_the_crates_newest_version() -> None:
    run = answering(0, CARGO_INFO)
    r = resolve_server(run)
    assert r == Resolved("--mx-server", "latest-nightly", "0.8.0-nightly.20261102.g234497f", "cargo info modelexpress-server")
    assert run.asked == [["cargo", "info", "modelexpress-server"]]


@pytest.mark.parametrize(("rc", "out", "err", "why"), [
    (0, CARGO_INFO.replace("0.8.0-nightly.20261102.g234497f", "0.8.0"), "", "the newest modelexpress-server is 0.8.0, not a nightly"),
    (101, "", "error: failed to get a 200 OK response, got 404", "exit 101: error: failed to get a 200 OK response"),
    (0, "nothing useful", "", "the registry did not answer cargo info modelexpress-server"),
])
def test_a_server_nightly_that_does_not_resolve_says_why(rc: int, out: str, err: str, why: str) -> None:
    r = resolve_server(answering(rc, out, err))
    assert r.version is None and r.error is not None and why in r.error


def test_the_client_nightly_is_the_newest_pre_release_not_the_first_listed() -> None:
    shuffled = PIP_INDEX.replace("0.8.0.dev20261026, 0.8.0.dev20261025", "0.8.0.dev20261025, 0.8.0.dev20261026")
    run = answering(0, shuffled)
    r = resolve_client(run, python="py")
    assert r.version == "0.8.0.dev20261026" and r.error is None
    assert run.asked[0][:6] == ["py", "-m", "pip", "index", "versions", "--pre"]
    stable = resolve_client(answering(0, "Available versions: 0.7.0, 0.6.0\n"), python="py")
    assert stable.version is None and "has no pre-release" in str(stable.error)
    dead = resolve_client(answering(1, "", "ERROR: No matching distribution found for modelexpress"), python="py")
    assert dead.version is None and "No matching distribution" in str(dead.error)


def test_latest_nightly_is_replaced_on_both_axes_and_recorded() -> None:
    logs: list[str] = []
    servers, subjects, resolved = resolve_latest(
        ["mxref", "0.7.0", "latest-nightly"], ["mxref", "modelexpress@latest-nightly"], logs.append,
        server=lambda: resolve_server(answering(0, CARGO_INFO)), client=lambda: resolve_client(answering(0, PIP_INDEX)))
    assert servers == ["mxref", "0.7.0", "0.8.0-nightly.20261102.g234497f"]
    assert subjects == ["mxref", "modelexpress@0.8.0.dev20261026"]
    assert [(r.axis, r.spelling, r.version) for r in resolved] == [
        ("--mx-server", "latest-nightly", "0.8.0-nightly.20261102.g234497f"),
        ("--subject", "latest-nightly", "0.8.0.dev20261026")]
    assert any("0.8.0-nightly.20261102.g234497f (cargo info modelexpress-server)" in line for line in logs)
    # nothing spelled latest: the registry is not asked
    untouched = resolve_latest(["0.7.0"], ["modelexpress"], logs.append, server=lambda: pytest.fail("asked"),
                               client=lambda: pytest.fail("asked"))
    assert untouched == (["0.7.0"], ["modelexpress"], [])


def test_an_unresolved_spelling_stays_and_is_not_installable_without_a_build() -> None:
    failed = Resolved("--mx-server", "latest-nightly", None, "cargo info modelexpress-server", "the registry did not answer")
    servers, _, resolved = resolve_latest(["latest-nightly"], [], lambda _m: None, server=lambda: failed)
    assert servers == ["latest-nightly"]
    errors = prepare_servers(servers, lambda _m: None, resolved, runner=lambda *a, **k: pytest.fail("built"))
    assert errors == {"latest-nightly": "the registry did not answer"}


def test_latest_nightly_is_a_server_axis_spelling() -> None:
    assert parse_server_versions("mxref,latest-nightly") == ["mxref", "latest-nightly"]
    with pytest.raises(ValueError, match="latest-nightly"):
        parse_server_versions("latest")


def test_a_client_release_is_its_own_env_and_its_subject_spelling() -> None:
    assert mx_server.parse_subjects("modelexpress@0.8.0.dev20261026") == {
        "client": "modelexpress", "client_version": "0.8.0.dev20261026"}
    assert mx_server.parse_subjects("server=modelexpress,client=modelexpress@0.8.0.dev20261026")[
        "client_version"] == "0.8.0.dev20261026"
    for bad, why in (("mxref@1.0", "only modelexpress has versions"), ("modelexpress@latest", "not a package version"),
                     ("server=modelexpress@0.8.0", "a client version (@V) is for client")):
        with pytest.raises(ValueError, match=re.escape(why)):
            mx_server.parse_subjects(bad)
    pinned, nightly = subject_spec("modelexpress"), subject_spec("modelexpress", "0.8.0.dev20261026")
    assert pinned.version == "0.7.0" and nightly.requirements == ("modelexpress[metrics]==0.8.0.dev20261026",)
    assert subject_env_dir(nightly).name == "subject-modelexpress-0.8.0.dev20261026" != subject_env_dir(pinned).name
    assert subject_spec("mxref", "9.9") == subject_spec("mxref")


def test_the_client_version_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CLIENT_VERSION, "0.8.0.dev20261026")
    assert subject_spec("modelexpress").version == "0.8.0.dev20261026"


def test_a_client_release_that_does_not_install_is_a_not_installable_column(tmp_path: Path) -> None:
    ensured: list[str] = []

    def ensure(version: str) -> str | None:
        ensured.append(version)
        return "subject: ERROR: No matching distribution found for modelexpress==0.8.0.dev20261026"

    unplayable = prepare_clients(["mxref", "modelexpress@0.8.0.dev20261026"], lambda _m: None, ensure=ensure)
    assert ensured == ["0.8.0.dev20261026"]
    calls: list[list[str]] = []

    def execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        argv = list(argv)
        calls.append(argv)
        if "mxref.bench.raw" in argv or argv[3:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--repeat N]"
        out = Path(argv[argv.index("--out") + 1])
        folder = out / "smoke" / "run0"
        folder.mkdir(parents=True)
        (folder / "verdict.json").write_text(json.dumps({"scenario": "smoke", "verdict": "pass"}))
        (folder / "timeline.jsonl").write_text("")
        run = {"verdict": "pass", "run_dir": str(folder), "seed": 0, "seconds": 1.0}
        (out / "summary.json").write_text(json.dumps({"repeat": 1, "scenarios": {"smoke": {
            "cell": "PASS", "rate": {"k": 0, "n": 1}, "runs": [run]}}}))
        return 0, ""

    spec = MatrixSpec(scenarios=[tmp_path / "smoke.yaml"], names=["smoke"], defects={},
                      columns=columns_for([], [], ["mxref", "modelexpress@0.8.0.dev20261026"], []), out=tmp_path / "out",
                      raw_read=False, unplayable={k: v for k, v in unplayable.items() if v},
                      extra={"resolved": [{"axis": "--subject", "spelling": "latest-nightly",
                                           "version": "0.8.0.dev20261026", "registry": "pip", "error": None}]})
    matrix = run_matrix(spec, execute=execute, ensure=lambda v: pytest.fail(f"built an env for {v!r}")).to_json()
    ran = [argv[argv.index("--subject") + 1] for argv in calls if "--out" in argv]
    assert ran == ["mxref"]  # the uninstallable release's column ran nothing
    cell = matrix["cells"]["smoke"]["subject-modelexpress@0.8.0.dev20261026"]
    assert cell["verdict"] == "not_installable" and "No matching distribution" in cell["error"]
    column = matrix["columns"][1]
    assert column["available"] is False and column["resolved_from"] == {"spelling": "latest-nightly",
                                                                        "version": "0.8.0.dev20261026"}
    assert matrix["resolved"][0]["version"] == "0.8.0.dev20261026"
    assert matrix["cells"]["smoke"]["subject-mxref"]["verdict"] == "PASS"
