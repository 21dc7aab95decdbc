"""The projection of a matrix's wall time on N nodes (``harness.matrix.projection``): list
scheduling longest first, alone units on a node of their own, never under its lower bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import cli
from harness.matrix.projection import ProjectionInput, project, read_seconds
from harness.record.saved import SavedDocError


def test_one_node_runs_the_shared_units_side_by_side_and_the_alone_ones_by_themselves() -> None:
    given_ = ProjectionInput({"a": 10.0, "b": 10.0, "c": 10.0, "lone": 7.0}, frozenset({"lone"}),
                             releases=1, repeat=1, lanes_per_node=3)
    row = project(given_, 1)
    assert row.wall_s == pytest.approx(17.0)  # the lone unit holds the node 7 s, then a, b, c at once
    assert row.lower_bound_s == pytest.approx((30 + 7 * 3) / 3)


def test_more_nodes_than_units_is_the_longest_unit_and_overhead_is_paid_per_lane() -> None:
    given_ = ProjectionInput({"a": 4.0, "b": 2.0}, frozenset(), releases=3, repeat=5, lanes_per_node=1, overhead_s=1.5)
    row = project(given_, 64)
    assert row.wall_s == pytest.approx(4.0 * 5 + 1.5)
    assert project(given_, 1).wall_s == pytest.approx(3 * (20 + 1.5) + 3 * (10 + 1.5))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefghij"), st.floats(0.1, 100), min_size=1),
       st.sets(st.sampled_from("abcdefghij")), st.integers(1, 20), st.integers(1, 4), st.integers(1, 3))
def test_never_under_the_bound_and_never_past_twice_it(seconds: dict[str, float], alone: set[str], nodes: int,
                                                        lanes: int, releases: int) -> None:
    given_ = ProjectionInput(seconds, frozenset(alone), releases=releases, repeat=2, lanes_per_node=lanes)
    row = project(given_, nodes)
    assert row.wall_s >= row.lower_bound_s - 1e-9
    assert row.wall_s <= 2 * row.lower_bound_s * lanes + 1e-9  # alone units may idle a node's other lanes
    assert project(given_, nodes + 1).wall_s <= row.wall_s * 2 + 1e-9


def test_seconds_come_from_a_matrix_or_a_summary_and_bad_input_names_the_file(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"schema": 1, "cells": {"a": {"c1": {"seconds": 3.0}, "c2": {"seconds": 5.0}},
                                                         "b": {"c1": {"verdict": "ERROR"}}},
                                  "scenarios": [{"name": "a", "path": "scenarios/a.yaml"}]}))
    assert read_seconds(matrix) == ({"a": 5.0}, ["scenarios/a.yaml"])
    summary = tmp_path / "col" / "summary.json"
    summary.parent.mkdir()
    summary.write_text(json.dumps({"repeat": 3, "scenarios": {"a": {"cell": "PASS", "runs": [
        {"verdict": "pass", "seconds": 1.0}, {"verdict": "pass", "seconds": 9.0}, {"verdict": "fail", "seconds": 2.0}]}}}))
    assert read_seconds(summary.parent) == ({"a": 2.0}, [])
    with pytest.raises(SavedDocError, match=r"empty: no matrix.json or summary.json"):
        (tmp_path / "empty").mkdir()
        read_seconds(tmp_path / "empty")
    bad = tmp_path / "bad" / "matrix.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"cells": []}))
    with pytest.raises(SavedDocError, match=r"bad/matrix.json: not a matrix.json \(cells:"):
        read_seconds(bad)


def test_the_command_prints_a_row_per_node_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"schema": 1, "cells": {"smoke": {"c": {"seconds": 2.0}}}}))
    assert cli.main(["project", str(matrix), "--nodes", "1,2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["nodes"] for p in doc["projections"]] == [1, 2] and doc["unplaced"] == []
    assert doc["projections"][0]["wall_s"] == 10.0  # 3 releases x 5 runs x 2 s over 4 lanes: 3 lanes busy 10 s
    assert cli.main(["project", str(tmp_path / "nothing.json")]) == 2
    assert "nothing.json: no such file" in capsys.readouterr().err
