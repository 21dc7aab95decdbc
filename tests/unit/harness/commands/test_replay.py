"""``mxchaos replay`` on hand-built run folders: targets resolved from the nemesis's records,
the sleeps before a fault set to the delay measured, a skipped fault kept with a comment, the
seed of the run, a header naming the run; the text validates and means the same scenario
otherwise; a folder that is not a run folder is exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.scenario_heads import THREE_PROCESSES

from harness import cli
from harness.commands.replay import replay_text
from harness.record.timeline import History
from harness.reports.report import write_scenario_files
from harness.scenario import FaultStep, SleepStep, parse_scenario

SCENARIO = """\
name: demo_replay
seed: 3
processes:
  server: {role: server}
  source-1: {role: source}
  source-2: {role: source}
  reader-1: {role: reader}
steps:
  - start: server
  - start: [source-1, source-2]
  - start: reader-1
  - await: {process: reader-1, event: transfer_start}
  - sleep: 200ms
  - fault: {kind: pause, target: {source_of: reader-1}, name: freeze, duration: 1s}
  - sleep: 100ms
  - fault: {kind: kill, target: source-2, if_gone: skip}
  - await: {process: reader-1, exit: true, code: any}
checks:
  - loaded: {reader: reader-1}
"""

PAUSE_SPEC = {"kind": "pause", "name": "freeze", "duration": 1.0, "if_gone": "fail", "target": {"source_of": "reader-1"}, "group": True}
KILL_SPEC = {"kind": "kill", "name": None, "duration": None, "if_gone": "skip", "target": "source-2", "signal": 9, "group": True}

Row = tuple[float, str, str, str, dict[str, Any]]


def _rows(pause_spec: dict[str, Any], kill_spec: dict[str, Any]) -> list[Row]:
    return [
        (0.0, "invoke", "harness", "run", {"run_id": "demo_replay-1", "seed": 11}),
        (0.0, "invoke", "harness", "step", {"step": "1", "text": "start server"}),
        (0.1, "ok", "harness", "step", {"step": "1", "text": "start server"}),
        (1.0, "invoke", "harness", "step", {"step": "4", "text": "await reader-1 transfer_start"}),
        (2.0, "info", "reader-1", "transfer_start", {"index": 0}),
        (2.001, "ok", "harness", "step", {"step": "4", "text": "await reader-1 transfer_start", "matched_t": 2.0}),
        (2.001, "invoke", "harness", "step", {"step": "5", "text": "sleep 0.2s"}),
        (2.21, "ok", "harness", "step", {"step": "5", "text": "sleep 0.2s"}),
        (2.21, "invoke", "harness", "step", {"step": "6", "text": "fault pause"}),
        (2.2344, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": {"source_of": "reader-1"}, "spec": pause_spec}),
        (2.24, "ok", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": "source-2", "pid": 5, "healable": True}),
        (2.24, "ok", "harness", "step", {"step": "6", "text": "fault pause"}),
        (2.24, "invoke", "harness", "step", {"step": "7", "text": "sleep 0.1s"}),
        (2.35, "ok", "harness", "step", {"step": "7", "text": "sleep 0.1s"}),
        (2.35, "invoke", "harness", "step", {"step": "8", "text": "fault kill"}),
        (2.36, "invoke", "nemesis", "inject", {"fault": "kill-2", "kind": "kill", "target": "source-2", "spec": kill_spec}),
        (2.36, "info", "nemesis", "inject", {"fault": "kill-2", "kind": "kill", "target": "source-2", "skipped": "source-2 exited (rc 0) at 2.3s"}),
        (2.36, "ok", "harness", "step", {"step": "8", "text": "fault kill"}),
        (5.0, "info", "harness", "outcome", {"status": "completed", "reason": "", "failed_step": None}),
    ]


def _folder(tmp_path: Path, *, seed: int = 11) -> Path:
    run_dir = tmp_path / "runs" / "demo_replay" / "stamp-1"
    scenario = parse_scenario(SCENARIO, tmp_path / "demo_replay.yaml").with_seed(seed)
    write_scenario_files(run_dir, scenario)
    saved = parse_scenario(SCENARIO, "x").steps
    pause, kill = saved[5], saved[7]
    assert isinstance(pause, FaultStep) and isinstance(kill, FaultStep)
    History.build(_rows(pause.fault.model_dump(mode="json"), kill.fault.model_dump(mode="json"))).to_jsonl(run_dir / "timeline.jsonl")
    return run_dir


def test_a_replay_resolves_targets_takes_measured_delays_and_the_runs_seed(tmp_path: Path) -> None:
    run_dir = _folder(tmp_path)
    text = replay_text(run_dir)
    sc = parse_scenario(text, tmp_path / "replayed.yaml")
    assert sc.seed == 11  # the run's, not the file's 3
    faults = [s for s in sc.steps if isinstance(s, FaultStep)]
    assert faults[0].fault.model_dump()["target"] == "source-2"  # {source_of: reader-1} as it resolved
    sleeps = [s.sleep for s in sc.steps if isinstance(s, SleepStep)]
    # 2.0 (transfer_start) -> 2.2344 (inject), and 2.24 (that inject's end) -> 2.36 (the next): the delays
    # measured, not the 0.2 and 0.1 written
    assert sleeps == [pytest.approx(0.234, abs=1e-9), pytest.approx(0.12, abs=1e-9)]
    assert "Replayed by `mxchaos replay` from run" in text and str(run_dir) in text
    assert "source_of(reader-1) -> source-2" in text
    assert "did not inject in the run: source-2 exited" in text
    assert faults[1].fault.model_dump()["target"] == "source-2" and faults[1].fault.if_gone == "skip"  # kept as written


def test_everything_else_is_the_scenario_as_it_ran(tmp_path: Path) -> None:
    run_dir = _folder(tmp_path)
    sc = parse_scenario(replay_text(run_dir, name="again"), "r.yaml")
    original = parse_scenario(SCENARIO, "o.yaml")
    assert sc.name == "again"
    for key in ("processes", "checks", "budgets", "model", "hosts"):
        assert getattr(sc, key) == getattr(original, key), key
    assert len(sc.steps) == len(original.steps)


def test_the_cli_writes_the_file_and_refuses_a_folder_that_is_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _folder(tmp_path)
    out = tmp_path / "r.yaml"
    assert cli.main(["replay", str(run_dir), "-o", str(out)]) == 0
    assert cli.main(["validate", str(out)]) == 0
    assert cli.main(["replay", str(tmp_path)]) == 2
    assert "no scenario.json" in capsys.readouterr().err


def test_every_shipped_scenario_is_written_back_as_itself() -> None:
    from harness.explore import is_template
    from harness.scenario import load_scenario
    from harness.scenario.emit import compact_data, scenario_text

    root = Path(__file__).resolve().parents[4]
    shipped = [p for p in sorted((root / "scenarios").rglob("*.yaml")) if not is_template(p)]
    assert shipped
    for path in shipped:
        sc = load_scenario(path)
        text = scenario_text(compact_data(sc), header=["written back"])  # raises unless it reads back as sc
        assert text.startswith("# written back\n"), path


NESTED = "name: nested_replay\n" + THREE_PROCESSES + """\
  - parallel:
      - [{sleep: 1s}, {fault: {kind: pause, target: {source_of: reader-1}, name: p, duration: 1s}}]
      - {sleep: 2s}
