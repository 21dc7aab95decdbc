"""The saved run: the documents runs and their callers leave in folders, one typed class each.

A run folder holds ``run.json`` (``RunInfo``: who ran it, where, since when; written when the
run starts, read by cleanup and by ``mxchaos check``) and ``verdict.json`` (``VerdictDoc``: the
verdict, the checks, its place among a ``--repeat``). An ``--out`` folder of runs holds
``summary.json`` (``SummaryDoc``: per scenario the cell of its N runs, ``CellDoc``; each run's
folder relative to the summary's own). An
invocation of ``mxchaos run`` leaves ``invocation.json``, a night ``nightly.json`` (both a
``NightDoc``), a matrix ``matrix.json`` (``MatrixDoc``: its ``MatrixScenario`` rows,
``MatrixColumn`` columns and ``MatrixCell`` cells, each cell's runs a ``MatrixRun``;
its ``MatrixHeadline`` list and ``BaselineChange`` list).

Every writer and reader of these files goes through this module (``tests/unit/
test_saved_run.py`` holds the rest of harness to it): the file names, ``read_json`` (missing:
None; unreadable or not the shape: ``SavedDocError`` naming the file and what is wrong) and
the atomic write (a reader never sees half a file). The classes keep keys they do not declare
(``extra="allow"``), so a document written by a newer harness reads and writes back whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import HarnessError
from harness.record.vocabulary import canonical

__all__ = [
    "INVOCATION",
    "MATRIX",
    "NIGHT",
    "RUN_INFO",
    "SUMMARY",
    "VERDICT",
    "VERSIONS",
    "BaselineChange",
    "CellDoc",
    "ColumnSchedule",
    "DefectStatus",
    "KnownDefect",
    "MatrixCell",
    "MatrixColumn",
    "MatrixDoc",
    "MatrixHeadline",
    "MatrixRun",
    "MatrixScenario",
    "NightDoc",
    "NightEntry",
    "NightRunEntry",
    "RunInfo",
    "RunRecordDoc",
    "SavedDoc",
    "SavedDocError",
    "SlurmColumn",
    "SlurmLane",
    "SummaryDoc",
    "VerdictDoc",
    "read_json",
    "relative",
    "run_verdict_files",
    "write_json",
]

RUN_INFO = "run.json"
VERDICT = "verdict.json"
VERSIONS = "versions.json"
SUMMARY = "summary.json"
INVOCATION = "invocation.json"
NIGHT = "nightly.json"
MATRIX = "matrix.json"


class SavedDocError(HarnessError):
    """A saved document that exists but cannot be read back (not JSON, not its shape)."""


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; None when there is no such file. ``SavedDocError`` naming the
    file when it cannot be read or is not JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SavedDocError(f"{path}: cannot read it: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SavedDocError(f"{path}: not JSON: {exc}") from None


def relative(path: Path | str, folder: Path | str) -> str:
    """``path`` as a saved document names it: relative to ``folder``, the document's own (so a
    folder moved or downloaded elsewhere still finds what it names)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(folder))


def write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON in ``path``, atomically (a temporary file beside it, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class SavedDoc(BaseModel):
    """One saved document's shape. ``read``: None when the file is missing; ``SavedDocError``
    when it is there but not JSON or not this shape. ``write``: atomically, every key kept."""

    model_config = ConfigDict(extra="allow")
    FILE: ClassVar[str] = ""

    @classmethod
    def parse(cls, value: Any, where: Path | str) -> Self:
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(p) for p in first["loc"]) or "(the document)"
            raise SavedDocError(f"{where}: not a {cls.FILE or cls.__name__} ({key}: {first['msg']})") from None

    @classmethod
    def read(cls, path: Path) -> Self | None:
        value = read_json(path)
        return None if value is None else cls.parse(value, path)

    @classmethod
    def read_or_none(cls, path: Path) -> Self | None:
        """``read``, with an unreadable document taken as missing (for readers that list or
        sum up folders: one damaged file must not hide the others)."""
        try:
            return cls.read(path)
        except SavedDocError:
            return None

    @classmethod
    def in_folder(cls, folder: Path) -> Path:
        return folder / cls.FILE

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())


