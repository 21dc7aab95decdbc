"""pytest plugin (entry point ``pytest11``): scenario files are test items.

YAML files under the folders named by the ini option ``mxchaos_scenario_dirs``
(default ``scenarios``, relative to the rootdir) are collected, one item per file,
named after the scenario; so is any YAML file named on the command line
(``pytest path/to/any.yaml``), wherever it lies. An invalid file is a collection error
that names file, line, key and rule. A failing item prints the failing checks and the run
folder, without a traceback. Items are marked ``mxchaos`` (and ``integration`` where the
project declares that marker), with the scenario's own ``markers``, and with a marker per
capability its hosts, proxies and faults require (``CAPABILITY_MARKERS``: ``root`` for
netns hosts and root-only faults, ``toxiproxy`` for proxies), so ``pytest -m "not root"``
deselects what needs root; the plugin declares those markers where the project does not.
Items get a ``timeout`` of the run budget plus a margin when pytest-timeout
is installed. Options: ``--mxchaos-out DIR`` (default ``<rootdir>/runs``),
``--mxchaos-seed N``, ``--mxchaos-subject mxref|modelexpress`` (who plays the sources and
readers; with it, or ``MXCHAOS_BUILD_SUBJECTS=1``, the environments the selected scenarios need
are built before the first run, else a scenario whose subject has none skips), ``--mxchaos-repeat N`` (run each scenario N times inside its one item,
seeds seed..seed+N-1, and judge the runs as one cell by ``harness.record.rates``: a plain scenario
passes only at N/N, FLAKY and the other cells that fail the run fail the item with the rate
and the failing run folders, XFAIL is xfail, FIXED? / XPASS pass with a note;
the item's timeout grows N-fold). Works under pytest-xdist: runs share nothing but the output
folder, and every run folder name is unique.

Items that run real processes hold the machine share (``harness.machine.share``) around their
whole protocol, outside their timeout: a scenario that the matrix would run alone
(``harness.matrix.schedule.place``: global faults, CPU hogs, tight timing windows), or any item
marked ``alone``, runs with nothing beside it that holds the share; other scenarios and tests
marked ``integration`` share it; unit tests take no part. The wait is recorded as the item's
``mxchaos_machine_share`` property (JUnit).

Verdicts map to outcomes: ``skip`` (a capability the scenario's faults require is
missing) is ``pytest.skip``; ``xfail`` (a ``known_defect`` scenario whose checks failed)
is ``pytest.xfail`` with the defect as the reason; ``xpass`` (it passed: the defect did
not reproduce) is a pass with a note (a report section and the terminal summary), never a
strict-xfail failure, because the defects documented this way are timing-dependent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.errors import ScenarioInvalid
from harness.explore import is_template
from harness.scenario import Scenario, load_scenario

TEARDOWN_MARGIN_S = 120
# capability (harness.scenario.capabilities) -> the pytest marker an item that requires it carries
CAPABILITY_MARKERS = {"root": "root", "netns": "root", "toxiproxy": "toxiproxy"}
_MARKER_HELP = {
    "root": "needs root (netns hosts, iptables, tc, ss --kill)",
    "toxiproxy": "needs the toxiproxy server binary",
    "alone": "runs with the machine to itself: nothing else that holds the machine share (harness.machine.share)",
}
SHARE_PROPERTY = "mxchaos_machine_share"
XPASS_PROPERTY = "mxchaos_xpass"
_NOTES: list[tuple[str, str]] = []  # (nodeid, note) of this session's xpasses, for the summary


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mxchaos", "mxchaos scenarios")
    group.addoption("--mxchaos-out", default=None, metavar="DIR", help="run folders (default: <rootdir>/runs)")
    group.addoption("--mxchaos-seed", type=int, default=None, metavar="N", help="override every scenario's seed")
    group.addoption("--mxchaos-store", choices=("memory", "redis"), default=None,
                    help="redis: every scenario's servers on a Redis store (harness.scenario.stores)")
    group.addoption("--mxchaos-subject", default=None, metavar="SUBJECT|ROLE=SUBJECT,...",
                    help="who plays every scenario's sources and readers (harness.subjects; default: the scenario's); "
                         "per role: server=modelexpress,reader=mxref (harness.subjects.mx_server)")
    group.addoption("--mxchaos-inventory", default=None, metavar="FILE|slurm:[JOB]",
                    help="run the scenarios' hosts on this inventory's machines over ssh (harness/hosts/inventory.py); "
                         "slurm: the nodes of the SLURM job this runs in, slurm+srun: the same reached "
                         "through srun (harness/hosts/allocation.py)")
    group.addoption(
        "--mxchaos-repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each scenario N times (seeds seed..seed+N-1) and judge its rate (harness.record.rates)",
    )
    parser.addini(
        "mxchaos_scenario_dirs",
        type="args",
        default=["scenarios"],
        help="folders (relative to rootdir) whose *.yaml files are collected as mxchaos scenarios",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mxchaos: an mxchaos scenario file run by the harness")
    declared = _declared_markers(config)
    for name, text in _MARKER_HELP.items():
        if name not in declared:
            config.addinivalue_line("markers", f"{name}: {text}")
    _NOTES.clear()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Hold the machine share (``harness.machine.share``) around the item's whole protocol, outside
    its timeout: alone or shared as ``_runs_alone`` says; a unit test holds nothing."""
    # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
    from harness.machine.share import ShareTimeout, held_by_ancestor, hold

    alone = _runs_alone(item)
    if alone is None:
        yield
        return
    inherited = held_by_ancestor()
    if inherited is not None:  # a test that holds the share started this session: it answers for us
        item.user_properties.append((SHARE_PROPERTY, f"held by an ancestor ({inherited})"))
        yield
        return
    try:
        with hold(alone) as held:
            item.user_properties.append((SHARE_PROPERTY, f"{'alone' if alone else 'shared'}, waited {held.waited_s:g}s"))
            yield
            return
    except ShareTimeout as exc:  # run it all the same, saying so: a wait is bounded, a test is not lost
        print(f"[mxchaos] {item.nodeid}: {exc}; running it beside whatever holds the machine", file=sys.stderr)
        item.user_properties.append((SHARE_PROPERTY, f"not held: {exc}"))
    yield


