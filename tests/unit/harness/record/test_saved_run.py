"""The saved run (``harness.record.saved``): each document written and read back through its one
typed class, errors that name the file and the key, and no other module of harness that reads
or writes one of these files itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from harness.record.rates import Rate, RunRecord, cell_of, write_summary
from harness.record.saved import (
    MATRIX,
    NIGHT,
    RUN_INFO,
    SUMMARY,
    VERDICT,
    MatrixDoc,
    NightDoc,
    RunInfo,
    SavedDoc,
    SavedDocError,
    SummaryDoc,
    VerdictDoc,
    read_json,
    run_verdict_files,
)

ROOT = Path(__file__).resolve().parents[4]
SAVED = ROOT / "harness" / "record" / "saved.py"
FILES = (RUN_INFO, VERDICT, SUMMARY, NIGHT, MATRIX, "invocation.json")

VERDICT_DOC = {
    "scenario": "smoke", "run_id": "smoke-1", "run_dir": "/r/smoke/1", "seed": 7, "verdict": "pass",
    "status": "completed", "reason": "", "failed_step": None, "started_at": "2026-12-06T07:00:00+00:00",
    "seconds": 3.2, "known_defect": None, "missing_capabilities": [],
    "not_exercised": ["fault cut (partition b): no effect: chain mxc-1: 0 packets (no hook jumps to it)"],
    "checks": [{"index": 0, "kind": "load", "name": "loaded", "valid": True, "summary": "ok", "details": {},
                "marks": [], "seconds": 0.1},
               {"index": 1, "kind": "nixl", "name": "rdma", "valid": "unknown", "summary": "?", "details": {},
                "marks": [], "seconds": 0.0}],
    "stacks": {}, "interrupted_by": None, "versions": {"nixl": "1.5.1"}, "repeat": None,
    "rejudged": {"at": "later", "previous_verdict": "fail"},  # a key the class does not declare: kept
}


@pytest.mark.parametrize("cls,doc", [
    (VerdictDoc, VERDICT_DOC),
    (RunInfo, {"run_id": "r1", "scenario": "smoke", "scenario_path": "scenarios/smoke.yaml", "run_dir": "/r/1",
               "run_dir_id": [1, 2], "harness_pid": 10, "harness_start": 99, "ssh": False, "started": "now",
               "t0_monotonic": 1.5, "network": {"bridge": "mxb1"}}),
    (SummaryDoc, {"repeat": 2, "scenarios": {"smoke": {"cell": "PASS", "rate": {"k": 0, "n": 2}, "bound": None,
                                                       "measured": None, "runs": [
                                                           {"verdict": "pass", "run_dir": "/a", "seed": 1, "seconds": 1.0,
                                                            "not_exercised": []},
                                                           {"verdict": "not_exercised", "run_dir": "/b", "seed": 2,
                                                            "seconds": 1.1, "not_exercised": ["fault f (pause s): no effect"]}]}}}),
    (NightDoc, {"night": "20261206T010000Z", "scenarios": [{"name": "smoke", "fails_night": False}], "passed": True,
                "exit_code": 0, "interrupted": False, "counts": {"ran": 1}}),
    (MatrixDoc, {"cells": {"smoke": {"nixl-1.5.1": {"verdict": "PASS"}}}, "columns": [{"id": "nixl-1.5.1"}]}),
])
def test_each_document_reads_back_as_it_was_written(tmp_path: Path, cls: type[SavedDoc], doc: dict[str, Any]) -> None:
    path = cls.in_folder(tmp_path)
    cls.parse(doc, "given").write(path)
    back = cls.read(path)
    assert back is not None and back.to_json() == doc
    if cls is not SummaryDoc:  # its run folders are saved relative to it: test_a_summary_keeps_its_runs_when_moved
        assert json.loads(path.read_text()) == doc
    assert not list(tmp_path.glob(".*.tmp")), "the atomic write left its temporary file"


def test_a_summary_keeps_its_runs_when_moved(tmp_path: Path) -> None:
    """summary.json names each run's folder relative to its own folder: moved (a CI artefact
    downloaded elsewhere), it still finds its runs; a relative path as given stays."""
    here = tmp_path / "inv"
    doc = {"repeat": 1, "scenarios": {"s": {"cell": "PASS", "runs": [
        {"verdict": "pass", "run_dir": str(here / "s" / "r1")}, {"verdict": "pass", "run_dir": "s/r2"}]}}}
    SummaryDoc.parse(doc, "given").write(SummaryDoc.in_folder(here))
    saved = json.loads(SummaryDoc.in_folder(here).read_text())
    assert [r["run_dir"] for r in saved["scenarios"]["s"]["runs"]] == [str(Path("s") / "r1"), "s/r2"]
    here.rename(tmp_path / "elsewhere")
    back = SummaryDoc.read(SummaryDoc.in_folder(tmp_path / "elsewhere"))
    assert back is not None
    assert [r.run_dir for _, r in back.runs()] == [str(tmp_path / "elsewhere" / "s" / "r1"), str(tmp_path / "elsewhere" / "s" / "r2")]


def test_the_summary_the_rates_write_is_a_summary_doc(tmp_path: Path) -> None:
    cell = cell_of("smoke", [RunRecord("pass", "/a", 1, 1.0), RunRecord("fail", "/b", 2, 2.0)], False, None)
    write_summary(tmp_path / SUMMARY, {"smoke": cell}, 2)
    doc = SummaryDoc.read(tmp_path / SUMMARY)
    assert doc is not None and doc.scenarios["smoke"].cell == cell.name == "FLAKY"
    assert [(n, r.verdict) for n, r in doc.runs()] == [("smoke", "pass"), ("smoke", "fail")]
    assert doc.scenarios["smoke"].rate == Rate(1, 2).to_json()


def test_a_missing_document_is_none_and_a_bad_one_names_the_file_and_the_key(tmp_path: Path) -> None:
    assert VerdictDoc.read(tmp_path / VERDICT) is None
    assert read_json(tmp_path / "absent.json") is None
    (tmp_path / VERDICT).write_text("{not json")
    with pytest.raises(SavedDocError, match=f"{tmp_path / VERDICT}: not JSON"):
        VerdictDoc.read(tmp_path / VERDICT)
    assert VerdictDoc.read_or_none(tmp_path / VERDICT) is None
    (tmp_path / VERDICT).write_text(json.dumps({"scenario": "s", "verdict": ["pass"]}))
    with pytest.raises(SavedDocError, match=r"not a verdict.json \(verdict: "):
        VerdictDoc.read(tmp_path / VERDICT)


def test_the_verdicts_of_an_out_folder_leave_out_the_latest_links(tmp_path: Path) -> None:
    run = tmp_path / "smoke" / "20261206T070000Z-abc"
    run.mkdir(parents=True)
    VerdictDoc.parse(VERDICT_DOC, "given").write(run / VERDICT)
    (tmp_path / "smoke" / "latest").symlink_to(run)
    assert run_verdict_files(tmp_path) == [run / VERDICT]


def test_a_failed_check_is_one_that_did_not_hold() -> None:
    doc = VerdictDoc.parse(VERDICT_DOC, "given")
    assert [c["name"] for c in doc.failed_checks()] == ["rdma"]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def saved_file_literals(source: str) -> list[tuple[int, str]]:
    """String constants that name a saved document's file as a path would (no spaces: a message
    or a help text names it to a person), outside docstrings and ``help=``/``metavar=`` values."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in ("help", "metavar"):
            skip |= {id(n) for n in ast.walk(node.value)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and not any(c.isspace() for c in node.value) and any(f in node.value for f in FILES)]