class RunInfo(SavedDoc):
    """``run.json``: written as the run starts, again when it gains something to sweep. Every
    key may be missing: a crashed run's folder is read with what it had written."""

    FILE: ClassVar[str] = RUN_INFO
    run_id: str = ""
    scenario: str = ""
    scenario_path: str | None = None
    run_dir: str = ""
    run_dir_id: Any = None
    harness_pid: int | None = None
    harness_start: int | None = None
    ssh: bool = False
    started: str = ""
    t0_monotonic: float | None = None


class VerdictDoc(SavedDoc):
    """``verdict.json``: the run's verdict and checks (``harness.judge.verdict.result_to_json``),
    the versions it ran with, its place among a ``--repeat`` and a re-judge's note."""

    FILE: ClassVar[str] = VERDICT
    scenario: str = ""
    run_id: str = ""
    run_dir: str = ""
    seed: int | None = None
    verdict: str
    status: str = ""
    reason: str = ""
    failed_step: str | None = None
    started_at: str = ""
    seconds: float | None = None
    known_defect: Any = None
    missing_capabilities: list[str] = []
    not_exercised: list[str] = []  # each fault whose witness showed no effect (verdict not_exercised)
    checks: list[dict[str, Any]] = []
    stacks: dict[str, str] = {}
    interrupted_by: int | None = None
    versions: dict[str, Any] = {}
    repeat: dict[str, Any] | None = None

    def failed_checks(self) -> list[dict[str, Any]]:
        """The checks that did not hold (false or unknown), in order."""
        return [c for c in self.checks if c.get("valid") is not True]

    def first_failing(self) -> str | None:
        """``name: summary`` of the first check that did not hold (false first, then unknown)."""
        failed = self.failed_checks()
        first = next((c for c in failed if c.get("valid") is False), failed[0] if failed else None)
        return None if first is None else f"{first.get('name')}: {first.get('summary')}"


class RunRecordDoc(SavedDoc):
    """One run of a cell, as ``summary.json`` lists it."""

    verdict: str
    run_dir: str = ""
    seed: int | None = None
    seconds: float | None = None
    not_exercised: list[str] = []  # the faults that had no effect (verdict not_exercised)


class CellDoc(SavedDoc):
    """A scenario's N runs judged together (``harness.record.rates.Cell.to_json``)."""

    cell: str
    rate: dict[str, int] | None = None
    bound: float | None = None
    measured: dict[str, int] | None = None
    runs: list[RunRecordDoc] = []

    @field_validator("cell")
    @classmethod
    def _one_name(cls, cell: str) -> str:  # an older record's REPRODUCED reads as XFAIL
        return canonical(cell)


