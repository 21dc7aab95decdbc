"""The repeat rule (``harness.record.rates``): cells from N verdicts, the Clopper-Pearson bound at
known k and n, the summary shape other tools read, and ``defect_rate`` in a scenario."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from harness.errors import ScenarioInvalid
from harness.record.rates import Rate, RunRecord, cell_of, parse_rate, runs_to_call_fixed, summary_json, upper_bound, write_summary
from harness.record.saved import SummaryDoc
from harness.scenario import parse_scenario


def runs(*verdicts: str) -> list[RunRecord]:
    return [RunRecord(v, f"/runs/s/{i}", 7 + i, 1.5) for i, v in enumerate(verdicts)]


# ---------------------------------------------------------------- the bound


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        (0, 1, 0.95),
        (0, 3, 1 - 0.05 ** (1 / 3)),  # 0.6316
        (0, 10, 0.2588655508930522),
        (1, 10, 0.3941633024),  # the tabulated one-sided 95% Clopper-Pearson upper limit
        (5, 5, 1.0),
        (0, 0, 1.0),
    ],
)
def test_the_upper_bound_at_known_k_and_n(k: int, n: int, expected: float) -> None:
    assert upper_bound(k, n) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("k", "n"), [(1, 10), (4, 6), (2, 3), (7, 20)])
def test_the_bound_is_where_seeing_at_most_k_has_probability_5_percent(k: int, n: int) -> None:
    p = upper_bound(k, n)
    cdf = math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
    assert cdf == pytest.approx(0.05, abs=1e-9)
    assert k / n < p < 1


def test_how_many_clean_runs_call_a_defect_fixed() -> None:
    assert runs_to_call_fixed(Rate(4, 6)) == 3  # 1 - 0.05^(1/3) = 0.632 < 0.667; at 2: 0.776
    assert runs_to_call_fixed(Rate(2, 3)) == 3
    assert runs_to_call_fixed(Rate(1, 10)) == 29  # 1 - 0.05^(1/29) = 0.098 < 0.1
    assert runs_to_call_fixed(Rate(0, 5)) is None


def test_rates_parse_as_k_of_n() -> None:
    assert parse_rate(" 4 / 6 ") == Rate(4, 6)
    for bad in ("7/6", "1/0", "often", "-1/3", "2/3/4"):
        with pytest.raises(ValueError):
            parse_rate(bad)


# ---------------------------------------------------------------- plain scenarios


def test_a_plain_scenario_passes_only_at_n_of_n() -> None:
    cell = cell_of("s", runs("pass", "pass", "pass"))
    assert (cell.name, cell.rate, cell.fails_run, cell.bound) == ("PASS", Rate(3, 3), False, None)


def test_a_plain_scenario_that_passes_sometimes_is_flaky_and_names_its_failing_runs() -> None:
    cell = cell_of("s", runs("pass", "fail", "pass", "hang"))
    assert (cell.name, cell.rate, cell.fails_run) == ("FLAKY", Rate(2, 4), True)
    assert [(r.verdict, r.run_dir, r.seed) for r in cell.failing_runs] == [("fail", "/runs/s/1", 8), ("hang", "/runs/s/3", 10)]


@pytest.mark.parametrize(
    ("verdicts", "cell"),
    [
        (("fail", "fail"), "FAIL"),
        (("fail", "unknown"), "UNKNOWN"),
        (("unknown", "error", "fail"), "ERROR"),
        (("error", "hang", "fail"), "HANG"),
        (("not_exercised", "not_exercised"), "NOT_EXERCISED"),  # a column of not-exercised runs does not pass
        (("not_exercised", "fail"), "FAIL"),
    ],
)
def test_zero_of_n_is_the_worst_verdict(verdicts: tuple[str, ...], cell: str) -> None:
    judged = cell_of("s", runs(*verdicts))
    assert (judged.name, judged.rate.k, judged.fails_run) == (cell, 0, True)


def test_a_run_not_exercised_beside_passes_is_flaky_not_a_pass() -> None:
    cell = cell_of("s", runs("pass", "not_exercised", "pass"))
    assert (cell.name, cell.rate, cell.fails_run) == ("FLAKY", Rate(2, 3), True)


def test_skip_stays_skip_and_skipped_runs_do_not_count() -> None:
    assert cell_of("s", runs("skip")).name == "SKIP"
    assert not cell_of("s", runs("skip")).fails_run
    assert cell_of("s", runs("pass", "skip")).rate == Rate(1, 1)
    assert cell_of("s", runs("skip"), known_defect=True, measured=Rate(4, 6)).name == "SKIP"


# ---------------------------------------------------------------- known defects


def test_a_known_defect_reproduces_at_one_run_in_n() -> None:
    cell = cell_of("d", runs("xpass", "xfail", "xpass"), known_defect=True, measured=Rate(4, 6))
    assert (cell.name, cell.rate, cell.fails_run, cell.measured) == ("XFAIL", Rate(1, 3), False, Rate(4, 6))
    assert cell.bound == pytest.approx(upper_bound(1, 3))


def test_a_known_defect_is_called_fixed_only_when_the_bound_is_below_the_measured_rate() -> None:
    small = cell_of("d", runs("xpass", "xpass"), known_defect=True, measured=Rate(4, 6))
    assert (small.name, small.fails_run) == ("XPASS", False)
    assert small.bound == pytest.approx(1 - 0.05**0.5)  # 0.776 >= 0.667
    assert "N too small to call it fixed: bound 0.776 >= measured 4/6 (0.667); needs N >= 3" in small.note
    fixed = cell_of("d", runs("xpass", "xpass", "xpass"), known_defect=True, measured=Rate(4, 6))
    assert (fixed.name, fixed.fails_run) == ("FIXED?", False)
    assert fixed.bound == pytest.approx(0.6315968501)
    assert "upper bound 0.632 < measured 4/6" in fixed.note
    rare = cell_of("d", runs(*["xpass"] * 10), known_defect=True, measured=Rate(1, 10))
    assert rare.name == "XPASS"  # 0.259 >= 0.1


def test_a_known_defect_without_a_measured_rate_is_never_called_fixed() -> None:
    cell = cell_of("d", runs(*["xpass"] * 50), known_defect=True)
    assert (cell.name, cell.measured) == ("XPASS", None)
    assert "no measured rate" in cell.note


def test_a_known_defect_whose_runs_did_not_get_to_the_defect_fails_the_run() -> None:
    cell = cell_of("d", runs("xfail", "hang", "xpass", "fail"), known_defect=True, measured=Rate(4, 6))
    assert (cell.name, cell.rate, cell.fails_run) == ("HANG", Rate(1, 4), True)
    assert [r.verdict for r in cell.failing_runs] == ["hang", "fail"]


# ---------------------------------------------------------------- the summary contract


def test_the_summary_has_exactly_the_documented_shape(tmp_path: Path) -> None:
    cells = {
        "plain": cell_of("plain", runs("pass", "fail")),
        "defect": cell_of("defect", runs("xpass", "xpass", "xpass"), known_defect=True, measured=Rate(4, 6)),
    }
    path = tmp_path / "out" / "summary.json"
    write_summary(path, cells, 3)
    saved = json.loads(path.read_text())
    back = SummaryDoc.read(path)
    assert back is not None and back.to_json() == summary_json(cells, 3)  # the run folders whole again
    assert set(saved) == {"repeat", "scenarios"} and saved["repeat"] == 3
    assert saved["scenarios"]["plain"] == {
        "cell": "FLAKY",
        "rate": {"k": 1, "n": 2},
        "bound": None,
        "measured": None,
        "runs": [
            {"verdict": "pass", "run_dir": os.path.relpath("/runs/s/0", path.parent), "seed": 7, "seconds": 1.5, "not_exercised": []},
            {"verdict": "fail", "run_dir": os.path.relpath("/runs/s/1", path.parent), "seed": 8, "seconds": 1.5, "not_exercised": []},
        ],
    }
    defect = saved["scenarios"]["defect"]
    assert (defect["cell"], defect["measured"], defect["bound"]) == ("FIXED?", {"k": 4, "n": 6}, 0.631597)
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # no temporary file left


# ---------------------------------------------------------------- defect_rate in a scenario

BASE = "name: demo\nprocesses: {s: {role: server}}\nsteps: [{start: s}]\n"


def test_a_scenario_states_the_rate_its_defect_was_measured_at() -> None:
    sc = parse_scenario(BASE + "known_defect: aborts\ndefect_rate: 4 / 6\n", "x.yaml")
    assert (sc.defect_rate, sc.measured_rate) == ("4/6", (4, 6))
    plain = parse_scenario(BASE + "known_defect: aborts\n", "x.yaml")
    assert (plain.known_defect, plain.measured_rate) == ("aborts", None)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("defect_rate: 1/2\n", "defect_rate is the measured rate of a known_defect"),
        ("known_defect: aborts\ndefect_rate: 7/6\n", "a rate k/n needs n >= 1 and k <= n"),
        ("known_defect: aborts\ndefect_rate: often\n", "is not a rate: write k/n"),
        ("known_defect: aborts\ndefect_rate: 3\n", "write the measured rate as k/n"),
    ],
)
def test_a_bad_defect_rate_is_invalid(extra: str, message: str) -> None:
    with pytest.raises(ScenarioInvalid, match=message):
        parse_scenario(BASE + extra, "x.yaml")


def test_the_known_defect_scenarios_state_their_measured_rate() -> None:
    from harness.scenario import load_scenario

    root = Path(__file__).resolve().parents[4] / "scenarios"
    defects = {p.stem: load_scenario(p) for p in sorted(root.glob("*.yaml"))}
    stated = {name: sc.measured_rate for name, sc in defects.items() if sc.known_defect}
    assert stated and all(stated.values()), stated
    assert stated["tcp_reset_aborts_source"] == (4, 6)
