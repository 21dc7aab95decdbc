"""The matrix's column scheduler: who runs beside whom, and who runs alone (harness.matrix.schedule)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.matrix.schedule import LanePlacement, Plan, place, plan_column, run_plan
from harness.record.saved import SummaryDoc
from harness.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[4]

BASE = """
name: {name}
{extra}
processes:
  server: {{role: server}}
{processes}
steps:
  - start: server
{steps}
checks:
{checks}
"""


def scenario(name: str = "s", extra: str = "", processes: str = "", steps: str = "", checks: str = "  - nothing_leaked: {}") -> Any:
    return parse_scenario(BASE.format(name=name, extra=extra, processes=processes, steps=steps, checks=checks))


def test_a_scenario_with_no_global_fault_no_command_and_loose_windows_is_shared() -> None:
    assert place(scenario()) == LanePlacement("s", False, "")


def test_a_tight_elapsed_window_runs_alone_and_a_loose_one_does_not() -> None:
    check = ("  - elapsed: {{name: quick, from: {{process: server, event: listening}}, "
             "to: {{process: server, event: listening}}, within: {w}}}")
    tight = place(scenario(checks=check.format(w="2s")))
    assert tight.alone and "within 2s (quick)" in tight.reason
    assert not place(scenario(checks=check.format(w="10s"))).alone


def test_a_command_process_runs_alone() -> None:
    p = place(scenario(processes='  hog: {role: command, argv: ["{python}", "-c", "pass"]}'))
    assert p.alone and "hog" in p.reason


def test_a_declaration_overrides_what_is_inferred() -> None:
    check = ("  - elapsed: {name: quick, from: {process: server, event: listening}, "
             "to: {process: server, event: listening}, within: 1s}")
    assert not place(scenario(extra="schedule: shared", checks=check)).alone
    declared = place(scenario(extra="schedule: alone"))
    assert declared.alone and declared.reason == "declared schedule: alone"


def test_an_unknown_schedule_value_is_refused_naming_the_key() -> None:
    from harness.errors import ScenarioInvalid

    with pytest.raises(ScenarioInvalid) as err:
        scenario(extra="schedule: sometimes")
    assert "schedule" in err.value.render()


@pytest.mark.parametrize("path, why", [
    ("scenarios/partition_mid_read.yaml", "netns"),  # network namespaces, iptables, tc: the machine's
    ("scenarios/tcp_reset_mid_read.yaml", "ss"),  # socket kills by filter, as root
    ("scenarios/no_false_stall_under_cpu_load.yaml", "commands"),  # CPU hogs
    ("scenarios/frozen_source.yaml", "within"),  # a stall called within 1.5 s: a latency verdict
])
def test_the_repositorys_global_and_tight_scenarios_run_alone(path: str, why: str) -> None:
    from harness.scenario import load_scenario

    p = place(load_scenario(REPO / path))
    assert p.alone and why in p.reason, p


def test_the_repositorys_smoke_is_shared() -> None:
    from harness.scenario import load_scenario

    assert not place(load_scenario(REPO / "scenarios/smoke.yaml")).alone


@pytest.mark.parametrize("path", ["scenarios/disk_fallback_eio.yaml", "scenarios/clock_replica_booted_earlier.yaml"])
def test_a_fault_that_needs_root_only_for_what_its_run_owns_is_shared(path: str) -> None:
    """Root is a privilege, not shared state: a FUSE mount over the run's own checkpoint folder
    and one process's time namespace touch nothing a neighbour uses."""
    from harness.scenario import load_scenario
    from harness.scenario.capabilities import scenario_requirements

    loaded = load_scenario(REPO / path)
    assert "root" in scenario_requirements(loaded)
    assert place(loaded) == LanePlacement(loaded.name, False, "")


def test_the_syscall_crawl_incident_says_it_runs_alone() -> None:
    from harness.scenario import load_scenario

    p = place(load_scenario(REPO / "scenarios/incidents/nixl2047_reader_recv_crawls.yaml"))
    assert p.alone and p.reason == "declared schedule: alone"


def shared(*names: str) -> list[LanePlacement]:
    return [LanePlacement(n, False, "") for n in names]


def test_one_job_is_one_lane_in_file_order_as_before() -> None:
    plan = plan_column([*shared("a", "b"), LanePlacement("c", True, "x"), *shared("d")], jobs=1)
    assert plan == Plan((("a", "b", "d"),), ("c",)) and not plan.side_by_side


def test_lanes_are_bounded_by_jobs_and_by_the_shared_scenarios() -> None:
    assert len(plan_column(shared("a", "b", "c", "d", "e"), jobs=2).lanes) == 2
    assert len(plan_column(shared("a", "b"), jobs=8).lanes) == 2
    assert plan_column([LanePlacement("a", True, "x")], jobs=4) == Plan((), ("a",))
    with pytest.raises(ValueError):
        plan_column(shared("a"), jobs=0)