"""


def test_a_fault_inside_a_parallel_branch_gets_its_target_resolved(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sc = parse_scenario(NESTED, tmp_path / "nested.yaml")
    write_scenario_files(run_dir, sc)
    (par,) = [s for s in sc.steps if s.yaml_key == "parallel"]
    fault = par.branches()[0][1]
    assert isinstance(fault, FaultStep)
    spec = fault.fault.model_dump(mode="json")
    History.build([
        (0.0, "invoke", "harness", "step", {"step": "2.1.2", "text": "fault pause"}),
        (0.1, "invoke", "nemesis", "inject", {"fault": "p", "kind": "pause", "spec": spec}),
        (0.2, "ok", "nemesis", "inject", {"fault": "p", "kind": "pause", "target": "source-1"}),
        (3.0, "info", "harness", "outcome", {"status": "completed", "reason": "", "failed_step": None}),
    ]).to_jsonl(run_dir / "timeline.jsonl")
    text = replay_text(run_dir)
    again = parse_scenario(text, "r.yaml")
    (par2,) = [s for s in again.steps if s.yaml_key == "parallel"]
    replayed = par2.branches()[0][1]
    assert isinstance(replayed, FaultStep) and replayed.fault.model_dump()["target"] == "source-1"
    assert "Faults inside parallel branches (2.1.2)" in text