def test_the_literal_finder_finds_a_planted_read() -> None:
    planted = 'import json\ndef f(d):\n    """reads verdict.json"""\n    return json.loads((d / "verdict.json").read_text())\n'
    assert saved_file_literals(planted) == [(4, "verdict.json")]
    assert saved_file_literals('p.add_argument("--b", metavar="OLD/matrix.json", help="a matrix.json")\n') == []
    assert saved_file_literals('glob("*/*/verdict.json")\n') == [(1, "*/*/verdict.json")]


def test_no_module_but_the_saved_run_reads_or_writes_a_saved_document_itself() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {value!r}"
             for p in sorted((ROOT / "harness").rglob("*.py")) if p != SAVED
             for line, value in saved_file_literals(p.read_text())]
    assert not found, "read and write these through harness.record.saved:\n" + "\n".join(found)


def test_a_night_reads_its_scenarios_and_runs_typed_and_writes_back_only_what_it_read(tmp_path: Path) -> None:
    """nightly.json's entries are ``NightEntry`` (runs: ``NightRunEntry``): the comparison and the
    history read attributes, not keys; a partial entry writes back with the keys it had."""
    doc = {"night": "n2", "load": {"end": {"load1": 1.0}},
           "scenarios": [{"name": "coin", "cell": "FLAKY", "rate": {"k": 1, "n": 2}, "fails_night": True,
                          "path": "scenarios/coin.yaml", "median_seconds": 2,
                          "runs": [{"index": 1, "verdict": "fail", "report": "runs/coin/r1/report.html"}]},
                         {"name": "old", "cell": "REPRODUCED"}]}
    night = NightDoc.parse(doc, "given")
    coin, old = night.scenarios
    assert (coin.cell, coin.rate, coin.median_seconds, coin.runs[0].verdict) == ("FLAKY", {"k": 1, "n": 2}, 2.0, "fail")
    assert (old.cell, old.runs, old.fails_night) == ("XFAIL", [], False)
    assert night.failing() == {"coin": "scenarios/coin.yaml"} and night.load == {"end": {"load1": 1.0}}
    night.write(NightDoc.in_folder(tmp_path))
    assert json.loads(NightDoc.in_folder(tmp_path).read_text())["scenarios"][1] == {"name": "old", "cell": "XFAIL"}
    with pytest.raises(SavedDocError, match=r"scenarios\.0\.name"):
        NightDoc.parse({"scenarios": [{"cell": "PASS"}]}, "given")


