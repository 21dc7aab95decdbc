"""Verdicts beyond pass/fail against real (fake mxref) processes: a heal bounded by
``budgets.heal`` (a fault kind registered only here), scenarios skipped for a missing
capability, known defects (xfail / xpass) through ``mxchaos run``, and ``mxchaos check``
re-judging a saved run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from harness import checks, cli, faults
from harness.engine.runner import Runner
from harness.faults import Fault, FaultContext, FaultSpec, Injected
from harness.judge.verdict import RunResult
from harness.machine import procscan
from harness.reports.report import write_run_folder
from harness.scenario import FaultStep, Scenario, capabilities, load_scenario
from harness.spec import Name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fakeproc.py"


def scenario_file(tmp_path: Path, body: str, name: str = "t") -> Path:
    head = f'name: {name}\nlauncher: ["{{python}}", "{FAKE}"]\nscrape: {{interval: 200ms}}\n'
    path = tmp_path / f"{name}.yaml"
    path.write_text(head + body)
    return path


def server_source(rest: str) -> str:
    """The common processes and budgets, then ``rest`` (dedented)."""
    return SERVER_SOURCE + textwrap.dedent(rest)


SERVER_SOURCE = """\
budgets: {step: 10s, run: 40s, stop_grace: 2s, progress: 20s, heal: 500ms}
processes:
  server: {role: server}
  source-1: {role: source}
"""

# ---------------------------------------------------------------- a fault kind of this test only

RELEASE = threading.Event()  # lets the stuck heal threads end when a test is over


class StuckHealSpec(FaultSpec):
    """Injects nothing; its heal blocks (until the test releases it)."""

    kind: Literal["stuck_heal"]
    target: Name


class StuckHeal(Fault[StuckHealSpec, None]):
    kind = "stuck_heal"
    Spec = StuckHealSpec
    healable = True

    def inject(self, ctx: FaultContext) -> Injected[None]:
        return Injected(None, {"target": self.spec.target})

    def heal(self, ctx: FaultContext, token: None) -> dict[str, Any] | None:
        RELEASE.wait(30)
        return {"released": True}


class NeedsToolSpec(FaultSpec):
    """Needs a program no machine has."""

    kind: Literal["needs_tool"]
    target: Name


class NeedsTool(Fault[NeedsToolSpec, None]):
    kind = "needs_tool"
    Spec = NeedsToolSpec
    requires = ("root", "mxchaos-no-such-tool")

    def inject(self, ctx: FaultContext) -> Injected[None]:
        raise AssertionError("a fault whose capability is missing must never be injected")


@pytest.fixture
def test_faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Register the kinds above for one test (the scenario schema is built at import, so the
    test swaps them into a parsed scenario in place of a placeholder ``pause``)."""
    monkeypatch.setattr(faults, "REGISTRY", dict(faults.REGISTRY))
    faults.register(StuckHeal)
    faults.register(NeedsTool)
    RELEASE.clear()
    yield
    RELEASE.set()


def swap_fault(sc: Scenario, name: str, spec: FaultSpec) -> Scenario:
    """``sc`` with the fault step named ``name`` replaced by ``spec`` (validated: the
    placeholder was, and the spec is a model of its own kind)."""
    steps = [
        FaultStep.model_construct(fault=spec) if isinstance(s, FaultStep) and s.fault.name == name else s for s in sc.steps
    ]
    assert steps != list(sc.steps)
    return sc.model_copy(update={"steps": tuple(steps)})


def run(sc: Scenario, tmp_path: Path) -> RunResult:
    result = Runner(sc, out_dir=tmp_path / "runs", install_signal_handlers=False).run()
    with warnings.catch_warnings():
        # scenario.json of a swapped-in test kind: the schema's union does not know it
        warnings.filterwarnings("ignore", "Pydantic serializer warnings", UserWarning)
        write_run_folder(result)
    left = [p for p in procscan.scan() if p.run_id == result.run_id]
    assert left == [], f"the run left processes behind: {left}"
    return result


