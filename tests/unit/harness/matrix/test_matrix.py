"""``mxchaos matrix`` logic with fakes: columns and env axes, the env cache, reading a column
folder (summary.json or bare run folders), known defects per version, the baseline diff, and
a whole matrix (json + html) from a fake executor that writes what ``mxchaos run --repeat``
would. Nothing here installs a package or starts NIXL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.matrix.defects import defect_info, defect_status, version_matches
from harness.matrix.run import MatrixSpec, run_matrix
from harness.record.baseline import diff_matrices, where, wilson
from harness.record.cells import (
    Column,
    RunTimings,
    cell_verdict,
    columns_for,
    parse_env_axis,
    read_column,
    run_timings,
)
from harness.record.saved import KnownDefect, MatrixColumn, MatrixDoc
from harness.reports.matrix_page import render_matrix
from harness.subjects.nixl_envs import EnvResult, ensure_env, error_line

# ------------------------------------------------------------------ columns


def test_columns_are_versions_times_every_env_combination() -> None:
    axes = [parse_env_axis("UCX_RNDV_PIPELINE_ERROR_HANDLING=y,n"), parse_env_axis("A=1")]
    cols = columns_for(["1.4.1", "1.5.1"], axes)
    assert [c.id for c in cols] == [
        "nixl-1.4.1+UCX_RNDV_PIPELINE_ERROR_HANDLING=y+A=1",
        "nixl-1.4.1+UCX_RNDV_PIPELINE_ERROR_HANDLING=n+A=1",
        "nixl-1.5.1+UCX_RNDV_PIPELINE_ERROR_HANDLING=y+A=1",
        "nixl-1.5.1+UCX_RNDV_PIPELINE_ERROR_HANDLING=n+A=1",
    ]
    assert cols[1].env_dict() == {"UCX_RNDV_PIPELINE_ERROR_HANDLING": "n", "A": "1"}
    assert [c.id for c in columns_for(["1.3.2"], [])] == ["nixl-1.3.2"]


@pytest.mark.parametrize("text", ["NOEQUALS", "1BAD=y", "K=", "K=y,,n", "K=y,y"])
def test_a_malformed_env_axis_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--env"):
        parse_env_axis(text)


def test_the_cell_verdict_is_the_worst_run() -> None:
    assert cell_verdict(["pass", "fail", "pass"]) == "fail"
    assert cell_verdict(["xpass", "xfail"]) == "xfail"
    assert cell_verdict(["skip", "pass"]) == "pass"
    assert cell_verdict([]) == "none"


# ------------------------------------------------------------------ envs


class FakePip:
    """Records the steps; ``venv`` makes ``bin/python``; ``fail`` names a step that fails."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("")
        if "wheel" in argv and "--wheel-dir" in argv:  # the native extension's build: a wheel appears
            (Path(argv[argv.index("--wheel-dir") + 1]) / "mxref_native-0.1.0-cp311-abi3-linux_x86_64.whl").write_text("")
        if self.fail and any(self.fail in a for a in argv):
            return subprocess.CompletedProcess(argv, 1, "", "Looking in indexes\nERROR: Could not find a version\n"
                                               "ERROR: No matching distribution found for nixl-cu12==9.9.9\n")
        return subprocess.CompletedProcess(argv, 0, "", "")


def _repo(tmp_path: Path, deps: str = "numpy") -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "pyproject.toml").write_text(f"[project]\nname='x'\ndependencies=['{deps}']\n")
    return repo


def test_an_env_is_built_once_and_reused_until_its_inputs_change(tmp_path: Path) -> None:
    repo, root = _repo(tmp_path), tmp_path / "cache"
    pip = FakePip()
    first = ensure_env("1.5.1", repo, root=root, run=pip)
    assert first.ok and not first.cached and first.path == root / "envs" / "nixl-1.5.1"
    installs = [" ".join(c) for c in pip.calls]
    assert any("--no-deps nixl-cu12==1.5.1 nixl==1.5.1" in c for c in installs)
    assert any(c.endswith("--disable-pip-version-check numpy") for c in installs)  # the project's dependencies
    assert not any(" -e " in c for c in installs)  # not the project: runs put their checkout on PYTHONPATH
    assert first.repo == repo.resolve() and first.run_env() == {"PYTHONPATH": str(repo.resolve())}
    assert first.mxchaos() == [str(first.python), "-m", "harness.cli"]
    assert pip.calls[-5][-2:] == ["harness.subjects.nixl_loader", "1.5.1"]  # torch, if the release's loader needs it
    assert pip.calls[-4][-2:] == ["-c", "import nixl._api"]
    # then the checkout's native extension (the default server): a wheel built once, installed, imported
    assert "wheel" in pip.calls[-3] and pip.calls[-3][-1].endswith("mxref/native")
    assert pip.calls[-2][:3] == [str(first.python), "-m", "pip"] and pip.calls[-2][-1].endswith("abi3-linux_x86_64.whl")
    assert pip.calls[-1][-2:] == ["-c", "import mxref_native"]
    n = len(pip.calls)
    again = ensure_env("1.5.1", repo, root=root, run=pip)
    assert again.ok and again.cached and len(pip.calls) == n
    clone = tmp_path / "clone"
    shutil.copytree(repo, clone)
    other = ensure_env("1.5.1", clone, root=root, run=pip)  # another checkout, the same dependencies: shared
    assert other.cached and len(pip.calls) == n and other.run_env() == {"PYTHONPATH": str(clone.resolve())}
    _repo(tmp_path, deps="numpy>=2")  # the project's dependencies changed: rebuild
    third = ensure_env("1.5.1", repo, root=root, run=pip)
    assert third.ok and not third.cached and len(pip.calls) == 2 * n - 1  # the cached native wheel: not built again


