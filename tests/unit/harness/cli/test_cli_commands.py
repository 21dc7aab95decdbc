"""``mxchaos`` in-process: ``--version``, the exit codes in ``--help``, what ``list`` says this
machine would skip, ``validate``'s per-file lines and tally; the console's process exits and
the verdict tally."""

from __future__ import annotations

import io
import json
import platform
import re
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from harness import cli, exits
from harness.record.rates import Rate, RunRecord, cell_of
from harness.record.results import RESULTS_ENV
from harness.record.timeline import Entry
from harness.reports.console import Progress, rate_table, verdict_table
from harness.scenario import capabilities, select

FAKE = Path(__file__).resolve().parents[3] / "fixtures" / "fakeproc.py"

BODY = """\
name: {name}
launcher: ["{{python}}", "{fake}"]
processes:
  server: {{role: server}}
  source-1: {{role: source}}
steps:
  - start: [server, source-1]
{extra}  - await: {{process: source-1, event: heartbeat}}
"""
RESET = "  - fault: {kind: tcp_reset, target: source-1, peer: server, name: cut}\n"


def write(folder: Path, name: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(BODY.format(name=name, fake=FAKE, extra=extra))
    return path


def test_version_names_the_package_nixl_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"mxchaos {metadata.version('mxchaos')}, nixl {metadata.version('nixl')}, Python {platform.python_version()}\n"


def test_help_documents_every_exit_code_the_cli_returns(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("exit codes:") :]
    documented = {int(m) for m in re.findall(r"^  (\d+)  ", section, re.MULTILINE)}
    returned = {v for k, v in vars(exits).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert documented == returned == {0, 1, 2, 4, 130, 141}
    assert re.search(r"^  4\s+environment broken", section, re.MULTILINE)
    assert re.search(r"^  130  interrupted \(SIGINT / SIGTERM\)", section, re.MULTILINE)
    assert re.search(r"^  141  standard output was closed early", section, re.MULTILINE)


def test_list_says_which_scenarios_this_machine_would_skip_and_why_in_lines_or_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "plain")
    write(tmp_path, "needs_root", RESET)
    monkeypatch.setenv(capabilities.ENV_MISSING, "root")
    assert cli.main(["list", "--long", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    skips = [line.strip() for line in lines if "would SKIP" in line]
    assert len(skips) == 1 and skips[0].startswith("would SKIP here: this machine lacks root (for cut (tcp_reset))"), out
    assert lines.index(f"{'':36} {tmp_path / 'needs_root.yaml'}") == lines.index(f"{'':36} {skips[0]}") - 1
    assert lines[-1] == "2 scenarios; 1 would be skipped here (the machine lacks root)"
    # without --long: a line a scenario, no file lines; --json: the same as data
    assert cli.main(["list", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["needs_root", "would", "plain"]
    assert lines[1].strip().startswith("would SKIP here: this machine lacks root")
    assert cli.main(["list", "--json", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["skip"] is not None) for s in doc["scenarios"]] == [("needs_root", True), ("plain", False)]
    assert doc["scenarios"][1]["path"] == str(tmp_path / "plain.yaml") and doc["invalid"] == [] and doc["problems"] == []
    assert cli.main(["list", "--faults", "--json"]) == 0
    assert "tcp_reset" in {f["kind"] for f in json.loads(capsys.readouterr().out)["faults"]}

    monkeypatch.setenv(capabilities.ENV_MISSING, "")
    monkeypatch.setattr(capabilities, "have", lambda capability: True)
    assert cli.main(["list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "would SKIP" not in out and out.splitlines()[-1] == "2 scenarios; this machine can run every one"


def test_validate_json_names_each_file_and_its_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "s", "good")
    bad = write(tmp_path / "s", "h_bad")
    bad.write_text(bad.read_text().replace("steps:", "stpes:"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))  # the results root, here rather than the checkout's
    assert cli.main(["validate", "--json", "s", "missing.yaml"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert captured.err == ""
    assert [(f["path"], f["ok"]) for f in doc["files"]] == [("s/good.yaml", True), ("s/h_bad.yaml", False)]
    assert doc["files"][0]["counts"] == {"processes": 2, "steps": 2, "checks": 0}
    assert len(doc["files"][1]["problems"]) == 2 and any("stpes" in p for p in doc["files"][1]["problems"])
    assert doc["problems"] == ["missing.yaml: no such file or folder"] and (doc["valid"], doc["invalid"]) == (1, 1)


def test_validate_prints_each_file_in_order_then_a_tally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "s", "good")
    bad = write(tmp_path / "s", "h_bad")
    bad.write_text(bad.read_text().replace("steps:", "stpes:"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))  # the results root, here rather than the checkout's
    assert cli.main(["validate", "s", "missing.yaml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "ok  s/good.yaml  (good: 2 processes, 2 steps, 0 checks)\n"
    err = captured.err.splitlines()
    assert err[0] == "missing.yaml: no such file or folder"
    assert err[1] == f"{Path('s') / 'h_bad.yaml'}: invalid scenario (2 problems)"
    assert err[-1] == "2 files: 1 valid, 1 invalid; 1 path problem"

    assert cli.main(["validate", str(good)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 file: 1 valid, 0 invalid"


def test_progress_says_exited_once_per_exit() -> None:
    out = io.StringIO()
    progress = Progress(out)
    progress(Entry(0, 1.0, "info", "reader-1", "process_exit", {"rc": 0, "stopped_by_harness": False}))
    progress(Entry(1, 2.0, "info", "source-1", "process_exit", {"rc": -9, "signal": "SIGKILL", "stopped_by_harness": False}))
    progress(Entry(2, 3.0, "info", "server", "process_exit", {"rc": 0, "stopped_by_harness": True}))
    progress(Entry(3, 3.1, "ok", "server", "stop", {"rc": 0}))
    assert out.getvalue().splitlines() == [
        "   1.000s reader-1: exited (rc 0)",
        "   2.000s source-1: exited (signal SIGKILL)",
        "   3.100s server: stopped (rc 0)",
    ]


def test_the_verdict_table_ends_with_a_tally() -> None:
    def result(name: str, verdict: str, seconds: float) -> Any:
        return SimpleNamespace(
            scenario=SimpleNamespace(name=name, path=None, processes={}), verdict=verdict, seconds=seconds, seed=1, run_dir=Path("runs") / name,
            status="completed", reason="lacks root" if verdict == "skip" else "", known_defect=None, checks=[],
            not_exercised=["fault cut (partition b): no effect: chain c: 0 packets"] if verdict == "not_exercised" else [],
            history=(),
        )

    out = io.StringIO()
    verdict_table(cast(Any, [result("a", "pass", 1.0), result("b", "fail", 2.0), result("c", "pass", 0.5), result("d", "skip", 0.0),
                             result("e", "not_exercised", 1.0)]), out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "5 scenarios: 2 PASS, 1 FAIL, 1 SKIP, 1 NOT_EXERCISED in 4.5s"
    assert "  NOT EXERCISED fault cut (partition b): no effect: chain c: 0 packets" in lines  # under its name
    assert any(line.startswith("e ") and "NOT_EXERCISED" in line and "no effect" in line for line in lines)  # its row
    empty = io.StringIO()
    verdict_table([], empty)
    assert empty.getvalue() == ""


def test_an_interrupted_runs_unfinished_checks_are_not_judged_in_the_table() -> None:
    checks = [SimpleNamespace(valid=True, name="loaded", summary="ok", not_judged=None),
              SimpleNamespace(valid=False, name="exit_codes", summary="-9", not_judged=None)]
    run = SimpleNamespace(scenario=SimpleNamespace(name="cut", path=None), verdict="error", seconds=1.0, seed=1,
                          run_dir=Path("runs/cut"), status="interrupted", reason="harness got SIGINT", known_defect=None, checks=checks,
                          not_exercised=[], history=())
    out = io.StringIO()
    verdict_table(cast(Any, [run]), out)
    lines = [line.split() for line in out.getvalue().splitlines() if "loaded" in line or "exit_codes" in line]
    assert lines == [["PASS", "loaded", "ok"], ["NOT", "JUDGED", "exit_codes", "-9"]]


def test_the_rate_table_shows_each_cell_its_rate_bound_and_failing_runs() -> None:
    def recs(*verdicts: str) -> list[RunRecord]:
        return [RunRecord(v, f"runs/x/{i}", 5 + i, 1.0) for i, v in enumerate(verdicts)]

    cells = [
        cell_of("steady", recs("pass", "pass", "pass")),
        cell_of("coin", recs("pass", "fail", "pass")),
        cell_of("defect", recs("xpass", "xpass"), known_defect=True, measured=Rate(4, 6)),
    ]
    out = io.StringIO()
    rate_table(cells, 3, out)
    lines = out.getvalue().splitlines()
    assert "steady    PASS   3/3     passed" in lines
    assert "coin      FLAKY  2/3     passed" in lines
    assert "            FAIL    seed 6  runs/x/1" in lines
    assert "defect    XPASS  0/2     defect showed  bound 0.776, measured 4/6 (0.667)" in lines
    assert any("N too small to call it fixed: bound 0.776 >= measured 4/6 (0.667); needs N >= 3" in line for line in lines)
    assert lines[-1] == "3 scenarios x 3: 1 PASS, 1 FLAKY, 1 XPASS; 1 fail the run"


def test_run_refuses_a_repeat_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "a")
    assert cli.main(["run", str(path), "--repeat", "0", "--out", str(tmp_path / "runs")]) == 2
    assert "argument --repeat: 0: give a number of runs >= 1" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_run_help_states_the_repeat_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "run every scenario N times (seeds seed..seed+N-1)" in out
    assert "FLAKY (fails the run)" in out and "FIXED? only at 0/N when the 95% upper bound is below its defect_rate" in out
    assert "--summary FILE" in out


def test_a_scenario_is_found_by_its_name_and_a_typo_gets_suggestions() -> None:
    files, problems = select.collect_paths(["smoke", "incident_mx491_stale_record_after_crash"])
    assert [f.name for f in files] == ["smoke.yaml", "mx491_stale_record_after_crash.yaml"] and problems == []
    assert files[0] == select.CATALOGUE / "smoke.yaml"  # the scenario named smoke, not mx_server/smoke.yaml (mx_server_smoke)
    assert select.collect_paths(["mx_server_smoke"])[0] == [select.CATALOGUE / "mx_server" / "smoke.yaml"]
    files, problems = select.collect_paths(["frozen_sorce", "no/such.yaml"])
    assert files == []
    assert problems[0].startswith("frozen_sorce: no such file or folder, nor a scenario of that name; did you mean frozen_source")
    assert problems[1] == "no/such.yaml: no such file or folder"


def test_an_unknown_name_counts_and_suggests_only_what_list_shows() -> None:
    names = {sc.name for sc in select.load_all(select.collect_paths(["scenarios"])[0], None)[0]}
    (problem,) = select.collect_paths(["nosuchscenario"])[1]
    assert problem.endswith(f"(`mxchaos list` shows the {len(names)} in scenarios)")
    (problem,) = select.collect_paths(["mx658_stor"])[1]  # no close spelling: the names holding it
    suggested = problem.split("did you mean ")[1].rstrip("?").split(", ")
    assert suggested and set(suggested) <= names and all("mx658_stor" in n for n in suggested)