def _runs_alone(item: pytest.Item) -> bool | None:
    """True: the item must have the machine to itself (marked ``alone``, or a scenario
    ``harness.matrix.schedule.place`` runs alone); False: it may share it (a scenario, or a test
    marked ``integration``: real processes); None: it takes no part (a unit test)."""
    if item.get_closest_marker("alone") is not None:
        return True
    if isinstance(item, ScenarioItem):
        # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
        from harness.matrix.schedule import place

        return place(item.scenario).alone
    return False if item.get_closest_marker("integration") is not None else None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the xpass notes (also from xdist workers: user properties travel with reports)."""
    if report.when != "call" or not report.passed:
        return
    for key, value in report.user_properties:
        if key == XPASS_PROPERTY:
            _NOTES.append((report.nodeid, str(value)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _NOTES:
        return
    terminalreporter.section("mxchaos: known defects that did not reproduce", sep="=", yellow=True, bold=True)
    for nodeid, note in _NOTES:
        terminalreporter.write_line(f"XPASS {nodeid}", yellow=True, bold=True)
        terminalreporter.write_line(f"  {note}")


def _declared_markers(config: pytest.Config) -> set[str]:
    return {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}


def capability_markers(scenario: Scenario) -> list[str]:
    """The markers of the capabilities ``scenario`` requires (``CAPABILITY_MARKERS``), each once."""
    # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
    from harness.scenario.capabilities import scenario_requirements

    found = [CAPABILITY_MARKERS[c] for c in scenario_requirements(scenario) if c in CAPABILITY_MARKERS]
    return list(dict.fromkeys(found))


def _scenario_dirs(config: pytest.Config) -> list[Path]:
    return [(config.rootpath / d).resolve() for d in config.getini("mxchaos_scenario_dirs")]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    resolved = file_path.resolve()
    named = parent.session.isinitpath(file_path)  # given on the command line: collected wherever it lies
    if named or (not is_template(file_path) and any(resolved.is_relative_to(d) for d in _scenario_dirs(parent.config))):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFailed(Exception):
    """A scenario ran and did not pass; carries the result for ``repr_failure``."""

    def __init__(self, result: Any) -> None:
        self.result = result
        super().__init__(f"{result.scenario.name}: {result.verdict}")

    def render(self) -> str:
        r = self.result
        lines = [f"scenario {r.scenario.name}: {r.verdict.upper()} (seed {r.seed})"]
        if r.status != "completed":
            step = f" at step {r.failed_step}" if r.failed_step else ""
            lines.append(f"  {r.status}{step}: {r.reason}")
        for why in getattr(r, "not_exercised", ()):
            lines.append(f"  NOT EXERCISED {why}")
        for c in r.checks:
            if c.valid is True:
                continue
            word = "FAIL" if c.valid is False else "UNKNOWN"
            lines.append(f"  {word:8} {c.name}: {c.summary}")
        passed = sum(1 for c in r.checks if c.valid is True)
        lines.append(f"  ({passed}/{len(r.checks)} checks passed)")
        for name, path in r.stacks.items():
            lines.append(f"  stacks of {name}: {r.run_dir / path}")
        lines.append(f"  run folder: {r.run_dir}")
        lines.append(f"  report:     {r.run_dir / 'report.html'}")
        return "\n".join(lines)


class CellFailed(Exception):
    """A repeated scenario's cell fails the run (FLAKY, FAIL, HANG, ERROR, UNKNOWN)."""

    def __init__(self, cell: Any, failing: list[Any]) -> None:
        self.cell = cell
        self.failing = failing
        super().__init__(f"{cell.scenario}: {cell.name} {cell.rate}")

    def render(self) -> str:
        c = self.cell
        what = "defect showed" if c.known_defect else "passed"
        lines = [f"scenario {c.scenario}: {c.name} ({what} {c.rate}): {c.note}"]
        for r in self.failing:
            lines.append(f"  run with seed {r.seed}: {r.verdict.upper()}  {r.run_dir}")
            lines += [f"    {'FAIL' if k.valid is False else 'UNKNOWN':8} {k.name}: {k.summary}" for k in r.checks if k.valid is not True]
            if r.status != "completed":
                lines.append(f"    {r.status}: {r.reason}")
        return "\n".join(lines)