MATRIX_DOC: dict[str, Any] = {
    "schema": 1, "created": "2026-12-07T00:20:00+00:00", "repeat": 1,
    "scenarios": [{"name": "smoke", "path": "/s/smoke.yaml", "defect": None},
                  {"name": "seg", "path": "/s/seg.yaml", "defect": {"versions": ["1.5.1"], "issue": "x"}}],
    "columns": [{"id": "nixl-1.5.1", "label": "NIXL 1.5.1", "nixl": "1.5.1", "subject": "", "mx_server": "",
                 "env": {}, "available": True, "error": None, "env_path": "/envs/1.5.1", "out_dir": "nixl-1.5.1",
                 "raw_read_gbps": 0.77, "raw_read_error": None, "raw_reads": {"8388608": 1.41, "67108864": 0.77},
                 "rc": 0, "schedule": {"lanes": [["smoke"], ["seg"]], "alone": []},
                 "slurm": {"nodes_per_lane": 1, "lanes": [
                     {"name": "lane-1", "scenarios": ["smoke", "seg"], "job": "12_0", "node": "h1", "nodes": "h1", "rc": 0,
                      "infra": None, "attempts": ["COMPLETED"], "ends": [{"job": "12_0", "state": "COMPLETED", "rc": 0}],
                      "gathered": [], "queued_to_start_s": 0.41}]},
                 "loaded_nixl": ["1.5.1"], "loaded_ucx": ["1.23.0"]},
                {"id": "nixl-1.5.2", "label": "NIXL 1.5.2", "nixl": "1.5.2", "subject": "", "mx_server": "",
                 "env": {}, "available": False, "error": "not installable: nixl: no", "env_path": "/envs/1.5.2",
                 "out_dir": "nixl-1.5.2", "loaded_nixl": [], "loaded_ucx": []}],
    "cells": {
        "smoke": {"nixl-1.5.1": {"verdict": "PASS", "verdicts": {"pass": 1}, "failures": {"k": 0, "n": 1},
                                 "rate": {"k": 0, "n": 1}, "bound": 0.95, "measured": None,
                                 "runs": [{"verdict": "pass", "run_dir": "/o/nixl-1.5.1/smoke/1", "seed": 3,
                                           "seconds": 2.5, "not_exercised": [], "link": "nixl-1.5.1/smoke/1"}],
                                 "seconds": 2.5, "detection_s": None, "recovery_s": None, "fallback_s": None,
                                 "read_gbps": 0.19, "read_ratio": 0.135, "nixl": ["1.5.1"], "ucx": ["1.23.0"],
                                 "subjects": {"mxref": "0.1"}, "servers": {}},
                  "nixl-1.5.2": {"verdict": "not_installable", "error": "not installable: nixl: no", "runs": [],
                                 "verdicts": {}, "failures": {"k": 0, "n": 0}}},
        "seg": {"nixl-1.5.1": {"verdict": "XFAIL", "failures": {"k": 1, "n": 1}, "seconds": 4.0,
                               "defect": {"expected": True, "observed": "reproduced", "headline": None}}},
    },
    "headlines": [{"scenario": "seg", "column": "nixl-1.5.1",
                   "text": "expected on NIXL 1.5.1, not reproduced in 1 of 1 runs: fixed in this release?"}],
    "baseline_changes": [
        {"scenario": "smoke", "column": "nixl-1.5.1", "kind": "rate", "old": {"k": 0, "n": 10}, "new": {"k": 6, "n": 10},
         "regression": True, "text": "failure rate 0/10 -> 6/10"},
        {"scenario": "smoke", "column": "nixl-1.5.1", "kind": "timing", "metric": "seconds", "old": 2, "new": 3.5,
         "regression": True, "text": "seconds grew 2s -> 3.5s (+75%)"},
        {"scenario": "seg", "column": "nixl-1.5.1", "kind": "verdict", "old": "pass", "new": "fail", "regression": True,
         "text": "verdict pass -> fail"},
        {"scenario": None, "column": "nixl-1.5.2", "kind": "column", "regression": False,
         "text": "a new column (not in the baseline)"}],
    "resolved": [{"spelling": "latest-nightly", "version": "0.8.0"}],  # a key MatrixDoc does not declare: kept
}