class SummaryDoc(SavedDoc):
    """``summary.json``: ``--repeat`` N and every scenario's cell (``harness.record.rates``)."""

    FILE: ClassVar[str] = SUMMARY
    repeat: int = 1
    scenarios: dict[str, CellDoc] = {}

    @classmethod
    def merged(cls, parts: Sequence[SummaryDoc], repeat: int) -> SummaryDoc:
        """One summary from those of runs that split the scenarios between them (a column's lanes,
        its lone runs): ``ValueError`` when two of them ran the same scenario."""
        scenarios: dict[str, CellDoc] = {}
        for part in parts:
            for name, cell in part.scenarios.items():
                if name in scenarios:
                    raise ValueError(f"scenario {name!r} ran in two lanes of one column")
                scenarios[name] = cell
        return cls(repeat=repeat, scenarios=scenarios)

    @classmethod
    def read(cls, path: Path) -> Self | None:
        """The summary, each run's folder whole again: on disk it is relative to the summary's own
        folder (``write``), so a folder moved or downloaded elsewhere still finds its runs."""
        doc = super().read(path)
        base = os.path.abspath(path.parent)
        return None if doc is None else doc._with_run_dirs(
            lambda d: d if not d or os.path.isabs(d) else os.path.normpath(os.path.join(base, d)))

    def write(self, path: Path) -> None:
        """Atomically, each run's folder relative to the summary's own folder."""
        super(SummaryDoc, self._with_run_dirs(lambda d: relative(d, path.parent) if os.path.isabs(d) else d)).write(path)

    def _with_run_dirs(self, move: Callable[[str], str]) -> Self:
        scenarios = {name: cell.model_copy(update={"runs": [r.model_copy(update={"run_dir": move(r.run_dir)}) for r in cell.runs]})
                     for name, cell in self.scenarios.items()}
        return self.model_copy(update={"scenarios": scenarios})

    def runs(self) -> Iterator[tuple[str, RunRecordDoc]]:
        """(scenario, run) for every run of every cell, in order."""
        for name, cell in self.scenarios.items():
            for run in cell.runs:
                yield name, run


class NightRunEntry(SavedDoc):
    """One run of a night's scenario (``harness.reports.night.scenario_json``'s ``runs``): its
    folder and report relative to the night's."""

    index: int | None = None
    seed: int | None = None
    verdict: str | None = None
    status: str | None = None
    reason: str | None = None
    failed_checks: list[str] = []
    load: str | None = None
    seconds: float | None = None
    run_dir: str | None = None
    report: str | None = None


class NightEntry(SavedDoc):
    """One scenario of a night or an invocation (``harness.reports.night.scenario_json``): its
    cell, rates and runs. Every key but the name may be missing (an older or partial record)."""

    name: str
    path: str | None = None
    known_defect: Any = None
    hosts: dict[str, str] = {}
    skip: str | None = None
    cell: str | None = None
    rate: dict[str, int] | None = None
    bound: float | None = None
    measured: dict[str, int] | None = None
    note: str | None = None
    fails_night: bool = False
    failures: dict[str, int] | None = None
    median_seconds: float | None = None
    runs: list[NightRunEntry] = []

    @field_validator("cell")
    @classmethod
    def _one_name(cls, cell: str | None) -> str | None:  # an older record's cell words read as today's
        return None if cell is None else canonical(cell)


class NightDoc(SavedDoc):
    """``nightly.json`` of a night, and ``invocation.json`` of a ``mxchaos run`` (``kind: run``):
    the shape ``harness.reports.night.night_json`` writes, each scenario a ``NightEntry``."""

    FILE: ClassVar[str] = NIGHT
    night: str = ""
    scenarios: list[NightEntry]
    passed: bool | None = None
    exit_code: int | None = None
    interrupted: bool = False
    seconds: float | None = None  # the night's (or invocation's) whole duration
    load: dict[str, Any] | None = None  # the machine's at the start and end (harness.record.load)

    @model_validator(mode="before")
    @classmethod
    def _counted_by_one_name(cls, doc: Any) -> Any:  # and its counts of cells (REPRODUCED: 2 is XFAIL: 2)
        counts = doc.get("counts") if isinstance(doc, dict) else None
        if not isinstance(counts, dict) or not isinstance(counts.get("cells"), dict):
            return doc
        cells = counts["cells"]
        renamed: dict[str, Any] = {}
        for word, n in cells.items():
            name = canonical(str(word))
            renamed[name] = renamed.get(name, 0) + n if isinstance(n, int) else n
        return doc | {"counts": counts | {"cells": renamed}}

    def to_json(self) -> dict[str, Any]:
        """The keys it was given, no more: an entry of an older or partial record writes back as
        it was read (its defaults are for readers)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def failing(self) -> dict[str, str]:
        """The scenarios whose cell failed the night: name -> its file as recorded."""
        return {s.name: s.path or s.name for s in self.scenarios if s.fails_night and s.name}


class _AsRead(SavedDoc):
    """A document part that writes back the keys it was given, no more (its defaults are for readers)."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class MatrixRun(_AsRead):
    """One run of a matrix cell: a ``RunRecordDoc``'s keys and ``link``, its folder relative to
    ``matrix.json``'s."""

    verdict: str = ""
    run_dir: str = ""
    seed: int | None = None
    seconds: float | None = None
    not_exercised: list[str] = []
    link: str | None = None


