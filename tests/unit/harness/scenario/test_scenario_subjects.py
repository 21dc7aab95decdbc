"""Who can play a scenario: its ``subjects`` key (validated), the SKIP a subject outside it gets
(nothing starts, the note is the reason) from the runner, ``mxchaos run`` and ``mxchaos list``,
and the subject axis of ``mxchaos matrix`` (columns, ``--subject`` passed to each column's
``mxchaos run``, who played each cell). Nothing here starts NIXL or the real client."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.engine.runner import Runner
from harness.errors import ScenarioInvalid
from harness.matrix.run import MatrixSpec, run_matrix
from harness.record.cells import Column, columns_for
from harness.scenario import load_scenario, parse_scenario

BASE = """\
name: only_mxref
{extra}
processes:
  server: {{role: server}}
  source-1: {{role: source{source_subject}}}
  reader-1: {{role: reader, options: {{skip_release: true}}}}
steps:
  - start: [server, source-1, reader-1]
"""
NOTE = "the reader's skip_release is mxref's"


def scenario_text(extra: str = "", source_subject: str = "") -> str:
    return BASE.format(extra=extra, source_subject=f", subject: {source_subject}" if source_subject else "")


def problems(text: str) -> str:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(text)
    return info.value.render()


def test_by_default_every_subject_can_play_a_scenario() -> None:
    sc = parse_scenario(scenario_text())
    assert sc.subjects == ("mxref", "modelexpress") and sc.subjects_note == ""
    assert sc.not_playable() is None and sc.with_subject("modelexpress").not_playable() is None


def test_a_scenario_for_mxref_only_is_not_playable_by_the_client() -> None:
    sc = parse_scenario(scenario_text(f'subjects: [mxref]\nsubjects_note: "{NOTE}"'))
    assert sc.not_playable() is None
    why = sc.with_subject("modelexpress").not_playable()
    assert why == f"not staged for modelexpress (subjects: [mxref]): {NOTE}"


@pytest.mark.parametrize(("extra", "source_subject", "message"), [
    ("subjects: [mxref]", "", "subjects: say why modelexpress cannot play this scenario in subjects_note"),
    ('subjects: [mxref, modelexpress]\nsubjects_note: "why"', "", "nothing to explain"),
    ("subjects: []", "", "name who can play the scenario"),
    ("subjects: [mxref, mxref]", "", "name each subject once"),
    ("subjects: [mxrf]", "", "subjects"),
    (f'subjects: [mxref]\nsubjects_note: "{NOTE}"\nsubject: modelexpress', "",
     "'modelexpress' is not among the scenario's subjects"),
    (f'subjects: [mxref]\nsubjects_note: "{NOTE}"', "modelexpress",
     "processes.source-1.subject: 'modelexpress' is not among the scenario's subjects"),
])
def test_subjects_are_validated(extra: str, source_subject: str, message: str) -> None:
    assert message in problems(scenario_text(extra, source_subject))


def test_a_mixed_fleet_is_not_playable_when_one_of_its_subjects_is_left_out(tmp_path: Path) -> None:
    text = scenario_text(f'subjects: [mxref]\nsubjects_note: "{NOTE}"')
    sc = parse_scenario(text).model_copy(update={"subjects": ("modelexpress",)})  # as if: [modelexpress]
    assert "not staged for mxref" in str(sc.not_playable())


def test_the_runner_skips_before_anything_starts(tmp_path: Path) -> None:
    sc = parse_scenario(scenario_text(f'subjects: [mxref]\nsubjects_note: "{NOTE}"')).with_subject("modelexpress")
    result = Runner(sc, out_dir=tmp_path).run()
    assert result.verdict == "skip" and result.status == "skipped"
    assert result.reason.endswith(NOTE) and result.missing_capabilities == []
    assert [e.f for e in result.history] == ["skip", "outcome"]  # nothing was started


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "only_mxref.yaml"
    path.write_text(scenario_text(f'subjects: [mxref]\nsubjects_note: "{NOTE}"'))
    return path


def test_mxchaos_run_with_the_client_skips_it_naming_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MXCHAOS_BUILD_SUBJECTS", "0")  # never build the client's environment here
    path = _write(tmp_path)
    assert main(["run", "--subject", "modelexpress", "--out", str(tmp_path / "runs"), str(path)]) == 0
    out = capsys.readouterr().out
    assert "SKIP" in out and NOTE in out
    verdict = json.loads(next((tmp_path / "runs").rglob("verdict.json")).read_text())
    assert verdict["verdict"] == "skip" and NOTE in verdict["reason"]


def test_mxchaos_list_says_which_scenarios_a_subject_cannot_play(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    assert main(["list", str(path)]) == 0
    assert "would SKIP" not in capsys.readouterr().out
    assert main(["list", "--subject", "modelexpress", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"would SKIP here: not staged for modelexpress (subjects: [mxref]): {NOTE}" in out
    # the tally says the subject is why, not that the machine lacks something
    assert out.splitlines()[-1] == "1 scenario; 1 would be skipped here (1 not staged for the subjects asked)"


def test_the_library_marks_what_only_mxref_can_stage() -> None:
    root = Path(__file__).resolve().parents[4] / "scenarios"
    for name in ("reader_departs", "reader_health", "corrupted_source_memory", "incidents/nixl2047_stall_without_completion"):
        sc = load_scenario(root / f"{name}.yaml")
        assert sc.subjects == ("mxref",) and sc.subjects_note, name
    for name in ("smoke", "store_wipe", "mixed_fleet", "incidents/mx658_store_wiped_sources_republish"):
        assert "modelexpress" in load_scenario(root / f"{name}.yaml").subjects, name


# ------------------------------------------------------------------ mxchaos matrix --subject


def test_subject_columns() -> None:
    cols = columns_for([], [], ["mxref", "modelexpress"])
    assert [c.id for c in cols] == ["subject-mxref", "subject-modelexpress"]
    assert cols[1].label == "subject modelexpress"
    both = columns_for(["1.5.1"], [("AB", ["y"])], ["modelexpress"])
    assert [c.id for c in both] == ["nixl-1.5.1+subject-modelexpress+AB=y"]
    assert Column("1.5.1").id == "nixl-1.5.1" and Column("").id == "here"


def test_a_subject_matrix_runs_each_column_with_its_subject(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        argv = list(argv)
        calls.append(argv)
        if "mxref.bench.raw" in argv:
            return 0, '{"raw_read": {"bytes": 1, "gbps": [2.0], "median_gbps": 2.0}}\n'
        if argv[3:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--repeat N]"
        subject = argv[argv.index("--subject") + 1]
        out = Path(argv[argv.index("--out") + 1])
        folder = out / "smoke" / "run0"
        folder.mkdir(parents=True)
        verdict = "pass" if subject == "mxref" else "fail"
        (folder / "verdict.json").write_text(json.dumps({"scenario": "smoke", "verdict": verdict}))
        (folder / "versions.json").write_text(json.dumps({
            "nixl": "1.5.1 (nixl)", "subjects": {subject: {"version": "0.7.0" if subject != "mxref" else "this repository"}}}))
        (folder / "timeline.jsonl").write_text("")
        run: dict[str, Any] = {"verdict": verdict, "run_dir": str(folder), "seed": 0, "seconds": 1.0}
        summary = {"repeat": 1, "scenarios": {"smoke": {"cell": verdict.upper(), "rate": {"k": 1, "n": 1}, "runs": [run]}}}
        (out / "summary.json").write_text(json.dumps(summary))
        return 0 if verdict == "pass" else 1, ""

    spec = MatrixSpec(scenarios=[tmp_path / "smoke.yaml"], names=["smoke"], defects={},
                      columns=columns_for([], [], ["mxref", "modelexpress"]), out=tmp_path / "out")
    matrix = run_matrix(spec, execute=execute, ensure=lambda v: pytest.fail(f"built an env for {v!r}")).to_json()
    runs = [c for c in calls if "--out" in c]
    assert [c[c.index("--subject") + 1] for c in runs] == ["mxref", "modelexpress"]
    assert sum(1 for c in calls if "mxref.bench.raw" in c) == 1  # one environment: one raw READ
    cells = matrix["cells"]["smoke"]
    assert cells["subject-mxref"]["verdict"] == "PASS" and cells["subject-mxref"]["subjects"] == {"mxref": "this repository"}
    assert cells["subject-modelexpress"]["verdict"] == "FAIL"
    assert cells["subject-modelexpress"]["subjects"] == {"modelexpress": "0.7.0"}
    assert [c["subject"] for c in matrix["columns"]] == ["mxref", "modelexpress"]


@pytest.mark.parametrize("argv", [
    ["matrix", "scenarios/smoke.yaml"],
    ["matrix", "--subject", "mxref,bogus", "scenarios/smoke.yaml"],
    ["matrix", "--subject", "mxref,mxref", "scenarios/smoke.yaml"],
])
def test_invalid_subject_axes_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err