def test_a_matrix_reads_its_columns_and_cells_typed_and_writes_back_only_what_it_read(tmp_path: Path) -> None:
    """matrix.json's columns are ``MatrixColumn``, its cells ``MatrixCell`` (runs: ``MatrixRun``):
    the table, the page, the recap and the baseline diff read attributes; every cell and column
    writes back with exactly the keys it had (a not-installable cell keeps its five)."""
    path = MatrixDoc.in_folder(tmp_path)
    path.write_text(json.dumps(MATRIX_DOC))
    doc = MatrixDoc.read(path)
    assert doc is not None
    col, gone = doc.columns
    assert (col.id, col.available, col.raw_reads["8388608"], col.lanes_beside("smoke")) == ("nixl-1.5.1", True, 1.41, 2)
    assert (gone.available, gone.error, gone.lanes_beside("smoke")) == (False, "not installable: nixl: no", 1)
    smoke = doc.cell("smoke", "nixl-1.5.1")
    assert smoke is not None and smoke.runs[0].link == "nixl-1.5.1/smoke/1" and smoke.failed() == (0, 1)
    seg = doc.cell("seg", "nixl-1.5.1")
    assert seg is not None and seg.defect is not None
    assert (seg.defect.expected, seg.defect.observed, seg.defect.reproduced, seg.defect.headline) == (
        True, "reproduced", None, None)
    assert (seg.read_gbps, seg.runs, doc.cell("seg", "nixl-1.5.2")) == (None, [], None)
    assert doc.scenario_seconds() == {"smoke": 2.5, "seg": 4.0}
    assert col.schedule is not None and (col.schedule.lanes, col.schedule.alone) == ([["smoke"], ["seg"]], [])
    assert col.slurm is not None and col.slurm.nodes_per_lane == 1 and gone.slurm is None
    (lane,) = col.slurm.lanes
    assert (lane.name, lane.node, lane.rc, lane.attempts, lane.queued_to_start_s) == ("lane-1", "h1", 0, ["COMPLETED"], 0.41)
    assert lane.ends[0]["state"] == "COMPLETED"
    (head,) = doc.headlines
    assert (head.scenario, head.column) == ("seg", "nixl-1.5.1") and head.text.startswith("expected on NIXL 1.5.1")
    rate, timing, verdict, column = doc.baseline_changes or []
    assert (rate.kind, rate.old, rate.new, rate.regression) == ("rate", {"k": 0, "n": 10}, {"k": 6, "n": 10}, True)
    assert (timing.metric, timing.old, timing.new) == ("seconds", 2, 3.5) and isinstance(timing.old, int)
    assert (verdict.old, verdict.new) == ("pass", "fail")
    assert (column.scenario, column.kind, column.regression, column.metric) == (None, "column", False, None)
    assert [(s, c) for s, c, _ in doc.all_cells()] == [("smoke", "nixl-1.5.1"), ("smoke", "nixl-1.5.2"), ("seg", "nixl-1.5.1")]
    doc.write(path)
    assert json.loads(path.read_text()) == MATRIX_DOC
    built = MatrixDoc.model_validate({"cells": {}})  # built here, not read: only what it was given
    assert built.to_json() == {"cells": {}}
    with pytest.raises(SavedDocError, match=r"cells\.smoke\.c\.runs\.0\.seed"):
        MatrixDoc.parse({"cells": {"smoke": {"c": {"runs": [{"seed": "seven"}]}}}}, "given")


