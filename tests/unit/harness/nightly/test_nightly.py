"""``mxchaos nightly`` logic with fakes: the comparison of two nights, ``nightly.json``, the
page, the artifact caps, the inventory check and binding, and whole nights run through a fake
binding whose runs end as the test says (no process starts)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fixtures.htmltree import by_class, parse_html, text_of

from harness.cli import main
from harness.judge.verdict import RunResult
from harness.nightly.artifacts import cap_file, trim_run_folder
from harness.nightly.binding import Bound, InventoryBinding, InventoryError, inventory_summary
from harness.nightly.compare import compare_nights, count_changes
from harness.nightly.run import NightSpec, NothingToRun, find_previous, new_night_id, prune_nights, run_night
from harness.record.rates import Cell, Rate, RunRecord, cell_of
from harness.record.saved import NightDoc
from harness.record.timeline import History
from harness.reports.night import RunDetail, ScenarioNight, failures_of, night_json, night_passed
from harness.reports.night_page import render_night
from harness.scenario import Scenario, load_scenario, parse_scenario

# ------------------------------------------------------------------ helpers


def cell(name: str, verdicts: Sequence[str], *, defect: bool = False, measured: Rate | None = None,
         night: str = "n1", seconds: float = 2.0) -> Cell:
    runs = [RunRecord(v, f"/nights/{night}/runs/{name}/r{i}", i, seconds) for i, v in enumerate(verdicts)]
    return cell_of(name, runs, defect, measured)


def scenario_night(c: Cell, skip: str | None = None, defect: str | None = None) -> ScenarioNight:
    details = tuple(RunDetail("completed" if r.verdict != "error" else "error", "", ("loaded: 2.6s, later than 2.5s",) if r.verdict == "fail" else ())
                    for r in c.runs)
    return ScenarioNight(c.scenario, f"scenarios/{c.scenario}.yaml", c, {"a": "local"}, defect, skip, details)


def night(cells: Sequence[Cell | tuple[Cell, str]], name: str = "n1", interrupted: bool = False,
          previous: dict[str, Any] | None = None) -> dict[str, Any]:
    scenarios = [scenario_night(c[0], skip=c[1]) if isinstance(c, tuple) else scenario_night(c) for c in cells]
    passed = night_passed(scenarios, interrupted)
    doc = night_json(
        night=name, night_dir=Path(f"/nights/{name}"), started="2026-12-01T01:00:00+00:00",
        ended="2026-12-01T01:10:00+00:00", seconds=600.0, repeat=max([len(c.runs) for c in (x[0] if isinstance(x, tuple) else x for x in cells)] + [1]),
        seed=None, command=["mxchaos", "nightly", "--out", "/nights"], scenarios=scenarios, interrupted=interrupted,
        exit_code=0 if passed else 1, versions={"nixl": "1.5.1 (nixl)", "host": {"hostname": "h"}},
        hosts={"binding": "here", "inventory": None},
        artifacts={"bytes": 3 << 20, "log_cap_bytes": 262144, "capped": [], "removed": []},
    )
    if previous is not None:
        doc["previous"] = {"night": previous["night"], "dir": f"/nights/{previous['night']}"}
        doc["comparison"] = compare_nights(NightDoc.parse(previous, "old"), NightDoc.parse(doc, "new"))
    return doc


def skip_cell(name: str) -> tuple[Cell, str]:
    return Cell(name, "SKIP", Rate(0, 0), (), note="this machine lacks root"), "this machine lacks root"


# ------------------------------------------------------------------ nightly.json


def test_the_night_json_holds_cells_rates_links_and_counts() -> None:
    doc = night([cell("smoke", ["pass", "pass"]), cell("coin", ["pass", "fail"]),
                 cell("defect", ["xfail", "xpass"], defect=True, measured=Rate(2, 3)), skip_cell("netns_only")])
    assert doc["counts"] == {"scenarios": 4, "ran": 3, "skipped": 1, "runs": 6, "failing": 1,
                             "cells": {"FLAKY": 1, "PASS": 1, "XFAIL": 1, "SKIP": 1}}
    assert doc["passed"] is False and doc["exit_code"] == 1
    by = {s["name"]: s for s in doc["scenarios"]}
    assert by["coin"]["cell"] == "FLAKY" and by["coin"]["rate"] == {"k": 1, "n": 2} and by["coin"]["fails_night"]
    assert by["coin"]["failures"] == {"k": 1, "n": 2} and by["coin"]["median_seconds"] == 2.0
    assert [r["run_dir"] for r in by["smoke"]["runs"]] == ["runs/smoke/r0", "runs/smoke/r1"]  # relative to the night
    assert by["smoke"]["runs"][1]["report"] == "runs/smoke/r1/report.html"
    assert by["defect"]["bound"] == pytest.approx(0.974679, abs=1e-6) and by["defect"]["measured"] == {"k": 2, "n": 3}
    assert by["defect"]["failures"] == {"k": 1, "n": 2}  # xfail counts as a failure, as in the matrix
    assert by["netns_only"]["skip"] == "this machine lacks root" and by["netns_only"]["runs"] == []
    json.dumps(doc)  # serialisable as it is


@pytest.mark.parametrize(
    ("cells", "interrupted", "passed"),
    [
        ([["pass", "pass"]], False, True),
        ([["pass", "pass"], ["pass", "fail"]], False, False),  # FLAKY fails the night
        ([["fail", "fail"]], False, False),
        ([["pass"]], True, False),  # interrupted
        ([], False, False),  # nothing ran
    ],
)
def test_a_night_passes_only_when_no_cell_fails_and_something_ran(cells: list[list[str]], interrupted: bool, passed: bool) -> None:
    scenarios = [scenario_night(cell(f"s{i}", v)) for i, v in enumerate(cells)]
    assert night_passed(scenarios, interrupted) is passed


def test_a_reproduced_defect_or_skip_does_not_fail_the_night() -> None:
    scenarios = [scenario_night(cell("d", ["xfail", "xfail"], defect=True)), scenario_night(skip_cell("s")[0], "root")]
    scenarios.append(scenario_night(cell("p", ["pass", "pass"])))
    assert night_passed(scenarios, False)
    only_skips = [scenario_night(skip_cell("s")[0], "root")]
    assert not night_passed(only_skips, False)


def test_failures_count_bad_runs_over_runs_not_skipped() -> None:
    assert failures_of(cell("x", ["pass", "hang", "error", "skip"])) == Rate(2, 3)


# ------------------------------------------------------------------ comparison


def test_the_comparison_lists_newly_failing_fixed_and_other_changes() -> None:
    old = night([cell("steady", ["pass", "pass"]), cell("breaks", ["pass", "pass"]), cell("heals", ["fail", "fail"]),
                 cell("defect", ["xfail", "xfail"], defect=True, measured=Rate(1, 2)), cell("gone", ["pass", "pass"]),
                 cell("skipped_now", ["fail", "fail"])], name="n1")
    new = night([cell("steady", ["pass", "pass"], night="n2"), cell("breaks", ["pass", "fail"], night="n2"),
                 cell("heals", ["pass", "pass"], night="n2"),
                 cell("defect", ["xpass", "xpass"], defect=True, measured=Rate(1, 2), night="n2"),
                 skip_cell("skipped_now"), cell("fresh", ["hang", "hang"], night="n2")], name="n2", previous=old)
    comp = new["comparison"]
    assert comp["against"] == "n1"
    assert [(i["scenario"], i["old"], i["new"]) for i in comp["newly_failing"]] == [("breaks", "PASS", "FLAKY"), ("fresh", None, "HANG")]
    assert comp["newly_failing"][0]["text"] == "newly failing: PASS 2/2 -> FLAKY 1/2"
    assert comp["newly_failing"][0]["failing_runs"] == [{"index": 2, "verdict": "fail", "report": "runs/breaks/r1/report.html"}]
    assert [(i["scenario"], i["text"]) for i in comp["fixed"]] == [("heals", "fixed: FAIL 0/2 -> PASS 2/2")]
    assert [(i["scenario"], i["old"], i["new"]) for i in comp["other"]] == [
        ("defect", "XFAIL", "XPASS"), ("skipped_now", "FAIL", "SKIP")]  # a skip is not a fix
    assert comp["new_scenarios"] == ["fresh"] and comp["gone_scenarios"] == ["gone"]
    assert comp["rates_moved"] == []  # two runs a side: every move is inside the bounds
    assert count_changes(comp)["newly_failing"] == 2 and count_changes(None)["fixed"] == 0


def test_a_rate_moves_only_beyond_its_confidence_bounds() -> None:
    old = night([cell("moved", ["pass"] * 10), cell("noise", ["pass"] * 9 + ["fail"])], name="n1")
    new = night([cell("moved", ["pass"] * 4 + ["fail"] * 6, night="n2"), cell("noise", ["pass"] * 8 + ["fail"] * 2, night="n2")],
                name="n2", previous=old)
    moved = new["comparison"]["rates_moved"]
    assert [(m["scenario"], m["old"], m["new"], m["up"]) for m in moved] == [("moved", {"k": 0, "n": 10}, {"k": 6, "n": 10}, True)]
    assert "do not overlap" in moved[0]["text"]
    back = night([cell("moved", ["pass"] * 10, night="n3")], name="n3", previous=new)
    assert [(m["scenario"], m["up"]) for m in back["comparison"]["rates_moved"]] == [("moved", False)]


def test_a_slower_night_is_listed_but_fails_nothing() -> None:
    old = night([cell("s", ["pass", "pass"], seconds=4.0)], name="n1")
    new = night([cell("s", ["pass", "pass"], seconds=9.0, night="n2")], name="n2", previous=old)
    assert [i["text"] for i in new["comparison"]["slower"]] == ["median run grew 4s -> 9s (+125%)"]
    assert new["passed"]
    loaded = night([cell("s", ["pass", "pass"], seconds=9.0, night="n2")], name="n2")
    loaded["load"] = {"end": {"load1": 6.0, "cpus": 2, "per_cpu": 3.0}}
    assert compare_nights(NightDoc.parse(old, "old"), NightDoc.parse(loaded, "new"))["slower"][0]["text"].endswith(" (machine: ? then, load 6 on 2 CPUs (3 per CPU) now)")
    same = night([cell("s", ["pass", "pass"], seconds=4.3, night="n3")], name="n3", previous=old)
    assert same["comparison"]["slower"] == []  # +7%, 0.3 s: noise


# ------------------------------------------------------------------ page


def test_the_page_shows_counts_the_comparison_and_a_row_per_scenario_with_run_links() -> None:
    old = night([cell("smoke", ["pass", "pass"]), cell("coin", ["pass", "pass"])], name="n1")
    new = night([cell("smoke", ["pass", "pass"], night="n2"), cell("coin", ["pass", "fail"], night="n2"), skip_cell("<netns>")],
                name="n2", previous=old)
    page = render_night(new)
    assert "mxchaos nightly n2" in page and ">FAILED</span>" in page
    assert "<b>1</b> failing" in page and "<b>1</b> FLAKY" in page
    assert 'Since night <a href="../n1/index.html">n1</a>' in page
    assert "Newly failing (1)" in page and "newly failing: PASS 2/2 -&gt; FLAKY 1/2" in page
    assert '<a href="runs/coin/r1/report.html">run 2: fail</a>' in page
    tree = parse_html(page)
    rows = {(r.find("th").text or "").strip(): r for r in by_class(tree, "table", "scenarios")[0].iter("tr") if r.find("td") is not None}  # type: ignore[union-attr]
    chips = {name: [(a.get("data-verdict"), a.get("href"), text_of(a)) for a in by_class(r, "a", "chip")] for name, r in rows.items()}
    assert chips["coin"] == [("pass", "runs/coin/r0/report.html", "\u2713 1"), ("fail", "runs/coin/r1/report.html", "\u2717 2")]
    assert [text_of(w) for w in by_class(rows["coin"], "div", "why")] == ["run 2: loaded: 2.6s, later than 2.5s"]  # beside it
    assert page.count('class="why"') == 1
    assert "skipped: this machine lacks root" in page
    assert "&lt;netns&gt;" in page and "<netns>" not in page  # escaped
    assert re.search(r'class="since newfail">newly failing', page)


def test_the_first_night_says_there_is_nothing_to_compare() -> None:
    page = render_night(night([cell("smoke", ["pass"])]))
    assert "The first night in this folder: nothing to compare." in page and ">PASSED</span>" in page


# ------------------------------------------------------------------ artifacts


def test_a_log_over_the_cap_keeps_its_head_and_tail_at_line_ends(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    lines = [f"line {i:05d}\n" for i in range(2000)]  # 11 bytes each: 22000 bytes
    log.write_text("".join(lines))
    cut = cap_file(log, 4000)
    text = log.read_text()
    assert cut > 0 and len(text.encode()) < 4000 + 100
    head, marker, tail = text.partition("[... mxchaos nightly: ")
    assert head == "".join(lines[: len(head) // 11]) and tail.endswith("line 01999\n")
    assert f"{cut} bytes cut here (logs capped at 4000 bytes) ...]\n" in marker + tail
    assert 22000 - cut == len(head) + len(tail.partition("...]\n")[2])
    before = log.read_bytes()
    assert cap_file(log, 10_000) == 0 and log.read_bytes() == before  # a file within its cap is left alone


def test_trimming_removes_checkpoint_copies_and_caps_logs_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "procs").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "reader-1.tampered.safetensors").write_bytes(b"x" * 5000)
    (run / "stray.safetensors").write_bytes(b"y" * 10)
    (run / "procs" / "reader-1.log").write_text("z\n" * 5000)
    (run / "procs" / "reader-1.events.jsonl").write_text('{"e": 1}\n' * 5000)
    (run / "timeline.jsonl").write_text('{"t": 0}\n' * 5000)
    trimmed = trim_run_folder(run, cap=1000)
    assert trimmed["removed"] == [{"path": "checkpoints/", "bytes": 5000}, {"path": "stray.safetensors", "bytes": 10}]
    assert [(c["path"], c["bytes"]) for c in trimmed["capped"]] == [("procs/reader-1.log", 10000)]
    assert not (run / "checkpoints").exists() and not (run / "stray.safetensors").exists()
    assert (run / "timeline.jsonl").stat().st_size == 45000  # what `mxchaos check` re-judges stays whole
    assert (run / "procs" / "reader-1.events.jsonl").stat().st_size == 45000


# ------------------------------------------------------------------ inventory and binding


def test_an_inventory_must_be_a_readable_yaml_mapping(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"--inventory .*nope.yaml: no such file"):
        inventory_summary(tmp_path / "nope.yaml")
    with pytest.raises(InventoryError, match="a folder"):
        inventory_summary(tmp_path)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InventoryError, match=r"list.yaml: the inventory must be a YAML mapping"):
        inventory_summary(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("hosts: [unclosed\n")
    with pytest.raises(InventoryError, match=r"bad.yaml: not YAML"):
        inventory_summary(tmp_path / "bad.yaml")
    (tmp_path / "inv.yaml").write_text("machines:\n  gpu-b: {address: 10.0.0.2}\n  gpu-a: {address: 10.0.0.1}\n")
    summary = inventory_summary(tmp_path / "inv.yaml")
    assert summary["machines"] == ["gpu-a", "gpu-b"] and len(summary["sha256"]) == 64


SCENARIO = "name: {name}\nprocesses: {{c: {{role: command, argv: [x]}}}}\nsteps: [{{start: c}}]\n"


def scenario(name: str, folder: Path | None = None) -> Scenario:
    """A one-process scenario; read from a file in ``folder`` (so it has a path) when given."""
    text = SCENARIO.format(name=name)
    if folder is None:
        return parse_scenario(text, f"{name}.yaml")
    (folder / f"{name}.yaml").write_text(text)
    return load_scenario(folder / f"{name}.yaml")


def test_an_inventory_binds_hosts_by_its_rule_and_skips_a_scenario_it_cannot_bind(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("machines:\n  m1: {address: 10.0.0.1}\n")
    binding = InventoryBinding(inv)
    assert binding.bind(scenario("a")).hosts == {"local": "m1"}  # the next free machine
    two = parse_scenario("name: two\nhosts: {x: netns, y: netns}\nprocesses: {c: {role: command, argv: [x], host: x}}\n"
                         "steps: [{start: c}]\n", "two.yaml")
    bound = binding.bind(two)
    assert bound.skip and "host 'y' cannot be bound" in bound.skip and "inv.yaml" in bound.skip
    with pytest.raises(NothingToRun, match=r"no scenario can be bound or run here \(inventory\):\n  two: "):
        run_night(NightSpec([two], tmp_path / "out"), binding)
    assert not (tmp_path / "out").exists()  # no folder for a night that ran nothing


def test_an_invalid_inventory_is_an_error_naming_the_file_and_key(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("machines:\n  m1: {adress: 10.0.0.1}\n")
    with pytest.raises(InventoryError, match=r"inv.yaml.*adress"):
        InventoryBinding(inv)


# ------------------------------------------------------------------ whole nights, fake runs


class ScriptedBinding:
    """Runs nothing: each run of a scenario ends with the next verdict of its script."""

    name = "scripted"

    def __init__(self, script: dict[str, list[str]], skip: dict[str, str] | None = None) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.skip = skip or {}

    def bind(self, sc: Scenario) -> Bound:
        return Bound({"a": "local"}, self.skip.get(sc.name))

    def prepare(self, scenarios: Sequence[Scenario], runs_dir: Path, repeat: int, seed: int | None) -> None:
        pass

    def run(self, sc: Scenario, out_dir: Path, observers: Sequence[Any]) -> RunResult:
        verdict = self.script[sc.name].pop(0)
        run_dir = (out_dir / sc.name / f"seed{sc.seed}").resolve()
        (run_dir / "procs").mkdir(parents=True)
        (run_dir / "procs" / "c.log").write_text("chatter\n" * 100_000)  # 800 kB: over the cap
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "c.tampered.safetensors").write_bytes(b"\0" * 4096)
        status = {"hang": "hang", "error": "error", "skip": "skipped", "interrupted": "interrupted"}.get(verdict, "completed")
        verdict = "error" if verdict == "interrupted" else verdict
        return RunResult(sc, f"id-{sc.name}-{sc.seed}", run_dir, status, "", verdict, History(()), [],
                         "2026-12-01T01:00:00+00:00", 1.5, sc.seed)


def test_two_nights_through_a_fake_binding_write_the_folder_and_compare(tmp_path: Path) -> None:
    out = tmp_path / "nights"
    scenarios = [scenario("steady", tmp_path), scenario("coin", tmp_path), scenario("rooty", tmp_path)]
    first = run_night(NightSpec(scenarios, out, repeat=2), ScriptedBinding({"steady": ["pass", "pass"], "coin": ["pass", "pass"]},
                                                                          skip={"rooty": "this machine lacks root"}))
    assert first.exit_code == 0 and first.night["passed"] and first.night["comparison"] is None
    d = first.night_dir
    assert (out / "latest").resolve() == d.resolve()
    for name in ("nightly.json", "index.html", "junit.xml", "runs/summary.json"):
        assert (d / name).is_file(), name
    junit = (d / "junit.xml").read_text()
    assert 'name="mxchaos.nightly"' in junit and junit.count("<testcase ") == 3 and 'skipped="1"' in junit
    saved = json.loads((d / "nightly.json").read_text())
    assert saved == json.loads(json.dumps(first.night, default=str))
    assert saved["counts"]["cells"] == {"PASS": 2, "SKIP": 1}
    art = saved["artifacts"]
    assert art["log_cap_bytes"] == 256 << 10 and len(art["capped"]) == 4 and len(art["removed"]) == 4
    assert art["bytes"] < 4 * (300 << 10)  # four 800 kB logs were capped, the checkpoint copies removed
    run0 = saved["scenarios"][0]["runs"][0]
    assert run0["run_dir"] == "runs/steady/seed0" and (d / run0["report"]).is_file()
    assert run0["failed_checks"] == [] and saved["scenarios"][0]["path"] == str(tmp_path / "steady.yaml")
    assert json.loads((d / "runs/steady/seed0/verdict.json").read_text())["repeat"]["cell"] == "PASS"

    second = run_night(NightSpec(scenarios, out, repeat=2), ScriptedBinding({"steady": ["pass", "pass"], "coin": ["pass", "fail"],
                                                                            "rooty": ["pass", "pass"]}))
    assert second.exit_code == 1 and not second.night["passed"]
    assert second.night["previous"]["night"] == d.name
    comp = second.night["comparison"]
    assert [(i["scenario"], i["new"]) for i in comp["newly_failing"]] == [("coin", "FLAKY")]
    assert [(i["scenario"], i["old"], i["new"]) for i in comp["other"]] == [("rooty", "SKIP", "PASS")]
    assert (out / "latest").resolve() == second.night_dir.resolve()
    page = (second.night_dir / "index.html").read_text()
    assert f'Since night <a href="../{d.name}/index.html">' in page and "Newly failing (1)" in page


def test_a_scenario_that_skips_at_run_time_stops_repeating(tmp_path: Path) -> None:
    done = run_night(NightSpec([scenario("s"), scenario("p")], tmp_path, repeat=3),
                     ScriptedBinding({"s": ["skip", "pass", "pass"], "p": ["pass"] * 3}))
    by = {s["name"]: s for s in done.night["scenarios"]}
    assert by["s"]["cell"] == "SKIP" and len(by["s"]["runs"]) == 1 and done.exit_code == 0


def test_night_ids_are_utc_stamps_made_unique(tmp_path: Path) -> None:
    when = dt.datetime(2026, 12, 1, 1, 30, tzinfo=dt.UTC)
    assert new_night_id(tmp_path, when) == "20261201T013000Z"
    (tmp_path / "20261201T013000Z").mkdir()
    assert new_night_id(tmp_path, when) == "20261201T013000Z-2"


def test_the_night_before_is_latest_else_the_newest_readable_one(tmp_path: Path) -> None:
    assert find_previous(tmp_path) is None
    a, b, b10, c = "20261201T010000Z", "20261202T010000Z-2", "20261202T010000Z-10", "20261203T010000Z"
    for name in (a, b, b10, c, "zzz"):
        (tmp_path / name).mkdir()
    for name in (a, b, b10, "zzz"):
        (tmp_path / name / "nightly.json").write_text(json.dumps({"night": name, "scenarios": []}))
    (tmp_path / c / "nightly.json").write_text("{torn")
    found = find_previous(tmp_path)  # the newest readable night; "zzz" is not named as a night
    assert found is not None and found[0].name == b10
    (tmp_path / "latest").symlink_to(a)
    found = find_previous(tmp_path)
    assert found is not None and found[0].name == a
    found = find_previous(tmp_path, exclude=a)
    assert found is not None and found[0].name == b10


# ------------------------------------------------------------------ the command


def test_the_command_refuses_bad_input_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    smoke = str(Path(__file__).resolve().parents[4] / "scenarios" / "smoke.yaml")
    assert main(["nightly", "--out", str(tmp_path / "o"), "--repeat", "0", smoke]) == 2
    assert "argument --repeat: 0: give a number of runs >= 1" in capsys.readouterr().err
    assert main(["nightly", "--out", str(tmp_path / "o"), "--inventory", str(tmp_path / "inv.yaml"), smoke]) == 2
    assert f"--inventory {tmp_path / 'inv.yaml'}: no such file" in capsys.readouterr().err
    (tmp_path / "inv.yaml").write_text("hosts: {a: {address: 127.0.0.1}}\n")  # not an inventory's keys
    assert main(["nightly", "--out", str(tmp_path / "o"), "--inventory", str(tmp_path / "inv.yaml"), smoke]) == 2
    err = capsys.readouterr().err
    assert "inv.yaml:1: hosts: unknown key (allowed: bind, defaults, machines)" in err
    assert main(["nightly", "--out", str(tmp_path / "o"), str(tmp_path / "missing.yaml")]) == 2
    assert not (tmp_path / "o").exists()


class InterruptedBinding(ScriptedBinding):
    """Ctrl-C arrives between runs, when scenario ``at`` is to start."""

    def __init__(self, script: dict[str, list[str]], at: str) -> None:
        super().__init__(script)
        self.at = at

    def run(self, sc: Scenario, out_dir: Path, observers: Sequence[Any]) -> RunResult:
        if sc.name == self.at:
            raise KeyboardInterrupt
        return super().run(sc, out_dir, observers)


@pytest.mark.parametrize("how", ["ctrl-c between runs", "a run interrupted"])
def test_an_interrupted_night_is_written_with_what_it_judged_and_exits_130(tmp_path: Path, how: str) -> None:
    scenarios = [scenario("first"), scenario("second"), scenario("third")]
    if how == "ctrl-c between runs":
        binding: Any = InterruptedBinding({"first": ["pass", "pass"]}, at="second")
    else:
        binding = ScriptedBinding({"first": ["pass", "pass"], "second": ["interrupted"]})
    done = run_night(NightSpec(scenarios, tmp_path, repeat=2), binding)
    assert done.exit_code == 130 and done.night["interrupted"] and not done.night["passed"]
    names = [s["name"] for s in done.night["scenarios"]]
    assert names == (["first"] if how == "ctrl-c between runs" else ["first", "second"])
    assert json.loads((done.night_dir / "nightly.json").read_text())["interrupted"] is True
    assert "(interrupted)" in (done.night_dir / "index.html").read_text()


def test_keep_prunes_only_the_oldest_night_folders(tmp_path: Path) -> None:
    names = ["20261201T010000Z", "20261201T010000Z-2", "20261201T010000Z-10", "20261203T010000Z"]  # -10 after -2
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "nightly.json").write_text("{}")
    (tmp_path / "20261130T010000Z").mkdir()  # no nightly.json: not a night
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "nightly.json").write_text("{}")  # not named as a night
    assert [p.name for p in prune_nights(tmp_path, 2)] == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261130T010000Z", *names[2:], "notes"]
    with pytest.raises(ValueError, match="keep at least"):
        prune_nights(tmp_path, 0)


def test_a_night_with_keep_leaves_the_newest_nights(tmp_path: Path) -> None:
    script = {"s": ["pass"] * 3}
    for _ in range(3):
        run_night(NightSpec([scenario("s")], tmp_path, keep=2), ScriptedBinding(script))
    nights = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("latest", "history.html"))
    assert len(nights) == 2 and (tmp_path / "latest").resolve().name == nights[-1]


def test_eight_runs_wrap_as_chips_in_one_column_and_a_loaded_run_says_so() -> None:
    c = cell("wide", ["pass"] * 7 + ["fail"])
    sn = scenario_night(c)
    loaded = (*sn.details[:-1], RunDetail("completed", "", ("elapsed: 3.2s, later than 2s",), "load 5.1 on 2 CPUs"))
    doc = night_json(night="n8", night_dir=Path("/nights/n8"), started="s", ended="e", seconds=1.0, repeat=8, seed=None,
                     command=[], scenarios=[ScenarioNight("wide", "w.yaml", c, {}, None, None, loaded)], interrupted=False,
                     exit_code=1, versions={}, hosts={}, artifacts={})
    tree = parse_html(render_night(doc))
    table = by_class(tree, "table", "scenarios")[0]
    header, row = list(table.iter("tr"))
    assert [text_of(th) for th in header.iter("th")] == ["scenario", "cell", "passed / ran", "median", "runs"]  # no column per run
    strip = by_class(row, "div", "chips")
    assert len(strip) == 1 and len(by_class(strip[0], "a", "chip")) == 8
    assert "flex-wrap:wrap" in "".join(s.text or "" for s in tree.iter("style"))
    assert [text_of(w) for w in by_class(row, "div", "why")] == ["run 8: elapsed: 3.2s, later than 2s (machine load 5.1 on 2 CPUs)"]


def test_four_nights_say_still_failing_since_flaky_and_fixed_and_draw_a_strip_per_scenario(tmp_path: Path) -> None:
    out = tmp_path / "nights"
    script = {"stuck": ["pass", "fail", "fail", "fail"], "coin": ["pass", "fail", "pass", "fail"], "mended": ["fail", "fail", "fail", "pass"]}
    binding = ScriptedBinding(script)
    outcomes = []
    for day in range(1, 5):  # one night a day
        at = dt.datetime(2026, 12, day, 1, 0, tzinfo=dt.UTC)
        outcomes.append(run_night(NightSpec([scenario(n) for n in script], out), binding, clock=functools.partial(lambda t: t, at)))
    last = outcomes[-1].night["comparison"]
    names = [o.night_dir.name for o in outcomes]
    assert [(i["scenario"], i["nights"], i["since"]) for i in last["still_failing"]] == [("stuck", 3, names[1])]
    assert last["still_failing"][0]["text"] == f"still failing (3 nights, since {names[1]}): FAIL now"
    assert [(i["scenario"], i["failed"], i["of"]) for i in last["flaky"]] == [("stuck", 3, 4), ("coin", 2, 4), ("mended", 3, 4)]
    assert [i["scenario"] for i in last["fixed"]] == ["mended"] and [i["scenario"] for i in last["newly_failing"]] == ["coin"]
    page = parse_html((out / "history.html").read_text())
    rows = {r.get("data-scenario"): r for r in page.iter("tr") if r.get("data-scenario")}
    assert list(rows) == ["stuck", "coin", "mended"]
    strips = {n: [(a.get("data-cell"), a.get("href")) for a in by_class(r, "a", "chip")] for n, r in rows.items()}
    assert strips["coin"] == [("PASS", f"{names[0]}/index.html"), ("FAIL", f"{names[1]}/index.html"),
                              ("PASS", f"{names[2]}/index.html"), ("FAIL", f"{names[3]}/index.html")]
    assert "still failing (3 nights" in text_of(rows["stuck"]) and "flaky: failed 2 of the last 4 nights" in text_of(rows["coin"])
    index = (outcomes[-1].night_dir / "index.html").read_text()
    assert "Still failing (1)" in index and '<a href="../history.html">' in index


def test_the_index_counts_the_same_thing_in_every_rows_passed_column() -> None:
    """passed / ran on every row: a plain scenario's passes and a known defect's runs whose checks
    all passed alike; the defect's row adds how often it showed."""
    plain = cell("plain", ["pass", "fail", "pass"])
    defect = cell("defect", ["xfail", "xpass", "xfail"], defect=True, measured=Rate(2, 3))
    doc = night([plain, defect])
    doc["scenarios"][1]["known_defect"] = "the coin lands odd"
    tree = parse_html(render_night(doc))
    table = by_class(tree, "table", "scenarios")[0]
    rows = [r for r in table.iter("tr") if r.get("class") != "group"]
    assert [text_of(th) for th in rows[0].iter("th")][2] == "passed / ran"
    passed = [text_of(list(r.iter("td"))[1]) for r in rows[1:]]
    assert passed[0] == "2/3" and passed[1].startswith("1/3; the defect showed in 2/3 (bound ")
    assert defect.name == "XFAIL"