class DefectStatus(_AsRead):
    """A known defect in one matrix cell (``harness.matrix.defects.defect_status``): whether the
    cell's NIXL version lists it, what its runs showed (reproduced, not reproduced, inconclusive),
    in how many, and the headline where the two disagree (None: they agree)."""

    expected: bool = False
    observed: str = ""
    reproduced: dict[str, int] | None = None  # {"k": runs that ended xfail, "n": runs}
    headline: str | None = None


class MatrixCell(_AsRead):
    """A scenario in a column (``harness.record.cells.read_column``): its verdict, how many runs
    failed, the runs and their median timings; ``error`` when it has no verdict on NIXL."""

    verdict: str = "none"
    error: str | None = None
    verdicts: dict[str, int] = {}
    failures: dict[str, int] = {}  # {"k": failed runs, "n": runs not skipped}
    rate: dict[str, int] | None = None
    bound: float | None = None
    measured: dict[str, int] | None = None
    runs: list[MatrixRun] = []
    seconds: float | None = None
    detection_s: float | None = None
    recovery_s: float | None = None
    fallback_s: float | None = None
    read_gbps: float | None = None
    read_ratio: float | None = None
    nixl: list[str] = []
    ucx: list[str] = []
    subjects: dict[str, str] = {}
    servers: dict[str, str] = {}
    defect: DefectStatus | None = None

    def failed(self) -> tuple[int | None, int | None]:
        """(k, n): runs that failed, runs not skipped (None: not recorded)."""
        return self.failures.get("k"), self.failures.get("n")


class ColumnSchedule(_AsRead):
    """How a column's scenarios shared the machine (``harness.matrix.schedule.run_plan``): its
    lanes side by side, each a list of scenarios, then those that ran alone."""

    lanes: list[list[str]] = []
    alone: list[str] = []


class SlurmLane(_AsRead):
    """One lane of a column's SLURM job array (``harness.matrix.schedule.run_plan_slurm``): its
    scenarios, the job and node(s) of the attempt that counts, its exit code or infrastructure
    verdict, what each attempt ended as, and how long it queued."""

    name: str = ""
    scenarios: list[str] = []
    job: str = ""
    node: str = ""
    nodes: str = ""  # SLURM's NodeList of the attempt that counts (h[1-2])
    rc: int | None = None
    infra: str | None = None
    attempts: list[str] = []
    ends: list[dict[str, Any]] = []  # each attempt's end (harness.hosts.slurm_dispatch)
    gathered: list[dict[str, Any]] = []  # node-local results: each attempt's gathering
    queued_to_start_s: float | None = None


class SlurmColumn(_AsRead):
    """Where a ``--slurm`` column's work went: its lanes' nodes each, and every lane."""

    nodes_per_lane: int | None = None
    lanes: list[SlurmLane] = []