def _native_source(repo: Path, body: str = "fn main() {}") -> None:
    src = repo / "mxref" / "native"
    (src / "src").mkdir(parents=True, exist_ok=True)
    (src / "Cargo.toml").write_text("[package]\nname='mxref-native'\n")
    (src / "src" / "lib.rs").write_text(body)


def test_the_native_extension_is_built_once_per_source_and_reinstalled_when_it_changes(tmp_path: Path) -> None:
    from harness.subjects.native import find_wheel, installed_hash, source_hash

    repo, root, pip = _repo(tmp_path), tmp_path / "cache", FakePip()
    _native_source(repo)
    first = ensure_env("1.5.1", repo, root=root, run=pip)
    assert first.ok and installed_hash(first.path) == source_hash(repo)
    assert find_wheel(source_hash(repo), root) is not None  # <cache>/wheels/mxref_native-<hash>/
    ensure_env("1.4.1", repo, root=root, run=pip)  # a second env: the same wheel, no second build
    assert sum("--wheel-dir" in c for c in pip.calls) == 1
    n = len(pip.calls)
    assert ensure_env("1.5.1", repo, root=root, run=pip).cached and len(pip.calls) == n  # nothing to do
    _native_source(repo, "fn main() { changed(); }")  # the Rust source changed: a new wheel, reinstalled
    again = ensure_env("1.5.1", repo, root=root, run=pip)
    assert again.ok and again.cached  # the env itself is not rebuilt
    assert [c[-1] for c in pip.calls[n:]][-1] == "import mxref_native" and len(pip.calls) == n + 3
    assert installed_hash(again.path) == source_hash(repo)


def test_an_env_without_the_native_extension_is_broken_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, root = _repo(tmp_path), tmp_path / "cache"
    _native_source(repo)
    env = ensure_env("1.5.1", repo, root=root, run=FakePip(fail="--wheel-dir"))
    assert not env.ok and (env.error or "").startswith("native extension: building mxref_native failed")
    again = ensure_env("1.5.1", repo, root=root, run=FakePip())  # not remembered as failed: retried, and now in
    assert again.ok and again.cached
    monkeypatch.setattr("harness.subjects.native.cargo_path", lambda: None)
    _native_source(repo, "changed")
    env = ensure_env("1.5.1", repo, root=root, run=FakePip())
    assert not env.ok and "no cargo (Rust) to build mxref_native" in (env.error or "")