# ---------------------------------------------------------------- heal budget


def test_a_heal_that_overruns_its_budget_fails_and_teardown_heals_the_next(tmp_path: Path, test_faults: None) -> None:
    sc = load_scenario(
        scenario_file(
            tmp_path,
            server_source(
                """\
            steps:
              - start: [server, source-1]
              - await: {process: source-1, event: heartbeat}
              - fault: {kind: pause, target: source-1, name: freeze}
              - fault: {kind: pause, target: source-1, name: stuck}
            checks:
              - count: {process: source-1, event: heartbeat, min: 1}
            """),
        )
    )
    result = run(swap_fault(sc, "stuck", StuckHealSpec(kind="stuck_heal", name="stuck", target="source-1")), tmp_path)
    heals = result.history.select(actor="nemesis", f="heal")
    # teardown heals the newest first: stuck overruns, freeze is still healed after it
    assert [(e.get("fault"), e.type) for e in heals] == [("stuck", "invoke"), ("stuck", "fail"), ("freeze", "invoke"), ("freeze", "ok")]
    assert heals[1].get("error") == "did not return within 0.5s (budgets.heal)" and heals[1].get("timed_out") is True
    assert 0.45 <= heals[1].t - heals[0].t < 2.0
    assert heals[3].get("resumed") is True
    stop = result.history.last(actor="source-1", f="stop", type="ok")
    assert stop is not None and stop.get("escalated") is False  # freeze was healed: TERM worked
    assert result.verdict == "error" and result.status == "error"
    assert result.reason == "heal failed: stuck (stuck_heal) did not return within 0.5s (budgets.heal)"
    outcome = result.history.last(actor="harness", f="outcome")
    assert outcome is not None and outcome.get("status") == "error"
    assert [c.valid for c in result.checks] == [True, True]  # the checks still ran (the file's, the implicit balance)
    (window_stuck,) = [w for w in result.history.fault_windows() if w.name == "stuck"]
    assert window_stuck.end is None  # never healed


def test_a_heal_step_that_overruns_is_an_error_naming_the_fault(tmp_path: Path, test_faults: None) -> None:
    sc = load_scenario(
        scenario_file(
            tmp_path,
            server_source(
                """\
            steps:
              - start: [server, source-1]
              - fault: {kind: pause, target: source-1, name: stuck}
              - heal: stuck
              - mark: after
            """),
        )
    )
    result = run(swap_fault(sc, "stuck", StuckHealSpec(kind="stuck_heal", name="stuck", target="source-1")), tmp_path)
    assert (result.verdict, result.failed_step) == ("error", "3")
    assert result.reason.startswith("heal failed: stuck (stuck_heal) did not return within 0.5s (budgets.heal); ")
    assert result.history.first(actor="harness", f="mark") is None  # the steps ended there
    # never healed twice: the first heal may still be running
    assert len(result.history.select(actor="nemesis", f="heal", type="invoke")) == 1
    # known defects do not hide harness errors
    assert run(result.scenario.model_copy(update={"known_defect": "x"}), tmp_path).verdict == "error"


# ---------------------------------------------------------------- capability skips


def test_a_scenario_needing_a_missing_capability_is_skipped_before_anything_starts(tmp_path: Path, test_faults: None) -> None:
    sc = load_scenario(
        scenario_file(
            tmp_path,
            server_source(
                """\
            steps:
              - start: [server, source-1]
              - fault: {kind: pause, target: source-1, name: cut}
            checks:
              - count: {process: source-1, event: heartbeat, min: 1}
            """),
        )
    )
    result = run(swap_fault(sc, "cut", NeedsToolSpec(kind="needs_tool", name="cut", target="source-1")), tmp_path)
    assert (result.verdict, result.status, result.checks) == ("skip", "skipped", [])
    assert result.missing_capabilities == [c for c in ("root", "mxchaos-no-such-tool") if not capabilities.have(c)]
    assert "mxchaos-no-such-tool (for cut (needs_tool))" in result.reason
    assert result.history.select(f="start") == []
    assert not (result.run_dir / "procs").exists()
    saved = json.loads((result.run_dir / "verdict.json").read_text())
    assert (saved["verdict"], saved["missing_capabilities"]) == ("skip", result.missing_capabilities)


