"""``mxchaos explore`` without processes: template validation (every problem located at its key
under ``explore``), folder collection skipping templates, the schedules drawn, and the search
loop with a fake runner (a run fails when its schedule holds a ``tcp_reset``): it finds the
failure, shrinks it to the one fault at the earliest time, reruns the minimal scenario for a
rate, writes the report, replays the failure from its example database, stops at its budget."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import cli
from harness.checks import NamedResult
from harness.errors import ScenarioInvalid
from harness.explore.report import write_report
from harness.explore.schedule import Schedule, scenario_data, schedules
from harness.explore.search import explore
from harness.explore.template import Template, load_template
from harness.record.timeline import History
from harness.scenario import FaultStep, Scenario, SleepStep, load_scenario, select
from harness.scenario.emit import scenario_text

TEMPLATE = """\
name: demo_explore
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
  - await: {process: reader-1, exit: true, code: any}
checks:
  - exit_codes: {name: sources survive, expect: {source-1: [0, KILL], source-2: [0, KILL]}}
explore:
  at_once: {min: 1, max: 3}
  windows:
    - {after: {process: reader-1, event: transfer_start}, within: 300ms}
  faults:
    - {kind: pause, target: {one_of: [source-1, source-2]}, duration: {range: [100ms, 1500ms]}}
    - {kind: kill, target: {one_of: [source-2, source-1]}}
    - {kind: tcp_reset, target: reader-1, peer: {source_of: reader-1}}
