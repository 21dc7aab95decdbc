"""``mxchaos runs``: the invocations under the results root newest first with their counts, one
scenario's runs from every invocation, and the prune by count or by a size budget (only folders
of ours; the newest always stays). Made-up folders in the saved shapes: nothing runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from harness import cli
from harness.commands.runs import parse_size
from harness.record.results import RESULTS_ENV, invocation_folders, prune_to_size, scenario_runs


def _invocation(root: Path, stamp: str, cells: dict[str, int], *, kib: int = 10, runs: tuple[str, ...] = ()) -> Path:
    folder = root / stamp
    folder.mkdir(parents=True)
    doc = {"night": stamp, "kind": "run", "scenarios": [], "passed": "FAIL" not in cells, "exit_code": 0, "seconds": 12.0,
           "counts": {"cells": cells}}
    (folder / "invocation.json").write_text(json.dumps(doc))
    (folder / "payload.bin").write_bytes(b"x" * kib * 1024)
    for run in runs:
        run_dir = folder / "smoke" / f"{stamp[:15]}.000001Z-{run}"
        run_dir.mkdir(parents=True)
        (run_dir / "scenario.json").write_text("{}")
        (run_dir / "verdict.json").write_text(json.dumps({"verdict": "pass", "reason": "", "checks": []}))
    return folder


def test_a_size_is_a_number_with_an_optional_binary_unit() -> None:
    assert parse_size("2G") == 2 << 30 and parse_size("500M") == 500 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("800k") == 800 << 10 and parse_size("1024") == 1024
    with pytest.raises(argparse.ArgumentTypeError, match="a size is a number"):
        parse_size("lots")


def test_pruning_to_a_size_deletes_the_oldest_first_and_never_the_newest(tmp_path: Path) -> None:
    old, mid, new = (_invocation(tmp_path, f"2026010{i}T000000Z", {"PASS": 1}, kib=100) for i in (1, 2, 3))
    (tmp_path / "mine").mkdir()  # a folder a person put there: not ours
    assert prune_to_size(tmp_path, 250 << 10, dry_run=True) == [(old, 100 * 1024 + len((old / "invocation.json").read_bytes()))]
    assert old.is_dir()  # a dry run deletes nothing
    deleted = prune_to_size(tmp_path, 250 << 10)
    assert [p for p, _ in deleted] == [old] and not old.exists() and mid.is_dir() and new.is_dir()
    assert [p for p, _ in prune_to_size(tmp_path, 1)] == [mid] and new.is_dir()  # over budget alone: still kept
    assert (tmp_path / "mine").is_dir()


def test_runs_lists_invocations_newest_first_and_a_scenarios_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))
    _invocation(tmp_path / "runs", "20260101T000000Z", {"PASS": 2}, runs=("aaa",))
    _invocation(tmp_path / "runs", "20260102T000000Z", {"PASS": 1, "FAIL": 1}, runs=("bbb",))
    assert cli.main(["runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("20260102T000000Z    FAILED  1 PASS, 1 FAIL") and lines[0].endswith("runs/20260102T000000Z/index.html")
    assert lines[1].startswith("20260101T000000Z    passed  2 PASS")
    assert "2 invocation(s) under runs" in lines[-1]
    assert cli.main(["runs", "smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["20260102T000000.000001Z-bbb", "20260101T000000.000001Z-aaa"]
    assert [r.verdict for r in scenario_runs(tmp_path / "runs", "smoke")] == ["pass", "pass"]
    assert cli.main(["runs", "nosuch"]) == 2
    assert "scenarios with runs: smoke" in capsys.readouterr().err
    assert cli.main(["runs", "--prune", "--keep", "1"]) == 0
    assert [p.name for p in invocation_folders(tmp_path / "runs")] == ["20260102T000000Z"]
    assert cli.main(["runs", "--keep", "1"]) == 2  # --keep alone: it goes with --prune