def test_every_scenario_is_placed_exactly_once() -> None:
    names = [f"s{i}" for i in range(11)]
    plan = plan_column([*shared(*names[:8]), *(LanePlacement(n, True, "x") for n in names[8:])], jobs=3)
    placed = [n for lane in plan.lanes for n in lane] + list(plan.alone)
    assert sorted(placed) == sorted(names) and plan.alone == ("s8", "s9", "s10")


def test_lanes_are_balanced_longest_first_on_earlier_seconds() -> None:
    seconds = {"long": 60.0, "mid": 30.0, "short1": 20.0, "short2": 10.0}
    plan = plan_column(shared("short1", "long", "short2", "mid"), jobs=2, seconds=seconds)
    loads = sorted(sum(seconds[n] for n in lane) for lane in plan.lanes)
    assert loads == [60.0, 60.0]
    assert ("long",) in plan.lanes  # alone in its lane; the other three beside it, in file order
    assert ("short1", "short2", "mid") in plan.lanes


def test_merged_summaries_hold_every_lanes_scenarios_and_refuse_one_twice() -> None:
    a = SummaryDoc.parse({"repeat": 2, "scenarios": {"x": {"cell": "PASS"}}}, "a")
    b = SummaryDoc.parse({"repeat": 2, "scenarios": {"y": {"cell": "FLAKY"}}}, "b")
    merged = SummaryDoc.merged([a, b], 2)
    assert merged.repeat == 2 and {n: c.cell for n, c in merged.scenarios.items()} == {"x": "PASS", "y": "FLAKY"}
    with pytest.raises(ValueError, match="two lanes"):
        SummaryDoc.merged([a, a], 2)


def test_run_plan_runs_the_lanes_at_once_then_the_lone_ones_with_nothing_beside(tmp_path: Path) -> None:
    lock = threading.Lock()
    running: list[str] = []
    seen: list[tuple[str, list[str]]] = []  # (group started, what was running then)

    def run(names: Sequence[str], folder: Path) -> tuple[int, str]:
        with lock:
            seen.append((folder.name, list(running)))
            running.append(folder.name)
        time.sleep(0.1)
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"repeat": 1, "scenarios": {n: {"cell": "PASS"} for n in names}}))
        with lock:
            running.remove(folder.name)
        return (1 if "b" in names else 0), f"ran {','.join(names)}"

    rc, texts = run_plan(Plan((("a",), ("b", "c")), ("d",)), tmp_path, run, repeat=1)
    assert rc == 1 and sorted(texts) == ["ran a", "ran b,c", "ran d"]
    started = dict(seen)
    assert started["alone"] == [], "the lone run starts after every lane ended"
    assert "lane-1" in started["lane-2"] or "lane-2" in started["lane-1"], "the lanes overlapped"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(summary["scenarios"]) == ["a", "b", "c", "d"]


def test_a_tool_failure_outranks_failed_runs_in_the_column_code(tmp_path: Path) -> None:
    codes = {"lane-1": 1, "lane-2": 124}
    rc, _ = run_plan(Plan((("a",), ("b",)), ()), tmp_path, lambda names, folder: (codes[folder.name], ""), repeat=1)
    assert rc == 124


def test_a_matrix_column_runs_its_lanes_and_lone_scenarios_and_reads_them_as_one(tmp_path: Path) -> None:
    from harness.matrix.run import MatrixSpec, here_env, run_matrix
    from harness.record.cells import columns_for

    calls: list[tuple[str, list[str]]] = []

    def execute(argv: Sequence[str], env: Any, timeout: float) -> tuple[int, str]:
        argv = list(argv)
        if argv[-2:] == ["run", "--help"]:
            return 0, "usage: mxchaos run [--repeat N]"
        out = Path(argv[argv.index("--out") + 1])
        names = [Path(p).stem for p in argv if p.endswith(".yaml")]
        calls.append((out.name, names))
        runs = {n: {"cell": "PASS", "rate": {"k": 0, "n": 1}, "bound": None, "measured": None,
                    "runs": [{"verdict": "pass", "run_dir": str(out / n / "r0"), "seed": 0, "seconds": 1.0}]}
                for n in names}
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"repeat": 1, "scenarios": runs}))
        return 0, "ok"

    names = ["a", "b", "c", "d"]
    spec = MatrixSpec(scenarios=[tmp_path / f"{n}.yaml" for n in names], names=names, defects={},
                      columns=columns_for([], [], ["mxref"]), out=tmp_path / "out", raw_read=False, jobs=2,
                      placements=[*shared("a", "b", "c"), LanePlacement("d", True, "x")])
    matrix = run_matrix(spec, ensure=lambda v: here_env(), execute=execute).to_json()
    assert sorted(calls) == [("alone", ["d"]), ("lane-1", ["a", "c"]), ("lane-2", ["b"])]
    column = matrix["columns"][0]
    assert column["schedule"] == {"lanes": [["a", "c"], ["b"]], "alone": ["d"]}
    assert {n: matrix["cells"][n][column["id"]]["verdict"] for n in names} == dict.fromkeys(names, "PASS")


def test_a_column_runs_two_lanes_per_core_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from harness.matrix.schedule import default_jobs

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_jobs() == 4
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one core's worth
    assert default_jobs() == 2