"""


def _template(tmp_path: Path, text: str = TEMPLATE) -> Template:
    path = tmp_path / "demo.explore.yaml"
    path.write_text(text)
    return load_template(path)


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ScenarioInvalid) as info:
        _template(tmp_path, text)
    return [i.render("t") for i in info.value.issues]


def test_a_template_loads_with_its_space_and_anchor(tmp_path: Path) -> None:
    t = _template(tmp_path)
    assert [f.kind for f in t.faults] == ["pause", "kill", "tcp_reset"]
    assert t.anchors == (3,)  # after the 4th step, the await of transfer_start
    assert t.faults[0].params[1].lo_ms == 100 and t.faults[0].params[1].hi_ms == 1500
    assert all(f.if_gone == "skip" for f in t.faults)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("kind: kill,", "kind: kil,", "t:21: explore.faults[1].kind: 'kil' is not a fault kind; did you mean 'kill'?"),
        ("[source-2, source-1]", "[source-2, source-9]", "t:21: explore.faults[1].target.one_of[1]: as a kill fault"),
        ("[100ms, 1500ms]", "[2s, 1s]", "t:20: explore.faults[0].duration.range: range [lo, hi] needs lo <= hi"),
        ("event: transfer_start}, within", "event: load_done}, within",
         "t:18: explore.windows[0].after: a window starts at a top-level await step"),
        ("{kind: kill,", "{kind: kill, name: k,", "t:21: explore.faults[1].name: a fault of explore.faults takes no name"),
        ("within: 300ms", "within: -1s", "t:18: explore.windows[0].within:"),
        ("at_once: {min: 1, max: 3}", "at_once: {min: 3, max: 1}", "t:16: explore.at_once:"),
    ],
)
def test_a_bad_template_names_the_line_the_key_and_the_rule(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in TEMPLATE
    problems = _problems(tmp_path, TEMPLATE.replace(old, new))
    assert any(p.startswith(expected) for p in problems), problems


def test_the_scenario_part_is_validated_by_the_ordinary_rules_at_its_own_lines(tmp_path: Path) -> None:
    problems = _problems(tmp_path, TEMPLATE.replace("start: reader-1", "start: reader-9"))
    assert any(p.startswith("t:10: steps[2].start: no process named 'reader-9'") for p in problems), problems


def test_a_file_without_explore_is_not_a_template(tmp_path: Path) -> None:
    problems = _problems(tmp_path, TEMPLATE.split("explore:")[0])
    assert problems == ["t:1: explore: a template needs an explore: section (the fault space: windows, faults, at_once); "
                        "a plain scenario runs with mxchaos run"]


def test_folders_skip_templates_but_a_template_is_no_scenario(tmp_path: Path) -> None:
    (tmp_path / "demo.explore.yaml").write_text(TEMPLATE)
    (tmp_path / "plain.yaml").write_text(TEMPLATE.split("explore:")[0])
    files, problems = select.collect_paths([str(tmp_path)])
    assert [f.name for f in files] == ["plain.yaml"] and not problems
    with pytest.raises(ScenarioInvalid, match="explore: unknown key"):
        load_scenario(tmp_path / "demo.explore.yaml")


def test_the_shipped_templates_load() -> None:
    root = Path(__file__).resolve().parents[4] / "scenarios"
    found = sorted(root.rglob("*.explore.yaml"))
    assert found
    for path in found:
        load_template(path)


def test_the_test_fixture_templates_load() -> None:
    root = Path(__file__).resolve().parents[3] / "fixtures" / "scenarios"
    found = sorted(root.rglob("*.explore.yaml"))
    assert found
    for path in found:
        load_template(path)


@pytest.mark.parametrize("zero", ["0", "0ms", "0s", "0.0s"])
def test_a_window_of_zero_fires_its_faults_back_to_back(tmp_path: Path, zero: str) -> None:
    t = _template(tmp_path, TEMPLATE.replace("within: 300ms", f"within: {zero}"))
    assert t.spec.windows[0].within == 0

    @settings(max_examples=10, deadline=None)
    @given(schedules(t))
    def drawn(schedule: Schedule) -> None:
        assert all(f.offset_ms == 0 for f in schedule.faults)  # no offset to draw
        data, _ = scenario_data(t, schedule)
        inserted = data["steps"][4:4 + len(schedule.faults)]
        assert [next(iter(step)) for step in inserted] == ["fault"] * len(schedule.faults)  # no sleep between them

    drawn()


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_drawn_schedule_is_a_valid_scenario_in_the_space(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    t = _template(tmp_path_factory.mktemp("t"))
    schedule = data.draw(schedules(t))
    assert 1 <= len(schedule.faults) <= 3
    sc_data, comments = scenario_data(t, schedule)
    text = scenario_text(sc_data, step_comments=comments)
    from harness.scenario import parse_scenario

    sc = parse_scenario(text, "s.yaml")
    faults = [s for s in sc.steps if isinstance(s, FaultStep)]
    assert len(faults) == len(schedule.faults)
    assert sum(s.sleep for s in sc.steps if isinstance(s, SleepStep)) <= 0.3 + 1e-9
    for f in schedule.faults:
        assert 0 <= f.offset_ms <= 300
        values = dict(f.values)
        if "duration" in values:
            assert 0.1 <= values["duration"] <= 1.5


# ---------------------------------------------------------------- the search, with a fake runner


@dataclass
class FakeResult:
    scenario: Scenario
    run_dir: Path
    verdict: str
    status: str = "completed"
    reason: str = ""
    seconds: float = 0.01
    checks: list[NamedResult] = field(default_factory=list)
    history: History = field(default_factory=lambda: History.build([]))


class FakeRunner:
    """Fails (source-1 aborted) whenever a tcp_reset is in the schedule; counts its runs."""

    runs: list[Scenario] = []

    def __init__(self, scenario: Scenario, *, out_dir: Path, **_: Any) -> None:
        self.scenario, self.out_dir = scenario, Path(out_dir)

    def run(self) -> FakeResult:
        FakeRunner.runs.append(self.scenario)
        run_dir = self.out_dir / self.scenario.name / f"run-{len(FakeRunner.runs)}"
        run_dir.mkdir(parents=True)
        kinds = [s.fault.kind for s in self.scenario.steps if isinstance(s, FaultStep)]
        bad = "tcp_reset" in kinds
        check = NamedResult(0, "exit_codes", "sources survive", not bad, "source-1 exited -6" if bad else "ok")
        return FakeResult(self.scenario, run_dir, "fail" if bad else "pass", checks=[check])


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[Scenario]:
    import harness.engine.runner
    import harness.reports.report

    FakeRunner.runs = []
    monkeypatch.setattr(harness.engine.runner, "Runner", FakeRunner)
    monkeypatch.setattr(harness.reports.report, "write_run_folder", lambda result: result.run_dir)
    return FakeRunner.runs


def test_it_finds_the_failure_and_shrinks_it_to_one_fault_at_the_earliest_time(tmp_path: Path, fake_runs: list[Scenario]) -> None:
    t = _template(tmp_path)
    out = tmp_path / "ex"
    ex = explore(t, seed=3, runs=25, budget_s=120, out_dir=out, repeat=3, echo=lambda _: None)
    assert ex.outcome == "found" and ex.minimal is not None
    by_index = {tr.index: tr for tr in ex.trials}
    minimal = by_index[ex.minimal].schedule
    assert [t.faults[f.choice].kind for f in minimal.faults] == ["tcp_reset"]
    assert minimal.faults[0].offset_ms == 0
    sizes = [len(by_index[i].schedule.faults) for i in ex.shrink_path]
    assert sizes == sorted(sizes, reverse=True) and ex.shrink_path[0] == ex.first_failure
    # the minimal scenario is an ordinary file with that one fault; it ran 3 more times, failing each
    minimal_sc = load_scenario(out / "minimal.yaml")
    assert minimal_sc.name == "demo_explore_minimal"
    assert [s.fault.kind for s in minimal_sc.steps if isinstance(s, FaultStep)] == ["tcp_reset"]
    assert ex.rate() == {"k": 3, "n": 3, "rate": 1.0, "lower": pytest.approx(0.368, abs=1e-3), "upper": 1.0, "confidence": 0.95}
    assert "reproduces in 3/3 runs" in (out / "minimal.yaml").read_text()
    # no schedule ran twice
    keys = [tr.schedule.key() for tr in ex.trials]
    assert len(keys) == len(set(keys))

    json_path, html_path = write_report(ex)
    data = json.loads(json_path.read_text())
    assert data["minimal"]["faults"][0]["kind"] == "tcp_reset"
    assert data["minimal"]["reproduction"]["rate"]["k"] == 3
    assert data["shrink_path"] == ex.shrink_path and data["failures"]
    page = html_path.read_text()
    assert "Minimal failing schedule" in page and "Shrinking path" in page
    first_run = Path(ex.trials[0].run_dir or "")
    assert f'href="{first_run.relative_to(out)}/report.html"' in page


def test_exploring_the_same_folder_again_replays_the_failure_first(tmp_path: Path, fake_runs: list[Scenario]) -> None:
    t = _template(tmp_path)
    out = tmp_path / "ex"
    explore(t, seed=5, runs=25, budget_s=120, out_dir=out, repeat=0, echo=lambda _: None)
    again = explore(t, seed=999, runs=25, budget_s=120, out_dir=out, repeat=0, echo=lambda _: None)
    assert again.trials[0].failed  # from the example database, before anything new is drawn


def test_no_run_starts_once_the_budget_is_spent(tmp_path: Path, fake_runs: list[Scenario]) -> None:
    t = _template(tmp_path)
    started = time.monotonic()
    ex = explore(t, seed=1, runs=10, budget_s=0.5, out_dir=tmp_path / "ex", echo=lambda _: None)
    assert time.monotonic() - started < 30
    assert not fake_runs and ex.outcome == "not_found" and ex.stop_reason == "budget spent"


def test_same_seed_same_schedules(tmp_path: Path, fake_runs: list[Scenario]) -> None:
    t = _template(tmp_path)
    a = explore(t, seed=11, runs=6, budget_s=120, out_dir=tmp_path / "a", repeat=0, echo=lambda _: None)
    b = explore(t, seed=11, runs=6, budget_s=120, out_dir=tmp_path / "b", repeat=0, echo=lambda _: None)
    assert [tr.schedule for tr in a.trials] == [tr.schedule for tr in b.trials]


def test_same_seed_same_schedules_whatever_the_process_imported(tmp_path: Path, fake_runs: list[Scenario],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Hypothesis sometimes draws from constants found in the project's loaded modules; under
    # pytest those depend on which tests ran before in the worker (a CI failure: seed 8 drew
    # other schedules there). Stand-in for "imported more": a pool full of small integers.
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    t = _template(tmp_path)
    a = explore(t, seed=11, runs=12, budget_s=120, out_dir=tmp_path / "a", repeat=0, echo=lambda _: None)
    crowded = Constants(integers=set(range(0, 400)), floats={0.25, 0.5, 1.5}, strings={"source-1", "x"})
    monkeypatch.setattr(providers, "_get_local_constants", lambda: crowded)
    providers.CONSTANTS_CACHE.cache.clear()
    b = explore(t, seed=11, runs=12, budget_s=120, out_dir=tmp_path / "b", repeat=0, echo=lambda _: None)
    assert [tr.schedule for tr in a.trials] == [tr.schedule for tr in b.trials]
    assert providers._get_local_constants() is crowded  # put back as it was


def test_same_seed_same_schedules_under_the_ci_profile(tmp_path: Path, fake_runs: list[Scenario]) -> None:
    # Hypothesis loads its "ci" profile when CI is set; that profile's derandomize replaced the
    # seed with a hash of the code (a CI failure: seed 8 drew other schedules there than here).
    t = _template(tmp_path)
    was = settings._current_profile or "default"
    settings.load_profile("default")
    try:
        a = explore(t, seed=8, runs=8, budget_s=120, out_dir=tmp_path / "a", repeat=0, echo=lambda _: None)
        settings.load_profile("ci")
        b = explore(t, seed=8, runs=8, budget_s=120, out_dir=tmp_path / "b", repeat=0, echo=lambda _: None)
        c = explore(t, seed=9, runs=8, budget_s=120, out_dir=tmp_path / "c", repeat=0, echo=lambda _: None)
    finally:
        settings.load_profile(was)
    assert [tr.schedule for tr in a.trials] == [tr.schedule for tr in b.trials]
    assert [tr.schedule for tr in b.trials] != [tr.schedule for tr in c.trials]  # the seed still decides


def test_schedule_keys_are_canonical() -> None:
    assert Schedule(()).key() == "[]"


# ---------------------------------------------------------------- the goals shrinker, pure


def _resets(t: Template, s: Schedule) -> bool:
    return any(t.faults[f.choice].kind == "tcp_reset" for f in s.faults)


def _three(t: Template) -> Schedule:
    from harness.explore.schedule import DrawnFault

    return Schedule((
        DrawnFault(1, (("target", "source-1"),), 0, 130),
        DrawnFault(2, (("target", "reader-1"), ("peer", {"source_of": "reader-1"})), 0, 275),
        DrawnFault(0, (("target", "source-2"), ("duration", 1.2)), 0, 40),
    ))


def test_the_goals_shrinker_deletes_faults_first_then_moves_to_the_earliest_time(tmp_path: Path) -> None:
    from harness.explore.shrink import shrink

    t = _template(tmp_path)
    asked: list[Schedule] = []

    def fails(s: Schedule, attempt: int) -> bool:
        asked.append(s)
        return _resets(t, s)

    steps = shrink(_three(t), t, fails)
    assert [goal for goal, _ in steps] == ["fewest faults", "fewest faults", "earliest times"]
    final = steps[-1][1]
    assert [(t.faults[f.choice].kind, f.offset_ms) for f in final.faults] == [("tcp_reset", 0)]
    assert len(asked[0].faults) == 2  # the first candidate already has a fault fewer


def test_a_deletion_that_passes_once_is_tried_again_and_the_budget_ends_it(tmp_path: Path) -> None:
    from harness.explore.shrink import DELETE_TRIES, shrink

    t = _template(tmp_path)
    attempts: list[int] = []

    def flaky(s: Schedule, attempt: int) -> bool:  # a failure that shows on the second run only
        attempts.append(attempt)
        return _resets(t, s) and attempt == 1

    steps = shrink(_three(t), t, flaky)
    assert DELETE_TRIES == 2 and steps and steps[0][0] == "fewest faults" and 1 in attempts
    calls = iter([False, None])
    assert shrink(_three(t), t, lambda s, a: next(calls)) == []  # None: no run may start; nothing accepted


def test_hypothesis_own_shrinker_can_be_chosen(tmp_path: Path, fake_runs: list[Scenario]) -> None:
    t = _template(tmp_path)
    ex = explore(t, seed=3, runs=25, budget_s=120, out_dir=tmp_path / "ex", repeat=0, shrinker="hypothesis", echo=lambda _: None)
    assert ex.outcome == "found" and ex.minimal is not None
    minimal = next(tr for tr in ex.trials if tr.index == ex.minimal)
    assert _resets(t, minimal.schedule) and ex.shrink_path[-1] == ex.minimal


def test_a_candidate_that_used_up_its_tries_is_not_asked_again(tmp_path: Path) -> None:
    from harness.explore.shrink import shrink

    t = _template(tmp_path)
    asked: list[str] = []

    def fails(s: Schedule, attempt: int) -> bool:  # a reset and one more fault
        asked.append(s.key())
        return _resets(t, s) and len(s.faults) >= 2

    steps = shrink(_three(t), t, fails)
    # the pause alone is a candidate again after each earlier reset is accepted: asked twice in all
    pause_alone = Schedule((_three(t).faults[2],)).key()
    assert len([g for g, _ in steps if g == "earliest times"]) >= 2
    assert asked.count(pause_alone) == 2


def test_the_cli_refuses_a_bad_template_or_budget_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.explore.yaml"
    bad.write_text(TEMPLATE.replace("kind: kill,", "kind: kil,"))
    assert cli.main(["explore", str(bad), "--budget", "1m"]) == 2
    assert "explore.faults[1].kind: 'kil' is not a fault kind" in capsys.readouterr().err
    good = tmp_path / "good.explore.yaml"
    good.write_text(TEMPLATE)
    assert cli.main(["explore", str(good), "--budget", "soon"]) == 2
    assert "--budget 'soon'" in capsys.readouterr().err


def test_the_cli_explores_and_exits_1_on_a_failure(tmp_path: Path, fake_runs: list[Scenario], capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.explore.yaml"
    good.write_text(TEMPLATE)
    out = tmp_path / "ex"
    assert cli.main(["explore", str(good), "--seed", "3", "--runs", "25", "--budget", "2m", "--repeat", "1", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"minimal scenario: {out / 'minimal.yaml'}" in printed
    assert (out / "explore.json").is_file() and (out / "explore.html").is_file()


def test_validate_checks_a_template_named_on_its_own_as_a_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.explore.yaml"
    good.write_text(TEMPLATE)
    assert cli.main(["validate", str(good)]) == 0
    assert "(template demo_explore: 4 processes, 5 steps, 1 checks)" in capsys.readouterr().out
    good.write_text(TEMPLATE.replace("within: 300ms", "within: -1s"))
    assert cli.main(["validate", str(good)]) == 2
    assert "explore.windows[0].within" in capsys.readouterr().err


def test_a_run_may_not_outlast_the_budget_and_a_run_cut_short_is_no_failure(tmp_path: Path, fake_runs: list[Scenario],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    t = _template(tmp_path)
    hung = FakeResult.__init__

    def hang(self: FakeResult, *args: Any, **kwargs: Any) -> None:
        hung(self, *args, **kwargs)
        self.verdict, self.status, self.checks = "hang", "hang", []

    monkeypatch.setattr(FakeResult, "__init__", hang)
    ex = explore(t, seed=1, runs=2, budget_s=5, out_dir=tmp_path / "ex", echo=lambda _: None)
    assert fake_runs and all(sc.budgets.run <= 5 for sc in fake_runs)  # 300s in the template
    assert ex.outcome == "not_found" and all(tr.inapplicable.startswith("cut short") for tr in ex.trials)