def test_the_loader_step_installs_nothing_when_nixl_imports_without_torch(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.subjects import nixl_loader

    assert nixl_loader.missing_module() is None  # this env's NIXL (1.5.x) needs no torch to load
    assert nixl_loader.main(["1.5.1"]) == 0
    assert "imports without extra packages" in capsys.readouterr().out
    assert nixl_loader.main([]) == 2


def test_a_version_that_cannot_be_installed_is_an_error_not_an_exception(tmp_path: Path) -> None:
    pip = FakePip(fail="nixl-cu12==9.9.9")
    env = ensure_env("9.9.9", _repo(tmp_path), root=tmp_path / "cache", run=pip)
    assert not env.ok
    assert env.error == "nixl: ERROR: No matching distribution found for nixl-cu12==9.9.9"
    assert not any("-e" in c for c in pip.calls)  # stopped at the failing step
    n = len(pip.calls)
    again = ensure_env("9.9.9", _repo(tmp_path), root=tmp_path / "cache", run=pip)
    assert again.error == env.error and again.cached and len(pip.calls) == n  # remembered, not retried
    ensure_env("9.9.9", _repo(tmp_path), root=tmp_path / "cache", run=pip, rebuild=True)
    assert len(pip.calls) == 2 * n
    assert error_line("a\n\nlast words\n") == "last words"


# ------------------------------------------------------------------ reading a column


def _timeline(gbps: Sequence[float], fault_t: float | None = None) -> str:
    entries: list[dict[str, Any]] = []
    if fault_t is not None:
        entries.append({"t": fault_t, "type": "invoke", "actor": "nemesis", "f": "inject", "value": {"fault": "cut"}})
        entries.append({"t": fault_t + 0.04, "type": "info", "actor": "reader-1", "f": "transfer_error", "value": {}})
        entries.append({"t": fault_t + 0.2, "type": "info", "actor": "reader-1", "f": "fallback", "value": {}})
    entries += [{"t": 20.0 + i, "type": "info", "actor": "reader-1", "f": "transfer_done", "value": {"gbps": g}}
                for i, g in enumerate(gbps)]
    if fault_t is not None:
        entries.append({"t": 30.0, "type": "info", "actor": "reader-1", "f": "load_done", "value": {}})
    return "\n".join(json.dumps({"index": i, **e}) for i, e in enumerate(entries)) + "\n"


def write_run(folder: Path, scenario: str, verdict: str, *, nixl: str = "1.5.1", ucx: str = "1.23.0",
              gbps: Sequence[float] = (1.0,), fault_t: float | None = None, seconds: float = 5.0) -> dict[str, Any]:
    """A run folder as ``mxchaos run`` leaves it (the files the matrix reads)."""
    folder.mkdir(parents=True)
    (folder / "verdict.json").write_text(json.dumps({"scenario": scenario, "verdict": verdict, "seed": 1,
                                                     "seconds": seconds}))
    (folder / "versions.json").write_text(json.dumps({"nixl": f"{nixl} (nixl)", "ucx": f"{ucx} (libucp.so.0)"}))
    (folder / "timeline.jsonl").write_text(_timeline(gbps, fault_t))
    return {"verdict": verdict, "run_dir": str(folder), "seed": 1, "seconds": seconds}


def test_timings_come_from_the_timeline(tmp_path: Path) -> None:
    write_run(tmp_path / "r", "s", "pass", gbps=(1.0, 3.0), fault_t=10.0)
    t = run_timings(tmp_path / "r")
    assert t == RunTimings(detection_s=0.04, recovery_s=20.0, fallback_s=0.2, gbps=[1.0, 3.0])


def test_a_column_is_read_from_summary_json(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / "a" / str(i), "a", v, gbps=(g,), seconds=s)
            for i, (v, g, s) in enumerate([("pass", 2.0, 4.0), ("fail", 4.0, 6.0), ("pass", 3.0, 5.0)])]
    summary = {"repeat": 3, "scenarios": {"a": {"cell": "fail", "rate": {"k": 2, "n": 3}, "bound": 0.5,
                                                "measured": None, "runs": runs}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    col = read_column(tmp_path, ["a", "missing"], raw_gbps=6.0)
    a = col.cells["a"].to_json()
    assert a["verdict"] == "fail" and a["rate"] == {"k": 2, "n": 3} and a["bound"] == 0.5
    assert a["failures"] == {"k": 1, "n": 3} and a["verdicts"] == {"fail": 1, "pass": 2}
    assert a["seconds"] == 5.0 and a["read_gbps"] == 3.0 and a["read_ratio"] == 0.5
    assert a["nixl"] == ["1.5.1"] and a["ucx"] == ["1.23.0"]
    assert col.cells["missing"].verdict == "none" and col.cells["missing"].failures == {"k": 0, "n": 0}
    assert col.nixl == ["1.5.1"] and col.ucx == ["1.23.0"]


def test_without_summary_json_the_run_folders_are_read(tmp_path: Path) -> None:
    write_run(tmp_path / "a" / "20260101T000000-1", "a", "xfail", nixl="1.4.1", ucx="1.22.0")
    write_run(tmp_path / "a" / "20260101T000001-2", "a", "xpass", nixl="1.4.1", ucx="1.22.0")
    (tmp_path / "a" / "latest").symlink_to(tmp_path / "a" / "20260101T000001-2")
    cell = read_column(tmp_path, ["a"]).cells["a"].to_json()
    assert cell["verdict"] == "xfail" and cell["verdicts"] == {"xfail": 1, "xpass": 1} and len(cell["runs"]) == 2
    assert cell["rate"] is None and cell["read_ratio"] is None and cell["ucx"] == ["1.22.0"]


# ------------------------------------------------------------------ known defects per version


def test_defect_versions_come_from_the_validated_scenario(tmp_path: Path) -> None:
    from harness.scenario import load_scenario

    f = tmp_path / "s.yaml"
    body = "name: s\nprocesses: {c: {role: command, argv: ['true']}}\nsteps: [{start: c}]\n"
    f.write_text(body + "known_defect: >-\n  aborts the\n  source\ndefect_versions: ['1.5.1', '1.4']\n")
    info = defect_info(load_scenario(f))
    assert info is not None
    assert info.to_json() == {"text": "aborts the source", "versions": ["1.5.1", "1.4"], "servers": None, "subjects": None}
    f.write_text(body + "known_defect: aborts\n")
    info = defect_info(load_scenario(f))
    assert info is not None and info.to_json() == {"text": "aborts", "versions": None, "servers": None, "subjects": None}
    f.write_text(body)
    assert defect_info(load_scenario(f)) is None


def test_version_matching_is_exact_or_a_prefix_at_a_dot() -> None:
    assert version_matches("1.4.1", ["1.4"]) and version_matches("1.5.1", ["1.5.1"])
    assert not version_matches("1.5.10", ["1.5.1"]) and not version_matches("1.3.2", ["1.4", "1.5.1"])


def test_expected_vs_observed_and_the_headlines() -> None:
    listed = KnownDefect(text="t", versions=["1.5.1"])
    fixed = defect_status(listed, "1.5.1", {"xpass": 3})
    assert fixed.expected and fixed.observed == "not reproduced" and "fixed" in (fixed.headline or "")
    back = defect_status(listed, "1.4.1", {"xfail": 1, "xpass": 2})
    assert not back.expected and back.observed == "reproduced" and "brought back" in (back.headline or "")
    assert back.reproduced == {"k": 1, "n": 3}
    assert defect_status(listed, "1.5.1", {"xfail": 2}).headline is None
    assert defect_status(listed, "1.4.1", {"xpass": 2}).headline is None
    assert defect_status(listed, "1.5.1", {"error": 2}).observed == "inconclusive"
    everywhere = KnownDefect(text="t", versions=None)
    assert defect_status(everywhere, "1.3.2", {"xfail": 1}).expected is True


# ------------------------------------------------------------------ baseline


def _m(cells: dict[str, dict[str, Any]], cols: Sequence[str] = ("nixl-1.5.1",)) -> MatrixDoc:
    return MatrixDoc.parse({"columns": [{"id": c} for c in cols], "cells": cells}, "given")


def test_wilson_interval() -> None:
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.27 < hi < 0.28
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_baseline_diff_reports_flips_rate_moves_and_timings() -> None:
    old = _m({
        "flip": {"nixl-1.5.1": {"verdict": "pass", "failures": {"k": 0, "n": 2}}},
        "rate": {"nixl-1.5.1": {"verdict": "fail", "failures": {"k": 0, "n": 10}}},
        "noisy": {"nixl-1.5.1": {"verdict": "fail", "failures": {"k": 0, "n": 2}}},
        "slow": {"nixl-1.5.1": {"verdict": "pass", "read_gbps": 2.0, "recovery_s": 2.0, "seconds": 10.0}},
        "same": {"nixl-1.5.1": {"verdict": "pass", "read_gbps": 2.0, "failures": {"k": 1, "n": 4}}},
    })
    new = _m({
        "flip": {"nixl-1.5.1": {"verdict": "fail", "failures": {"k": 1, "n": 2}}},
        "rate": {"nixl-1.5.1": {"verdict": "fail", "failures": {"k": 6, "n": 10}}},
        "noisy": {"nixl-1.5.1": {"verdict": "fail", "failures": {"k": 2, "n": 2}}},
        "slow": {"nixl-1.5.1": {"verdict": "pass", "read_gbps": 1.5, "recovery_s": 3.0, "seconds": 10.4}},
        "same": {"nixl-1.5.1": {"verdict": "pass", "read_gbps": 1.9, "failures": {"k": 2, "n": 4}}},
        "new_row": {"nixl-1.5.1": {"verdict": "pass"}},
    }, cols=("nixl-1.5.1", "nixl-1.6.0"))
    changes = diff_matrices(old, new, drop=0.2)
    got = {(c.scenario, c.kind, c.metric) for c in changes}
    assert got == {
        ("flip", "verdict", None),
        ("rate", "rate", None),
        ("slow", "timing", "read_gbps"),
        ("slow", "timing", "recovery_s"),
        (None, "column", None),
    }
    assert all(c.regression for c in changes if c.kind != "column")
    better = diff_matrices(new, old)
    flips = [c for c in better if c.kind == "verdict"]
    assert flips and not flips[0].regression


def test_the_cells_of_repeat_runs_are_ranked_too() -> None:
    old = _m({"s": {"nixl-1.5.1": {"verdict": "PASS"}}, "d": {"nixl-1.5.1": {"verdict": "REPRODUCED"}}})
    new = _m({"s": {"nixl-1.5.1": {"verdict": "FLAKY"}}, "d": {"nixl-1.5.1": {"verdict": "FIXED?"}}})
    flips = {c.scenario: c.regression for c in diff_matrices(old, new)}
    assert flips == {"s": True, "d": False}
    assert cell_verdict(["PASS", "FLAKY"]) == "flaky"


def test_the_ratio_is_compared_when_both_cells_have_one() -> None:
    old = _m({"s": {"nixl-1.5.1": {"verdict": "pass", "read_gbps": 1.0, "read_ratio": 0.9}}})
    new = _m({"s": {"nixl-1.5.1": {"verdict": "pass", "read_gbps": 1.0, "read_ratio": 0.5}}})
    (change,) = diff_matrices(old, new)
    assert change.metric == "read_ratio" and change.old == 0.9


def test_timings_are_compared_only_between_runs_beside_as_many_lanes() -> None:
    """A scenario that shared the machine with three other lanes reads slower than one that
    shared it with one: that is the schedule, not the release. Its verdict is still compared."""
    slow = {"verdict": "fail", "read_gbps": 1.0, "seconds": 20.0}
    fast = {"verdict": "pass", "read_gbps": 2.0, "seconds": 10.0}
    cells = {"laned": fast, "lone": fast, "moved": fast}
    old = {"columns": [{"id": "c", "schedule": {"lanes": [["laned"], ["moved"]], "alone": ["lone"]}}],
           "cells": {name: {"c": cell} for name, cell in cells.items()}}
    new = {"columns": [{"id": "c", "schedule": {"lanes": [["laned"], ["x"], ["y"], ["z"]], "alone": ["lone", "moved"]}}],
           "cells": {name: {"c": slow} for name in cells}}
    changes = diff_matrices(MatrixDoc.parse(old, "old"), MatrixDoc.parse(new, "new"))
    timed = {c.scenario for c in changes if c.kind == "timing"}
    assert timed == {"lone"}  # alone in both: compared; laned (2 -> 4 lanes) and moved (lane -> alone) not
    assert {c.scenario for c in changes if c.kind == "verdict"} == {"laned", "lone", "moved"}
    (note,) = [c for c in changes if c.kind == "schedule"]
    assert note.regression is False and note.scenarios == ["laned", "moved"]
    assert note.text == ("timings of 2 scenario(s) not compared: they ran beside a different number of lanes at "
                            "once (1 here, 2 in the baseline; 4 here, 2 in the baseline)")
    assert MatrixColumn(id="c").lanes_beside("laned") == 1  # a column from before lanes
    assert where(note) == "column c" and where(changes[0]) == f"{changes[0].scenario} @ c"
    page = render_matrix(MatrixDoc.parse({"columns": [{"id": "c", "label": "c"}], "cells": {}, "baseline_changes": changes}, "given"))
    assert "<li>column c: timings of 2 scenario(s)" in page and "> @ c" not in page
    assert MatrixColumn(id="c", schedule={"lanes": [["a", "b"]], "alone": []}).lanes_beside("a") == 1  # one lane: one at a time


# ------------------------------------------------------------------ a whole matrix


class FakeExecute:
    """What the env's tools would do: the raw bench prints its JSON line; ``run --repeat``
    writes run folders and summary.json with the verdicts given per (column env, scenario)."""

    def __init__(self, verdicts: Mapping[tuple[str, str], Sequence[str]], nixl_of: Mapping[str, str]) -> None:
        self.verdicts, self.nixl_of = verdicts, nixl_of
        self.calls: list[tuple[list[str], dict[str, str], float]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        argv = list(argv)
        self.calls.append((argv, dict(env), timeout))
        if "mxref.bench.raw" in argv:  # 2 GB/s at 32 MiB; 0.25 at 4 MiB
            gbps = int(argv[argv.index("--bytes") + 1]) / (16 << 20)
            return 0, f'nixl log line\n{{"raw_read": {{"bytes": 1, "gbps": [{gbps}], "median_gbps": {gbps}}}}}\n'
        if argv[3:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--repeat N]"
        out = Path(argv[argv.index("--out") + 1])
        n = int(argv[argv.index("--repeat") + 1])
        nixl = self.nixl_of[argv[0]]
        ab = env.get("AB", "")
        scenarios: dict[str, Any] = {}
        for path in argv[argv.index("-q") + 1:]:
            name = Path(path).stem
            runs = [write_run(out / name / f"run{i}", name, v, nixl=nixl, gbps=(1.0,))
                    for i, v in enumerate(self.verdicts[(ab, name)][:n])]
            verdicts = [r["verdict"] for r in runs]  # the cells of harness.record.rates, as summary.json gives them
            cell = ("XFAIL" if "xfail" in verdicts else "XPASS") if name == "reset" else "PASS"
            scenarios[name] = {"cell": cell, "rate": {"k": 0, "n": n},
                               "bound": None, "measured": None, "runs": runs}
        (out / "summary.json").write_text(json.dumps({"repeat": n, "scenarios": scenarios}))
        return 0, "ok"


def test_a_whole_matrix_with_an_uninstallable_version(tmp_path: Path) -> None:
    scen = tmp_path / "scen"
    scen.mkdir()
    smoke, defect = scen / "smoke.yaml", scen / "reset.yaml"
    envs = {v: EnvResult(v, tmp_path / f"env-{v}") for v in ("1.4.1", "1.5.1")}
    envs["1.5.2"] = EnvResult("1.5.2", tmp_path / "env-1.5.2", error="nixl: ERROR: No matching distribution found")
    fake = FakeExecute(
        {("y", "smoke"): ["pass", "pass"], ("n", "smoke"): ["pass", "pass"],
         ("y", "reset"): ["xpass", "xpass"], ("n", "reset"): ["xfail", "xpass"]},
        {str(e.python): v for v, e in envs.items()},
    )
    spec = MatrixSpec(
        scenarios=[smoke, defect], names=["smoke", "reset"],
        defects={"reset": KnownDefect(text="aborts the source", versions=["1.5.1"])},
        columns=columns_for(["1.4.1", "1.5.1", "1.5.2"], [("AB", ["y", "n"])]), repeat=2, out=tmp_path / "out",
        read_bytes={"smoke": 4 << 20, "reset": 32 << 20},
    )
    matrix = run_matrix(spec, ensure=lambda v: envs[v], execute=fake).to_json()
    assert json.loads((tmp_path / "out" / "matrix.json").read_text()) == matrix
    ids = [c["id"] for c in matrix["columns"]]
    assert ids == [f"nixl-{v}+AB={ab}" for v in ("1.4.1", "1.5.1", "1.5.2") for ab in ("y", "n")]
    cols = {c["id"]: c for c in matrix["columns"]}
    assert cols["nixl-1.5.1+AB=n"]["loaded_nixl"] == ["1.5.1"] and cols["nixl-1.5.1+AB=n"]["raw_read_gbps"] == 2.0
    assert not cols["nixl-1.5.2+AB=y"]["available"]
    gone = matrix["cells"]["smoke"]["nixl-1.5.2+AB=y"]
    assert gone["verdict"] == "not_installable" and gone["error"].startswith("not installable: nixl: ")
    assert "No matching distribution" in gone["error"] and not gone["runs"]
    assert cols["nixl-1.5.2+AB=y"]["error"] == gone["error"]
    cell = matrix["cells"]["reset"]["nixl-1.5.1+AB=n"]
    assert cell["verdict"] == "XFAIL" and cell["read_ratio"] == 0.5 and cell["runs"][0]["link"].startswith("nixl-1.5.1+AB=n/")
    # each cell's READ over a raw READ of its own model's size, measured once per size and column env
    assert cols["nixl-1.5.1+AB=n"]["raw_reads"] == {str(4 << 20): 0.25, str(32 << 20): 2.0}
    assert matrix["cells"]["smoke"]["nixl-1.5.1+AB=n"]["read_ratio"] == 4.0
    heads = {(h["scenario"], h["column"]) for h in matrix["headlines"]}
    # expected on 1.5.1, not reproduced with AB=y; reproduced on 1.4.1 with AB=n where it is not listed
    assert heads == {("reset", "nixl-1.5.1+AB=y"), ("reset", "nixl-1.4.1+AB=n")}
    run_calls = [c for c in fake.calls if c[0][3:5] == ["run", "--repeat"]]
    assert len(run_calls) == 4 and {c[1]["AB"] for c in run_calls} == {"y", "n"}
    page = (tmp_path / "out" / "matrix.html").read_text()
    assert "fixed in this release?" in page and "brought back" in page
    assert "not installable: nixl: ERROR: No matching distribution found" in page
    from harness.matrix.command import format_table
    from harness.record.cells import FAILING

    table = format_table(MatrixDoc.parse(matrix, "given"))  # the terminal: the column's (loaded) row says why, its cells say what
    assert "not installable: nixl: ERROR: No matching distribution found" in table and "NOT INSTALLABLE" in table
    assert "not_installable" not in FAILING  # an environment verdict: `mxchaos matrix` does not exit 1 for it
    assert 'href="nixl-1.5.1+AB=n/reset/run0/report.html"' in page

    # the same matrix again, with the first as its baseline: nothing changed
    spec.baseline, spec.out = MatrixDoc.parse(matrix, "first"), tmp_path / "out2"
    assert run_matrix(spec, ensure=lambda v: envs[v], execute=fake).baseline_changes == []

    # resumed into the first folder, one column's runs cut short: only that column runs again
    summary = tmp_path / "out" / "nixl-1.4.1+AB=y" / "summary.json"
    cut = json.loads(summary.read_text())
    cut["scenarios"]["reset"]["runs"] = cut["scenarios"]["reset"]["runs"][:1]
    summary.write_text(json.dumps(cut))
    fake.calls.clear()
    spec.baseline, spec.out, spec.resume = None, tmp_path / "out", True
    resumed = run_matrix(spec, ensure=lambda v: envs[v], execute=fake).to_json()
    run_calls = [c for c in fake.calls if c[0][3:5] == ["run", "--repeat"]]
    assert [c[1]["AB"] for c in run_calls] == ["y"] and run_calls[0][0][:3] == envs["1.4.1"].mxchaos()
    assert any("mxref.bench.raw" in c[0] for c in fake.calls)  # raw READs are measured anew
    assert resumed["cells"] == matrix["cells"]
    assert (tmp_path / "out" / "nixl-1.4.1+AB=y.interrupted" / "smoke" / "run0").is_dir()  # set aside, not lost
    assert [c.get("resumed", False) for c in resumed["columns"] if c["available"]] == [False, True, True, True]


def test_without_repeat_support_the_env_runs_n_times(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        calls.append(list(argv))
        if argv[3:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--seed SEED]"
        out = Path(argv[argv.index("--out") + 1])
        write_run(out / "smoke" / f"run{len(calls)}", "smoke", "pass")
        return 0, ""

    env = EnvResult("1.5.1", tmp_path / "env")
    spec = MatrixSpec(scenarios=[tmp_path / "smoke.yaml"], names=["smoke"], defects={},
                      columns=[Column("1.5.1")], repeat=3, out=tmp_path / "out", raw_read=False)
    matrix = run_matrix(spec, ensure=lambda v: env, execute=execute).to_json()
    assert sum(1 for c in calls if "--out" in c) == 3
    assert matrix["cells"]["smoke"]["nixl-1.5.1"]["verdicts"] == {"pass": 3}


@pytest.mark.parametrize("argv", [
    ["matrix", "--nixl", "1.5.1", "--env", "BAD", "scenarios/smoke.yaml"],
    ["matrix", "--nixl", "1.5.1,1.5.1", "scenarios/smoke.yaml"],
    ["matrix", "--nixl", "1.5.1", "--repeat", "0", "scenarios/smoke.yaml"],
    ["matrix", "--nixl", "1.5.1", "no/such/file.yaml"],
])
def test_invalid_matrix_options_exit_2_before_building_anything(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err


def test_a_cell_is_held_to_a_raw_read_of_its_own_model_size(tmp_path: Path) -> None:
    from harness.matrix.command import read_bytes
    from harness.scenario import load_scenario

    f = tmp_path / "s.yaml"
    f.write_text("name: s\nmodel: {tensors: 4, tensor_mib: 8}\nprocesses:\n  server: {role: server}\n"
                 "  reader-1: {role: reader}\nsteps: [{start: server}, {start: reader-1}]\n")
    assert read_bytes(load_scenario(f)) == 32 << 20
    f.write_text("name: s\nprocesses: {c: {role: command, argv: ['true']}}\nsteps: [{start: c}]\n")
    assert read_bytes(load_scenario(f)) is None  # no reader: nothing to hold to a raw READ


def test_a_column_whose_every_run_died_of_its_environment_is_broken_not_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    gone = "metadata server: --grpc-impl native: mxref_native is not installed (No module named 'mxref_native')"

    def execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        if argv[3:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--repeat N]"
        out = Path(argv[argv.index("--out") + 1])
        nixl = "1.4.1" if "1.4.1" in argv[0] else "1.5.1"
        runs = []
        for i in range(2):
            run = write_run(out / "smoke" / f"run{i}", "smoke", "fail", nixl=nixl)
            if nixl == "1.4.1":  # the server died at its start, before any fault: its env lacks the extension
                (Path(run["run_dir"]) / "procs").mkdir()
                (Path(run["run_dir"]) / "procs" / "server.events.jsonl").write_text(
                    json.dumps({"event": "exit", "proc": "server", "code": 3, "error": gone}) + "\n")
            runs.append(run)
        (out / "summary.json").write_text(json.dumps({"repeat": 2, "scenarios": {
            "smoke": {"cell": "FAIL", "rate": {"k": 2, "n": 2}, "bound": None, "measured": None, "runs": runs}}}))
        return 1, ""

    envs = {v: EnvResult(v, tmp_path / f"env-{v}") for v in ("1.4.1", "1.5.1")}
    spec = MatrixSpec(scenarios=[tmp_path / "smoke.yaml"], names=["smoke"], defects={},
                      columns=columns_for(["1.4.1", "1.5.1"], []), repeat=2, out=tmp_path / "out", raw_read=False)
    matrix = run_matrix(spec, ensure=lambda v: envs[v], execute=execute).to_json()
    broken, failed = matrix["cells"]["smoke"]["nixl-1.4.1"], matrix["cells"]["smoke"]["nixl-1.5.1"]
    assert broken["verdict"] == "env_broken" and broken["error"] == f"environment broken: server: {gone}"
    assert failed["verdict"] == "FAIL"  # a failure with no environment words is NIXL's (or ours): a verdict
    from harness.matrix.command import format_table

    assert "environment broken: server: metadata server: --grpc-impl native" in format_table(MatrixDoc.parse(matrix, "given"))
    page = (tmp_path / "out" / "matrix.html").read_text()
    assert "environment broken: server:" in page


def test_the_matrix_ends_with_a_recap_of_the_cells_that_fail_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one recap writer of ``run`` and ``nightly`` (``write_recap``), an entry per failing cell:
    its runs' count, the first failing check of its first failing run (from that run's
    verdict.json) and the page of that run."""
    from harness.matrix.command import matrix_recap
    from harness.reports.console import write_recap

    run_dir = tmp_path / "c" / "a" / "2"
    run_dir.mkdir(parents=True)
    (run_dir / "verdict.json").write_text(json.dumps({"verdict": "fail", "checks": [
        {"name": "loaded", "valid": "unknown", "summary": "?"}, {"name": "rdma", "valid": False, "summary": "0 reads"}]}))
    runs = [{"verdict": "pass", "seed": 1, "link": "c/a/1"},
            {"verdict": "fail", "seed": 2, "link": "c/a/2", "run_dir": str(run_dir)}]
    matrix = {"cells": {"a": {"c": {"verdict": "FLAKY", "failures": {"k": 1, "n": 2}, "runs": runs}},
                        "b": {"c": {"verdict": "PASS", "failures": {"k": 0, "n": 2}, "runs": []}},
                        "d": {"c": {"verdict": "XFAIL", "failures": {"k": 2, "n": 2}, "runs": []}},
                        "e": {"c": {"verdict": "none", "error": "mxchaos run exited 2: bad", "failures": {"k": 0, "n": 0}}}}}
    entries = matrix_recap(MatrixDoc.parse(matrix, "given"), tmp_path)
    write_recap(sys.stdout, entries)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"{'short summary':-^72}"
    assert lines[2:] == [f"FLAKY  a @ c  failed 1/2  rdma: 0 reads  {tmp_path / 'c/a/2/report.html'}",
                         "NONE   e @ c  failed 0/0  mxchaos run exited 2: bad"]
    write_recap(sys.stdout, matrix_recap(MatrixDoc.parse({"cells": {"b": matrix["cells"]["b"]}}, "given"), tmp_path))
    assert capsys.readouterr().out == ""  # nothing failed: no recap


def test_a_failing_cell_s_rerun_is_a_matrix_of_that_one_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.matrix.command import matrix_recap, rerun_cell
    from harness.record.saved import MatrixColumn

    monkeypatch.chdir(tmp_path)
    served = Column("1.5.1", (("AB", "n"),), "mxref", "0.7.0")
    column = MatrixColumn(id=served.id, nixl="1.5.1", subject="mxref", mx_server="0.7.0", env=served.env_dict())
    assert rerun_cell(column, "scenarios/a b.yaml", 3, tmp_path / "out").split(" matrix ")[1] == (
        "--nixl 1.5.1 --subject mxref --mx-server 0.7.0 --env AB=n --repeat 3 --out out/rerun-1 'scenarios/a b.yaml'")
    assert rerun_cell(MatrixColumn(id="here"), "a.yaml", 1, tmp_path) == ""  # no axis: no matrix to rerun
    matrix = MatrixDoc.parse({"repeat": 2, "scenarios": [{"name": "a", "path": "a.yaml"}],
                              "columns": [column.to_json()], "cells": {"a": {served.id: {"verdict": "FAIL"}}}}, "given")
    (entry,) = matrix_recap(matrix, tmp_path)
    assert entry.rerun.endswith("--env AB=n --repeat 2 --out rerun-1 a.yaml") and entry.scenario == f"a @ {served.id}"


def test_a_rerun_s_own_rerun_is_its_sibling_not_nested_in_it(tmp_path: Path) -> None:
    from harness.matrix.command import rerun_cell, rerun_folder
    from harness.record.saved import MatrixColumn

    out = tmp_path / "out"
    first = rerun_folder(out)
    assert first == out / "rerun-1"
    assert rerun_folder(first) == out / "rerun-2" and rerun_folder(out / "rerun-2") == out / "rerun-3"
    assert rerun_folder(out / "rerun") == out / "rerun-1"  # an older matrix's OUT/rerun
    assert rerun_folder(tmp_path / "rerunner") == tmp_path / "rerunner" / "rerun-1"  # only the whole name counts
    column = MatrixColumn(id="nixl-1.5.1", nixl="1.5.1")
    line = rerun_cell(column, "a.yaml", 1, first)  # the command a rerun's recap prints
    assert f"--out {out / 'rerun-2'} " in line and "rerun-1/rerun" not in line


def test_the_matrix_speaks_in_i_of_n_lines_and_a_compact_table(capsys: pytest.CaptureFixture[str]) -> None:
    """As ``run`` and ``nightly``: a line as each column starts and one as it ends, with its cells
    and the tally so far; the table's timings and defects only under -v."""
    import io

    from harness.matrix.command import ColumnProgress, format_table

    a, b = Column("1.5.1"), Column("1.4.1")
    matrix = MatrixDoc.parse({
        "scenarios": [{"name": "smoke"}, {"name": "seg"}],
        "columns": [{"id": a.id, "available": True}, {"id": b.id, "available": False, "error": "not installable: no"}],
        "cells": {"smoke": {a.id: {"verdict": "PASS", "failures": {"k": 0, "n": 1}, "read_gbps": 0.3},
                            b.id: {"verdict": "not_installable"}},
                  "seg": {a.id: {"verdict": "XFAIL", "failures": {"k": 1, "n": 1},
                                 "defect": {"expected": True, "observed": "reproduced"}},
                          b.id: {"verdict": "not_installable"}}}}, "given")
    out = io.StringIO()
    progress = ColumnProgress(2, out)
    progress.started(1, a)
    progress.ended(1, a, matrix)
    progress.started(2, b)
    progress.ended(2, b, matrix)
    assert out.getvalue().splitlines() == [
        "[1/2] NIXL 1.5.1", "[1/2] nixl-1.5.1: 1 PASS 1 XFAIL  [1 PASS 1 XFAIL]",
        "[2/2] NIXL 1.4.1", "[2/2] nixl-1.4.1: 2 NOT_INSTALLABLE  not installable: no  [2 NOT_INSTALLABLE 1 PASS 1 XFAIL]"]
    compact, full = format_table(matrix, verbose=False), format_table(matrix)
    assert "seg       XFAIL 1/1 failed" in compact and "defect" not in compact and "GB/s" not in compact
    assert "[defect expected, reproduced]" in full and "0.3GB/s" in full


def test_a_cell_shows_the_defect_in_force_where_its_column_plays_it(tmp_path: Path) -> None:
    """``cell_defects`` (``harness.matrix.defects.column_defects``): a client's defect is annotated in
    the column that plays that client, even where the scenario as written has none in force."""
    scen = tmp_path / "scen"
    scen.mkdir()
    envs = {"1.5.1": EnvResult("1.5.1", tmp_path / "env-1.5.1")}
    fake = FakeExecute({("y", "reset"): ["xfail"], ("n", "reset"): ["pass"]},
                       {str(e.python): v for v, e in envs.items()})
    columns = columns_for(["1.5.1"], [("AB", ["y", "n"])])
    client = KnownDefect(text="the real client has no stall detection", versions=None, servers=None,
                         subjects=["modelexpress"])
    spec = MatrixSpec(scenarios=[scen / "reset.yaml"], names=["reset"], defects={"reset": client},
                      cell_defects={"reset": {columns[0].id: client}}, columns=columns, repeat=1,
                      out=tmp_path / "out", raw_read=False)
    matrix = run_matrix(spec, ensure=lambda v: envs[v], execute=fake).to_json()
    shown = matrix["cells"]["reset"][columns[0].id]
    assert shown["verdict"] == "XFAIL" and shown["defect"]["observed"] == "reproduced" and shown["defect"]["expected"]
    assert matrix["cells"]["reset"][columns[1].id].get("defect") is None  # not in force there: a plain cell
    assert matrix["scenarios"][0]["defect"]["text"] == client.text


def test_a_cached_env_links_this_checkouts_toxiproxy_again_when_its_link_dangles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link left to the checkout that built the env dangled once that checkout was removed: the
    env's scenarios with proxies SKIPped as "this machine lacks toxiproxy" (7 cells of a column)."""
    repo, root, pip = _repo(tmp_path), tmp_path / "cache", FakePip()
    built_by, now = tmp_path / "gone" / "bin", tmp_path / "here" / "bin"
    for folder in (built_by, now):
        folder.mkdir(parents=True)
        (folder / "toxiproxy-server").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "prefix", str(built_by.parent))
    env = ensure_env("1.5.1", repo, root=root, run=pip, native=False)
    link = env.path / "bin" / "toxiproxy-server"
    assert link.resolve() == (built_by / "toxiproxy-server").resolve()
    shutil.rmtree(built_by.parent)  # the checkout that built it is gone
    assert link.is_symlink() and not link.exists()
    monkeypatch.setattr(sys, "prefix", str(now.parent))
    again = ensure_env("1.5.1", repo, root=root, run=pip, native=False)
    assert again.cached and link.exists() and link.resolve() == (now / "toxiproxy-server").resolve()