class MatrixColumn(_AsRead):
    """A column of ``matrix.json`` (``harness.record.cells.Column``) and what running it left:
    the env, the raw READs, the tool's exit code, its lanes."""

    id: str
    label: str = ""
    nixl: str = ""
    subject: str = ""
    mx_server: str = ""
    env: dict[str, str] = {}
    available: bool = False
    error: str | None = None
    env_path: str = ""
    out_dir: str = ""
    raw_read_gbps: float | None = None
    raw_read_error: str | None = None
    raw_reads: dict[str, float | None] = {}  # READ bytes -> GB/s
    rc: int | None = None
    resumed: bool = False
    run_error: str | None = None
    infra: dict[str, str] | None = None  # --slurm: scenario -> why its lane did not run
    slurm: SlurmColumn | None = None
    schedule: ColumnSchedule | None = None
    resolved_from: dict[str, str] | None = None
    loaded_nixl: list[str] = []
    loaded_ucx: list[str] = []

    def lanes_beside(self, scenario: str) -> int:
        """How many lanes ran at once while ``scenario`` ran here (1: alone, one lane, or a column
        from before lanes)."""
        lanes = self.schedule.lanes if self.schedule is not None else []
        if len(lanes) > 1 and any(scenario in lane for lane in lanes):
            return len(lanes)
        return 1


class KnownDefect(_AsRead):
    """A scenario's known defect as the matrix plays it (``harness.matrix.defects.defect_info``):
    its text, the NIXL versions it was measured on, the servers (``defect_servers``) and the
    clients (``subject_defects``) whose defect it is; None: every version, server, client."""

    text: str = ""
    versions: list[str] | None = None
    servers: list[str] | None = None
    subjects: list[str] | None = None


class MatrixScenario(_AsRead):
    """A row of ``matrix.json``: the scenario, its file, its known defect (``defect_info``)."""

    name: str
    path: str = ""
    defect: KnownDefect | None = None


class MatrixHeadline(_AsRead):
    """A cell where a known defect's expectation and what its runs showed disagree
    (``harness.matrix.defects.defect_status``'s headline), on top of the table and the page."""

    scenario: str = ""
    column: str = ""
    text: str = ""


class BaselineChange(_AsRead):
    """One change against a ``--baseline`` (``harness.record.baseline.diff_matrices``): where it
    is (``scenario`` None: the whole column), its ``kind`` (verdict, rate, timing, schedule,
    column), the old and new values, whether it is a regression, and its sentence."""

    scenario: str | None = None
    column: str = ""
    kind: str = ""
    metric: str | None = None  # timing: the field that moved
    old: str | int | float | dict[str, int] | None = None  # a verdict, a failure rate {k, n} or a figure
    new: str | int | float | dict[str, int] | None = None
    regression: bool = False
    scenarios: list[str] | None = None  # schedule: the scenarios whose timings were not compared
    text: str = ""


class MatrixDoc(_AsRead):
    """``matrix.json``: the scenarios, the columns, the cells (scenario -> column id -> cell),
    the headlines and what changed against a ``--baseline``."""

    FILE: ClassVar[str] = MATRIX
    schema_: int | None = Field(default=None, alias="schema")
    created: str = ""
    repeat: int = 1
    scenarios: list[MatrixScenario] = []
    columns: list[MatrixColumn] = []
    cells: dict[str, dict[str, MatrixCell]]
    headlines: list[MatrixHeadline] = []
    baseline_changes: list[BaselineChange] | None = None

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)

    def cell(self, scenario: str, column: str) -> MatrixCell | None:
        return self.cells.get(scenario, {}).get(column)

    def all_cells(self) -> Iterator[tuple[str, str, MatrixCell]]:
        """(scenario, column id, cell) for every cell, row by row."""
        for name, row in self.cells.items():
            for cid, cell in row.items():
                yield name, cid, cell

    def scenario_seconds(self) -> dict[str, float]:
        """Each scenario's run seconds (its cells' medians, the longest column's): what a column's
        lanes are balanced on, and what a projection weighs."""
        out: dict[str, float] = {}
        for name, row in self.cells.items():
            times = [c.seconds for c in row.values() if c.seconds is not None]
            if times:
                out[name] = max(times)
        return out


def run_verdict_files(out_dir: Path) -> list[Path]:
    """Every run folder's ``verdict.json`` under an ``--out`` folder (``<scenario>/<stamp>/``),
    the ``latest`` links left out."""
    return [p for p in sorted(out_dir.glob(f"*/*/{VERDICT}")) if not p.parent.is_symlink()]