MATRIX_KEYS = ("cells", "columns", "scenarios", "headlines", "baseline_changes", "verdict", "verdicts", "failures",
               "runs", "link", "run_dir", "seconds", "detection_s", "recovery_s", "fallback_s", "read_gbps",
               "read_ratio", "loaded_nixl", "loaded_ucx", "raw_reads", "raw_read_gbps", "raw_read_error",
               "available", "schedule", "label", "error", "defect",
               # the typed parts: a headline, a baseline change, a known defect and its status, a schedule, a SLURM record
               "headline", "expected", "observed", "reproduced", "regression", "metric", "versions", "lanes", "alone",
               "slurm", "nodes_per_lane", "queued_to_start_s")
MATRIX_READERS = (*sorted((ROOT / "harness" / "matrix").glob("*.py")),
                  *(ROOT / "harness" / "record" / f for f in ("baseline.py", "cells.py")),
                  ROOT / "harness" / "reports" / "matrix_page.py", ROOT / "harness" / "nightly" / "compare.py")


def matrix_key_reads(source: str) -> list[tuple[int, str]]:
    """``x["verdict"]`` and ``x.get("verdict")`` with a key of a matrix document: a cell, a column,
    a run or the document itself read as a dict rather than through its class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            found.append((node.lineno, node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value))
    return [(line, key) for line, key in found if isinstance(key, str) and key in MATRIX_KEYS]


def test_the_key_read_finder_finds_a_planted_read() -> None:
    assert sorted(matrix_key_reads('def f(m):\n    return m["cells"]["a"].get("verdict")\n')) == [(2, "cells"), (2, "verdict")]
    assert matrix_key_reads('def f(c):\n    return c.verdict, h["text"]\n') == []


def test_no_matrix_reader_reads_a_matrix_document_by_key() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {key!r}" for p in MATRIX_READERS for line, key in matrix_key_reads(p.read_text())]
    assert not found, "read matrix.json's cells and columns through harness.record.saved.MatrixDoc:\n" + "\n".join(found)