def test_mxchaos_run_skips_and_exits_0_where_a_capability_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_file(
        tmp_path,
        server_source(
            """\
        steps:
          - start: [server, source-1]
          - fault: {kind: tcp_reset, target: source-1, peer: server, name: cut}
        """),
        name="needs_root",
    )
    monkeypatch.setenv(capabilities.ENV_MISSING, "root")
    assert cli.main(["validate", str(path)]) == 0  # valid where it cannot run
    assert cli.main(["run", str(path), "--out", str(tmp_path / "runs"), "-q", "--junit", str(tmp_path / "j.xml")]) == 0
    out = capsys.readouterr().out
    assert "] needs_root: SKIP" in out and "(this machine lacks root (for cut (tcp_reset)))" in out
    assert "needs_root  SKIP     0/0/0  this machine lacks root (for cut (tcp_reset))" in out
    assert 'skipped="1"' in (tmp_path / "j.xml").read_text()


# ---------------------------------------------------------------- known defects through the CLI

DEFECT_BODY = server_source(
    """\
    known_defect: "fake 1.0: the source never heartbeats"
    steps:
      - start: [server, source-1]
      - await: {process: source-1, event: heartbeat}
    checks:
      - count: {process: source-1, event: heartbeat, BOUND}
    """
)


def test_known_defects_are_xfail_or_xpass_and_never_fail_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reproduced = scenario_file(tmp_path, DEFECT_BODY.replace("BOUND", "max: 0"), name="defect_reproduced")
    fixed = scenario_file(tmp_path, DEFECT_BODY.replace("BOUND", "min: 1"), name="defect_fixed")
    junit = tmp_path / "junit.xml"
    code = cli.main(["run", str(reproduced), str(fixed), "--out", str(tmp_path / "runs"), "-q", "--junit", str(junit)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "] defect_reproduced: XFAIL" in out and "] defect_fixed: XPASS" in out
    assert "known defect (XFAIL): fake 1.0: the source never heartbeats" in out
    assert "XPASS defect_fixed: every check passed, the known defect did not reproduce in this run." in out
    text = junit.read_text()
    assert 'message="XFAIL: known defect: fake 1.0: the source never heartbeats"' in text
    assert "<system-out>XPASS: every check passed" in text
    verdicts = {p.parent.parent.name: json.loads(p.read_text())["verdict"] for p in (tmp_path / "runs").glob("*/latest/verdict.json")}
    assert verdicts == {"defect_reproduced": "xfail", "defect_fixed": "xpass"}


def test_a_known_defect_that_hangs_still_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario_file(
        tmp_path,
        textwrap.dedent(
            """\
        known_defect: "fake 1.0: readers never finish"
        budgets: {step: 20s, run: 30s, progress: 1s, stop_grace: 1s}
        processes:
          server: {role: server}
          reader-1: {role: reader, extra_args: [--fake-silent]}
        steps:
          - start: [server, reader-1]
          - await: {process: reader-1, event: load_done}
        checks:
          - loaded: {reader: reader-1}
        """
        ),
        name="defect_hangs",
    )
    assert cli.main(["run", str(path), "--out", str(tmp_path / "runs"), "-q"]) == 1
    assert "defect_hangs  HANG" in capsys.readouterr().out


# ---------------------------------------------------------------- mxchaos check


def test_mxchaos_check_re_judges_a_saved_run_and_writes_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario_file(
        tmp_path,
        server_source(
            """\
        steps:
          - start: [server, source-1]
          - await: {process: source-1, event: heartbeat}
        checks:
          - count: {process: source-1, event: heartbeat, min: 1}
          - nothing_leaked: {}
        """),
        name="judged",
    )
    assert cli.main(["run", str(path), "--out", str(tmp_path / "runs"), "-q"]) == 0
    folder = (tmp_path / "runs" / "judged" / "latest").resolve()
    files = {name: (folder / name).read_bytes() for name in ("verdict.json", "junit.xml", "report.html", "timeline.jsonl")}
    capsys.readouterr()

    assert cli.main(["check", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"--- judged: PASS  {folder}" in out and "judged    PASS     3/0/0" in out  # 2 of the file's, the implicit balance

    def stricter(p, h, run):  # type: ignore[no-untyped-def]
        return checks.CheckResult(False, "a stricter count")

    monkeypatch.setitem(checks.REGISTRY, "count", checks.CheckDef("count", checks.REGISTRY["count"].params, stricter, ""))
    assert cli.main(["check", str(tmp_path / "runs" / "judged")]) == 1  # a scenario's folder: its latest run
    out = capsys.readouterr().out
    assert "--- judged: FAIL (was PASS)" in out and "a stricter count" in out
    assert {name: (folder / name).read_bytes() for name in files} == files  # nothing written

    assert cli.main(["check", "--write", str(folder)]) == 1
    assert "rewrote verdict.json, junit.xml, report.html" in capsys.readouterr().out
    saved = json.loads((folder / "verdict.json").read_text())
    assert saved["verdict"] == "fail" and saved["rejudged"]["previous_verdict"] == "pass"
    assert saved["run_id"] == json.loads(files["verdict.json"])["run_id"]
    assert saved["versions"] == json.loads(files["verdict.json"])["versions"]  # what ran, not what re-judged
    assert 'failures="1"' in (folder / "junit.xml").read_text()
    assert ">FAIL</span>" in (folder / "report.html").read_text()
    assert (folder / "timeline.jsonl").read_bytes() == files["timeline.jsonl"]

    assert cli.main(["check", str(folder), "--write"]) == 1
    assert "(was" not in capsys.readouterr().out  # already rewritten as fail

    assert cli.main(["check", str(tmp_path)]) == 2
    assert "no scenario.json" in capsys.readouterr().err


# ---------------------------------------------------------------- repeats and rates

COIN = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "coin_flaky.yaml"


def test_a_scenario_that_passes_sometimes_is_flaky_and_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir, junit, summary = tmp_path / "runs", tmp_path / "junit.xml", tmp_path / "s" / "summary.json"
    code = cli.main(["run", str(COIN), "--repeat", "3", "--out", str(out_dir), "-q", "--junit", str(junit), "--summary", str(summary)])
    out = capsys.readouterr().out
    assert code == 1, out
    cell = json.loads(summary.read_text())["scenarios"]["coin_flaky"]
    assert (cell["cell"], cell["rate"], cell["bound"], cell["measured"]) == ("FLAKY", {"k": 2, "n": 3}, None, None)
    assert [(r["verdict"], r["seed"]) for r in cell["runs"]] == [("pass", 0), ("fail", 1), ("pass", 2)]
    for run in cell["runs"]:  # saved relative to the summary's folder
        run["run_dir"] = str((summary.parent / run["run_dir"]).resolve())
    failing = cell["runs"][1]["run_dir"]
    assert "coin_flaky  FLAKY  2/3     passed" in out
    assert f"FAIL    seed 1  {failing}" in out
    lines = out.splitlines()  # the closing recap: the cell, its failing run's first failing check, page, rerun
    recap = lines[lines.index(f"{'short summary':-^72}") + 1:]
    assert recap[0].startswith("FLAKY  coin_flaky  passed 2/3  exit_codes: ") and recap[0].endswith(f"{failing}/report.html")
    assert recap[1].startswith("       rerun:  ") and recap[1].endswith(" --seed 1")
    assert lines[-3] == "1 scenario x 3: 1 FLAKY; 1 fail the run"  # the tally after it
    for index, run in enumerate(cell["runs"], 1):  # each run is a full run with its own folder
        saved = json.loads((Path(run["run_dir"]) / "verdict.json").read_text())
        assert (saved["seed"], saved["verdict"]) == (run["seed"], run["verdict"])
        repeat = {k: v for k, v in saved["repeat"].items() if k not in ("runs", "note")}
        assert repeat == {"index": index, "of": 3, "cell": "FLAKY", "rate": {"k": 2, "n": 3}, "bound": None, "measured": None}
        assert [str((Path(run["run_dir"]) / r["run_dir"]).resolve()) for r in saved["repeat"]["runs"]] == [
            r["run_dir"] for r in cell["runs"]]  # relative to the run's own folder
        # the page says which of the N it is, the cell that counts, and links the others
        page = (Path(run["run_dir"]) / "report.html").read_text()
        assert f"Run {index} of 3 of this scenario" in page and ">FLAKY</span> 2/3 runs passed" in page
        others = [Path(r["run_dir"]).name for i, r in enumerate(cell["runs"], 1) if i != index]
        assert all(f"href='../{name}/report.html'" in page for name in others), page
        assert f"{index}: {run['verdict'].upper()} (this run)" in page
    text = junit.read_text()
    assert text.count("<testcase ") == 1
    assert f'message="FLAKY 2/3: passed in 2 of 3 runs; a plain scenario passes only at 3/3; failing runs: FAIL {os.path.relpath(failing, junit.parent)}"' in text


def test_a_known_defect_is_reproduced_or_not_by_its_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = COIN.read_text().replace("name: coin_flaky", "name: coin_defect\nknown_defect: the coin lands odd\ndefect_rate: 2/3")
    reproduced = tmp_path / "coin_defect.yaml"
    reproduced.write_text(body)
    code = cli.main(["run", str(reproduced), "--repeat", "2", "--out", str(tmp_path / "runs"), "-q"])
    assert code == 0, capsys.readouterr().out
    cell = json.loads((tmp_path / "runs" / "summary.json").read_text())["scenarios"]["coin_defect"]
    assert (cell["cell"], cell["rate"], cell["measured"]) == ("XFAIL", {"k": 1, "n": 2}, {"k": 2, "n": 3})
    assert cell["bound"] == pytest.approx(0.974679, abs=1e-6)
    # on even seeds only (seed 0, 2, 4 ... stepping by the run index: seed 0 once) the defect does not show
    assert cli.main(["run", str(reproduced), "--repeat", "1", "--out", str(tmp_path / "once"), "-q"]) == 0
    once = json.loads((tmp_path / "once" / "summary.json").read_text())["scenarios"]["coin_defect"]
    assert (once["cell"], once["rate"], once["bound"]) == ("XPASS", {"k": 0, "n": 1}, 0.95)
    assert "N too small" not in capsys.readouterr().out  # at --repeat 1 the per-run table is shown


def test_pytest_repeat_judges_a_scenario_item_by_its_rate(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "coin_flaky.yaml").write_text(COIN.read_text())
    steady = COIN.read_text().replace("name: coin_flaky", "name: coin_steady").replace("% 2", "% 1")
    (folder / "coin_steady.yaml").write_text(steady)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MXCHAOS_"))}

    def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", *args], cwd=tmp_path, capture_output=True, text=True, timeout=100, env=env
        )

    repeated = pytest_run("--mxchaos-repeat", "3")
    assert repeated.returncode == 1, repeated.stdout
    assert "1 failed, 1 passed" in repeated.stdout
    assert "scenario coin_flaky: FLAKY (passed 2/3): passed in 2 of 3 runs" in repeated.stdout
    assert "  run with seed 1: FAIL  " in repeated.stdout
    once = pytest_run("-k", "coin_flaky")  # one run, seed 0: it passes
    assert once.returncode == 0, once.stdout
