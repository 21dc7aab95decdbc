"""``mxchaos mutate``'s parts without real runs: mutants read and applied in a scratch copy
(never the user's tree, also from inside a repository), outcomes read from a run folder, and
the kill matrix's classification (a time bound alone is a timing-only kill)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness import cli
from harness.mutate import killmatrix
from harness.mutate.command import out_folder
from harness.mutate.runs import FailedCheck, Outcome, read_outcomes
from harness.mutate.subject import MutantError, ScratchSubject, find_mutants

ROOT = Path(__file__).resolve().parents[4]
MUTANTS = ROOT / "tests" / "mutants"


def test_every_shipped_mutant_applies_to_a_scratch_copy_and_leaves_the_tree_alone(tmp_path: Path) -> None:
    before = subprocess.run(["git", "status", "--porcelain", "--", "mxref", "harness"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    mutants = find_mutants(MUTANTS)
    assert len(mutants) >= 10 and all(m.summary for m in mutants)
    scratch = ScratchSubject(ROOT, "mxref", tmp_path / "scratch")
    for mutant in mutants:
        scratch.prepare(mutant)
        copy = scratch.pythonpath / mutant.package  # mxref, or the harness's fault injection
        changed = [p for p in copy.rglob("*.py") if p.read_text() != (ROOT / mutant.package / p.relative_to(copy)).read_text()]
        assert changed, f"{mutant.name} changed nothing"
        assert all("MUTANT" in p.read_text() for p in changed)
    scratch.discard()
    assert not scratch.pythonpath.exists()
    after = subprocess.run(["git", "status", "--porcelain", "--", "mxref", "harness"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert after == before


def test_a_mutant_that_does_not_apply_or_is_no_diff_is_named(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "junk.diff").write_text("hello\n")
    with pytest.raises(MutantError, match=r"junk.diff: not a unified diff"):
        find_mutants(tmp_path / "m")
    (tmp_path / "m" / "junk.diff").write_text("--- a/mxref/nothere.py\n+++ b/mxref/nothere.py\n@@ -1 +1 @@\n-a\n+b\n")
    scratch = ScratchSubject(ROOT, "mxref", tmp_path / "s")
    with pytest.raises(MutantError, match=r"junk.diff: does not apply"):
        scratch.prepare(find_mutants(tmp_path / "m")[0])
    with pytest.raises(MutantError, match="holds no mutant"):
        find_mutants(tmp_path / "s")


def test_a_mutant_of_the_harness_patches_only_its_fault_injection(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    hunk = "@@ -1 +1 @@\n-a\n+b\n"
    (tmp_path / "m" / "oracle.diff").write_text(f"--- a/harness/judge/verdict.py\n+++ b/harness/judge/verdict.py\n{hunk}")
    with pytest.raises(MutantError, match=r"oracle.diff: patches harness/judge/verdict.py: a mutant of the harness "
                                          r"patches only its fault injection \(harness/faults/, harness/hosts/\)"):
        find_mutants(tmp_path / "m")
    (tmp_path / "m" / "oracle.diff").write_text(f"--- a/harness/faults/disk.py\n+++ b/harness/faults/disk.py\n{hunk}"
                                                f"--- a/mxref/reader.py\n+++ b/mxref/reader.py\n{hunk}")
    with pytest.raises(MutantError, match="a mutant patches one package"):
        find_mutants(tmp_path / "m")
    inject = [m for m in find_mutants(MUTANTS) if m.package == "harness"]
    assert inject and all(p.startswith(("harness/faults/", "harness/hosts/")) for m in inject for p in m.paths)
    scratch = ScratchSubject(ROOT, "mxref", tmp_path / "s")
    scratch.prepare(inject[0])  # the subject's copy, and the harness's with the mutant applied
    assert (scratch.pythonpath / "mxref" / "__init__.py").is_file() and (scratch.pythonpath / "harness" / "cli").is_dir()
    scratch.prepare(None)  # the baseline: the subject alone
    assert not (scratch.pythonpath / "harness").exists()
    scratch.discard()


def _outcome(verdict: str, *failed: tuple[str, str, bool], step: str | None = None) -> Outcome:
    return Outcome("sc", verdict, "", [FailedCheck(k, n, "", t) for k, n, t in failed], step)


def test_a_cell_is_killed_only_by_a_check_that_is_no_time_bound() -> None:
    base = [_outcome("pass")]
    killed = killmatrix.cell([_outcome("fail", ("nixl_balance", "nixl_balance", False), ("elapsed", "e", True))], base)
    assert killed["state"] == "killed" and killed["by"] == ["nixl_balance"] and killed["timing_by"] == ["e"]
    timing = killmatrix.cell([_outcome("fail", ("elapsed", "e", True)), _outcome("pass")], base)
    assert timing["state"] == "timing" and timing["rate"] == {"k": 1, "n": 2}
    assert killmatrix.cell([_outcome("pass")], base)["state"] == "survived"
    assert killmatrix.cell([_outcome("fail", ("count", "c", False))], [_outcome("fail")])["state"] == "baseline"
    waited = killmatrix.cell([_outcome("error", step="await reader-1 load_done: not within 30s")], base)
    assert waited["state"] == "timing"
    crashed = _outcome("fail", ("count", "c", False), step="source-2 did not emit status_change in time")
    assert killmatrix.to_confirm([crashed]) and not killmatrix.to_confirm([_outcome("fail", ("count", "c", False))])
    assert killmatrix.cell([crashed, _outcome("pass")], base)["state"] == "flaky"
    assert killmatrix.cell([crashed, crashed], base)["state"] == "killed"
    row = killmatrix.mutant_row("m", "", {"a": killed, "b": timing})
    assert row["verdict"] == "killed" and row["killed_by"] == ["a"] and row["timing_only_by"] == ["b"]


def test_outcomes_are_read_from_a_run_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "sc" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "verdict.json").write_text(json.dumps({"verdict": "fail", "status": "completed", "checks": [
        {"kind": "loaded", "name": "loaded", "valid": True, "summary": "ok"},
        {"kind": "loaded", "name": "late", "valid": False, "summary": "reader-1 loaded later than 1s"},
        {"kind": "integrity", "name": "integrity", "valid": False, "summary": "reader-1 holds other bytes"}]}))
    (tmp_path / "summary.json").write_text(json.dumps({"repeat": 1, "scenarios": {"sc": {
        "cell": "FAIL", "runs": [{"verdict": "fail", "run_dir": str(run_dir)}]}}}))
    (only,) = read_outcomes(tmp_path)["sc"]
    assert only.killed and not only.timing_only
    assert [(c.name, c.timing) for c in only.failed] == [("late", True), ("integrity", False)]
    assert read_outcomes(tmp_path / "nothing") == {}


def test_a_fault_that_landed_nothing_kills_by_its_witness(tmp_path: Path) -> None:
    run_dir = tmp_path / "sc" / "r1"
    run_dir.mkdir(parents=True)
    why = "fault freeze (pause source-1): no effect: 0 of 3 threads in state T"
    (run_dir / "verdict.json").write_text(json.dumps({"verdict": "not_exercised", "status": "completed", "checks": [
        {"kind": "loaded", "name": "loaded", "valid": True, "summary": "ok"}], "not_exercised": [why]}))
    (tmp_path / "summary.json").write_text(json.dumps({"repeat": 1, "scenarios": {"sc": {
        "cell": "NOT_EXERCISED", "runs": [{"verdict": "not_exercised", "run_dir": str(run_dir)}]}}}))
    (only,) = read_outcomes(tmp_path)["sc"]
    assert only.killed and not only.timing_only
    cell = killmatrix.cell([only], [_outcome("pass")])
    assert (cell["state"], cell["by"]) == ("killed", ["NOT EXERCISED fault freeze (pause source-1)"])


def test_the_command_refuses_bad_input_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mutate", "--mutants", str(tmp_path), "scenarios/smoke.yaml"]) == 2
    assert "holds no mutant" in capsys.readouterr().err
    assert cli.main(["mutate", "--mutants", str(MUTANTS), "--only", "nope", "scenarios/smoke.yaml"]) == 2
    assert "--only names nope" in capsys.readouterr().err


def test_without_out_it_writes_under_the_results_root_not_the_working_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXCHAOS_RESULTS", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    assert out_folder(None) == (tmp_path / "results" / "mutate").resolve()
    assert out_folder("elsewhere") == (tmp_path / "elsewhere").resolve()


def test_a_subject_is_checked_then_given_to_every_run_of_the_selection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A scenario pinned to a client release (``client_versions:``) is mutated with that client playing."""
    from harness.mutate import runs

    assert cli.main(["mutate", "--mutants", str(MUTANTS), "--subject", "nobody", "scenarios/smoke.yaml"]) == 2
    assert "--subject" in capsys.readouterr().err
    seen: list[list[str]] = []

    class Started:
        def __init__(self, argv: list[str], **_: object) -> None:
            seen.append(argv)

        def wait(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", Started)
    runs.run_selection(tmp_path, ["scenarios/x.yaml"], tmp_path / "out", subject="modelexpress@0.8.0.dev20261026")
    runs.run_selection(tmp_path, ["scenarios/x.yaml"], tmp_path / "out")
    assert seen[0][-3:] == ["--subject", "modelexpress@0.8.0.dev20261026", "scenarios/x.yaml"]
    assert "--subject" not in seen[1]