def test_the_index_puts_what_fails_first_and_the_known_defects_together() -> None:
    steady, coin = cell("steady", ["pass"]), cell("coin", ["pass", "fail"])
    defect = cell("defect", ["xfail"], defect=True)
    doc = night([steady, defect, coin])
    doc["scenarios"][1]["known_defect"] = "the coin lands odd"
    table = by_class(parse_html(render_night(doc)), "table", "scenarios")[0]
    shown = [text_of(next(r.iter("th"))) for r in table.iter("tr")][1:]
    assert [t.split()[0] for t in shown] == ["Failing", "coinscenarios/coin.yaml", "Known", "defectknown",
                                             "Passed", "steadyscenarios/steady.yaml"]  # a name, then its file
    alone = by_class(parse_html(render_night(night([steady]))), "table", "scenarios")[0]
    assert len(list(alone.iter("tr"))) == 2  # one group: no group row


@pytest.mark.parametrize(
    ("cells", "headline"),
    [
        # a known defect that showed, one that did not (XPASS), a skip: none fails the night
        ([cell("p", ["pass", "pass"]), cell("d", ["xfail", "xfail"], defect=True), cell("x", ["xpass", "xpass"], defect=True),
          skip_cell("s")], "passed"),
        ([cell("p", ["pass", "pass"]), cell("f", ["fail", "fail"])], "failed"),  # a FAIL cell does
        ([cell("p", ["pass", "pass"]), cell("c", ["pass", "fail"])], "failed"),  # so does a FLAKY one
    ],
)
def test_the_nights_step_summary_headline_comes_from_its_cells_as_its_exit_code(
    cells: list[Cell | tuple[Cell, str]], headline: str
) -> None:
    from harness.nightly.command import night_step_summary, night_verdict
    from harness.nightly.run import NightOutcome

    doc = night(cells)
    judged = [c[0] if isinstance(c, tuple) else c for c in cells]
    outcome = NightOutcome(Path("/nights/n1"), doc, judged, doc["exit_code"])
    # no run seen here (the lanes ran elsewhere): the runs cannot tell the headline, the cells do
    md = night_step_summary(outcome, [])
    assert md.startswith(f"### mxchaos nightly n1: {headline}, {len(cells)} scenario(s)")
    assert (headline == "passed") is (outcome.exit_code == 0) and night_verdict(doc).lower() == headline
    rows = [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| ") and not line.startswith("| verdict")]
    assert rows == sorted(rows, key=lambda word: word not in ("| FAIL", "| FLAKY"))  # what fails it first
    assert "| PASS" not in rows  # a cell that passed has no row