def _xfail_reason(result: Any) -> str:
    """The defect, then what showed it (the first failing check) and the run folder."""
    failing = [c for c in result.checks if c.valid is False]
    shown = f"{failing[0].name}: {failing[0].summary}" if failing else "?"
    shown += f" (+{len(failing) - 1} more)" if len(failing) > 1 else ""
    return f"known defect: {result.known_defect} | reproduced: {shown} | run folder: {result.run_dir}"


_INVENTORY_KEY = pytest.StashKey[Any]()


def _inventory(config: pytest.Config) -> Any:
    """The ``--mxchaos-inventory`` file, loaded once per session (None without the option);
    an invalid one is a usage error naming the file, key and rule."""
    path = config.getoption("mxchaos_inventory")
    if path is None:
        return None
    if _INVENTORY_KEY not in config.stash:
        # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
        from harness.hosts.allocation import open_inventory
        from harness.hosts.inventory import InventoryInvalid
        from harness.hosts.slurm import SlurmUnavailable

        try:
            config.stash[_INVENTORY_KEY] = open_inventory(path)  # a file, or slurm: (the nodes of a job)
        except (InventoryInvalid, SlurmUnavailable) as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[_INVENTORY_KEY]


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        scenario = load_scenario(self.path, seed=self.config.getoption("mxchaos_seed"),
                                 store=self.config.getoption("mxchaos_store"))
        if self.config.getoption("mxchaos_subject"):
            # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
            from harness.scenario.subjects import with_subjects
            from harness.subjects.envs import ENV_CLIENT_VERSION
            from harness.subjects.mx_server import CLIENT_VERSION_KEY, parse_subjects

            try:
                subjects = parse_subjects(self.config.getoption("mxchaos_subject"))
            except ValueError as exc:
                raise pytest.UsageError(str(exc)) from None
            if subjects.get(CLIENT_VERSION_KEY) == "latest-nightly":  # resolved by mxchaos run and matrix only
                raise pytest.UsageError("--mxchaos-subject modelexpress@latest-nightly: name the version "
                                        "(mxchaos run --subject modelexpress@latest-nightly resolves it)")
            if CLIENT_VERSION_KEY in subjects:  # modelexpress@V: that release's env plays (harness.subjects.envs)
                os.environ[ENV_CLIENT_VERSION] = subjects[CLIENT_VERSION_KEY]
            scenario = with_subjects(scenario, subjects)
        item = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)
        markers = ["mxchaos"]
        if "integration" in _declared_markers(self.config):
            markers.append("integration")  # only where the project declares it (--strict-markers)
        for marker in dict.fromkeys([*markers, *scenario.markers, *capability_markers(scenario)]):
            item.add_marker(marker)
        if self.config.pluginmanager.hasplugin("timeout"):
            repeat = max(1, self.config.getoption("mxchaos_repeat"))
            item.add_marker(pytest.mark.timeout(repeat * (scenario.budgets.run + TEARDOWN_MARGIN_S)))
        yield item

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ScenarioInvalid):
            return excinfo.value.render()
        return super().repr_failure(excinfo)


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario

    def runtest(self) -> None:
        # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
        from harness.engine.play import run_scenario

        out = self.config.getoption("mxchaos_out") or (self.config.rootpath / "runs")
        repeat = self.config.getoption("mxchaos_repeat")
        if repeat < 1:
            raise pytest.UsageError(f"--mxchaos-repeat {repeat}: give a number of runs >= 1")
        if repeat > 1:
            self._run_repeated(out, repeat)
            return
        result = run_scenario(self.scenario, out, inventory=_inventory(self.config))
        self.user_properties.append(("mxchaos_run_dir", str(result.run_dir)))
        self.user_properties.append(("mxchaos_verdict", result.verdict))
        if result.status == "interrupted":
            raise KeyboardInterrupt(f"mxchaos run interrupted; healed and torn down: {result.run_dir}")
        if result.verdict == "skip":
            try:
                pytest.skip(f"mxchaos: {result.reason}")
            except pytest.skip.Exception as exc:
                exc._use_item_location = True  # report the scenario file, not this line (as pytest's own skips)
                raise
        if result.verdict == "xfail":
            pytest.xfail(_xfail_reason(result))
        if result.verdict == "xpass":
            note = (
                f"every check passed: the known defect did not reproduce in this run (one run cannot call it fixed; "
                f"--mxchaos-repeat N can): {result.known_defect} "
                f"(run folder: {result.run_dir})"
            )
            self.user_properties.append((XPASS_PROPERTY, note))
            self.add_report_section("call", "mxchaos", f"XPASS {note}")
            return
        if result.verdict != "pass":
            raise ScenarioFailed(result)

    def _run_repeated(self, out: Path | str, repeat: int) -> None:
        """N runs, one cell, one outcome (the rule of ``harness.record.rates``)."""
        # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
        from harness.engine.play import run_scenario
        from harness.reports.report import judge_runs

        sc = self.scenario
        results = []
        for index in range(repeat):
            result = run_scenario(sc.with_seed(sc.seed + index), out, inventory=_inventory(self.config))
            results.append(result)
            self.user_properties.append(("mxchaos_run_dir", str(result.run_dir)))
            if result.status == "interrupted":
                raise KeyboardInterrupt(f"mxchaos run interrupted; healed and torn down: {result.run_dir}")
            if result.verdict == "skip":
                break
        cell = judge_runs(sc, results, repeat)
        self.user_properties.append(("mxchaos_cell", cell.name))
        self.user_properties.append(("mxchaos_rate", str(cell.rate)))
        if cell.name == "SKIP":
            try:
                pytest.skip(f"mxchaos: {results[-1].reason}")
            except pytest.skip.Exception as exc:
                exc._use_item_location = True
                raise
        if cell.name == "XFAIL":
            pytest.xfail(f"known defect: {sc.known_defect} | reproduced in {cell.rate} runs (measured {cell.measured})")
        if cell.fails_run:
            raise CellFailed(cell, [r for r in results if r.verdict not in ("pass", "xfail", "xpass", "skip")])
        if cell.name != "PASS":  # FIXED? / XPASS: a known defect that did not show
            note = f"{cell.name} {cell.rate}: {cell.note} ({sc.known_defect})"
            self.user_properties.append((XPASS_PROPERTY, note))
            self.add_report_section("call", "mxchaos", note)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ScenarioFailed | CellFailed):
            return excinfo.value.render()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"mxchaos scenario: {self.name}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--mxchaos-subject`` (or ``MXCHAOS_BUILD_SUBJECTS=1``), build (once, cached) the
    environment of every subject the selected scenarios use, before any runs: outside the
    items' timeouts (torch is a few GB). Otherwise a scenario whose subject has no environment
    yet skips, naming the capability ``<subject>-env`` (a plain ``pytest scenarios/`` does not
    download gigabytes for one mixed-fleet scenario)."""
    # late: pytest loads this plugin into every session; the engine and its hosts load only for scenario files
    from harness.subjects import prepare_subjects

    if not (config.getoption("mxchaos_subject") or os.environ.get("MXCHAOS_BUILD_SUBJECTS") == "1"):
        return
    scenarios = [item.scenario for item in items if isinstance(item, ScenarioItem)]
    if scenarios:
        prepare_subjects(scenarios, log=lambda line: print(f"[mxchaos] {line}", file=sys.stderr, flush=True))
