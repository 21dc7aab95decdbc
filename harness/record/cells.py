"""Columns of the matrix and what one cell (a scenario in a column) measured.

A column is a NIXL version (or none: this project's own environment), a subject (who plays
the sources and readers: ``mxchaos run --subject``; none: each scenario's own) plus one value of
each ``--env`` axis; its id (``nixl-1.5.1``, ``nixl-1.5.1+UCX_RNDV_PIPELINE_ERROR_HANDLING=n``,
``subject-modelexpress``) names its folder under ``--out``. ``read_column`` reads what
``mxchaos run --repeat N --out DIR`` left in that folder:
``DIR/summary.json`` (the contract of ``--repeat``: per scenario the cell verdict, rate, bound
and runs) when present, else the run folders themselves (``DIR/<scenario>/<stamp>/verdict.json``),
and from each run folder ``versions.json`` (the NIXL and UCX versions the run loaded, and
who played: ``subjects``) and ``timeline.jsonl`` (timings). Timings, each the median over the cell's runs: ``seconds`` (the
run), ``detection_s`` (first fault injected -> first ``transfer_error``), ``recovery_s`` (first
fault -> the next ``load_done``), ``fallback_s`` (first fault -> the first ``fallback``),
``read_gbps`` (the ``gbps`` of every ``transfer_done``) and ``read_ratio`` (``read_gbps`` over
the column's raw NIXL READ of the same size, ``mxref.bench.raw``, measured in the same env).
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.record.saved import (
    VERSIONS,
    MatrixCell,
    RunRecordDoc,
    SavedDocError,
    SummaryDoc,
    VerdictDoc,
    read_json,
    run_verdict_files,
)
from harness.record.timeline import History

__all__ = [
    "FAILING",
    "NOT_INSTALLABLE",
    "SEVERITY",
    "Column",
    "RunTimings",
    "cell_verdict",
    "columns_for",
    "parse_env_axis",
    "read_column",
    "run_timings",
]

# worst first: a cell whose runs disagree shows the worst verdict, and its rate says how often.
# Run verdicts (lower case) and the cells of ``mxchaos run --repeat`` (``harness.record.rates``: PASS,
# FLAKY, XFAIL, FIXED?, ...; kept as given, compared lower-cased) in one order.
SEVERITY = ("error", "hang", "fail", "flaky", "unknown", "not_exercised", "none", "xfail", "reproduced", "not_reproduced",
            "xpass", "fixed?", "pass", "skip", "not_installable", "unavailable")
# a column whose NIXL release cannot be installed here (pip cannot resolve it, e.g. ``nixl`` 1.5.2 whose
# ``nixl-cu12``/``nixl-cu13`` 1.5.2 were never published): an environment verdict, never a failure of
# its scenarios; the cell's ``error`` reads "not installable: <why>" (older matrix.json: "unavailable")
NOT_INSTALLABLE = "not_installable"
BAD = ("error", "hang", "fail", "unknown", "xfail", "not_exercised")  # what counts as a failure in a cell's failure rate
FAILING = ("error", "hang", "fail", "flaky", "unknown", "not_exercised", "none")  # cells that make `mxchaos matrix` exit 1


@dataclass(frozen=True)
class Column:
    nixl: str  # "": this project's own environment (no per-version env)
    env: tuple[tuple[str, str], ...] = ()
    subject: str = ""  # "": each scenario's own subject
    # who plays the servers: "" each scenario's own, "mxref" mxref's, else a modelexpress-server
    # version (built once and cached: harness.subjects.mx_build)
    mx_server: str = ""

    @property
    def id(self) -> str:
        head = [f"nixl-{self.nixl}"] if self.nixl else []
        head += [f"subject-{self.subject}"] if self.subject else []
        head += [f"mx-server-{self.mx_server}"] if self.mx_server else []
        return "+".join([*(head or ["here"]), *(f"{k}={v}" for k, v in self.env)])

    @property
    def label(self) -> str:
        head = [f"NIXL {self.nixl}"] if self.nixl else []
        head += [f"subject {self.subject}"] if self.subject else []
        head += [f"server {self.mx_server}"] if self.mx_server == "mxref" else []
        head += [f"server modelexpress {self.mx_server}"] if self.mx_server not in ("", "mxref") else []
        return " ".join([*(head or ["this environment"]), *(f"{k}={v}" for k, v in self.env)])

    def env_dict(self) -> dict[str, str]:
        """The column's environment: its env axes, and the server version a server column plays."""
        served = {} if self.mx_server in ("", "mxref") else {"MXCHAOS_MX_SERVER_VERSION": self.mx_server}
        return {**dict(self.env), **served}

    def subject_arg(self) -> list[str]:
        """``mxchaos run --subject ...`` for this column (none: each scenario's own): the client
        subject, and ``server=`` for a server column (``harness.subjects.mx_server.parse_subjects``)."""
        if not self.mx_server:
            return ["--subject", self.subject] if self.subject else []
        server = "mxref" if self.mx_server == "mxref" else "modelexpress"
        return ["--subject", ",".join([f"server={server}", *([f"client={self.subject}"] if self.subject else [])])]


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_axis(text: str) -> tuple[str, list[str]]:
    """``KEY=v1,v2`` -> ``("KEY", ["v1", "v2"])``; ValueError says what is wrong."""
    key, sep, values = text.partition("=")
    if not sep or not _KEY.match(key):
        raise ValueError(f"--env {text!r}: expected KEY=v1,v2 with KEY an environment variable name")
    vals = [v.strip() for v in values.split(",")]
    if not vals or any(not v for v in vals) or len(set(vals)) != len(vals):
        raise ValueError(f"--env {text!r}: give one or more distinct, non-empty values, comma-separated")
    return key, vals


def columns_for(versions: Sequence[str], axes: Sequence[tuple[str, list[str]]],
                subjects: Sequence[str] = (), servers: Sequence[str] = ()) -> list[Column]:
    """Every NIXL version (none: ``[""]``, this environment) x every server (``--mx-server``) x
    every subject x every combination of the env axes, versions outermost."""
    combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in axes])) if axes else [()]
    return [Column(v, tuple(combo), s, m) for v in versions or [""] for m in servers or [""] for s in subjects or [""]
            for combo in combos]


def cell_verdict(verdicts: Iterable[str]) -> str:
    """The worst verdict among the runs (``SEVERITY``); ``none`` when there is no run."""
    seen = {v.lower() for v in verdicts}
    for v in SEVERITY:
        if v in seen:
            return v
    return next(iter(sorted(seen)), "none")


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _versions(run_dir: Path) -> Any:
    """The run's ``versions.json`` (None: none, or unreadable)."""
    try:
        return read_json(run_dir / VERSIONS)
    except SavedDocError:
        return None


@dataclass
class RunTimings:
    """One run's timings from its timeline, each from the first fault's inject (None: no such
    entry, or no fault): to the first ``transfer_error``, the next ``load_done``, the first
    ``fallback``; and the ``gbps`` of every ``transfer_done``."""

    detection_s: float | None = None
    recovery_s: float | None = None
    fallback_s: float | None = None
    gbps: list[float] = field(default_factory=list)


def run_timings(run_dir: Path) -> RunTimings:
    """Timings of one run from its ``timeline.jsonl`` (absent ones are None)."""
    out = RunTimings()
    try:
        history = History.from_jsonl(run_dir / "timeline.jsonl")
    except (OSError, ValueError):  # no timeline, or a damaged one: no timings
        return out
    windows = history.fault_windows()
    fault_t = windows[0].start if windows else None  # from the first fault's inject
    for e in history:
        f, t, value = e.f, e.t, e.value
        if f == "transfer_done" and isinstance(value.get("gbps"), int | float):
            out.gbps.append(float(value["gbps"]))
        if fault_t is None or t < fault_t:
            continue
        since = round(t - fault_t, 4)
        if f == "transfer_error" and out.detection_s is None:
            out.detection_s = since
        elif f == "load_done" and out.recovery_s is None:
            out.recovery_s = since
        elif f == "fallback" and out.fallback_s is None:
            out.fallback_s = since
    return out


def _played(run_dir: Path, key: str = "subjects") -> dict[str, str]:
    """Who played the run's sources and readers (``servers``: its servers), from ``versions.json``:
    subject -> its version."""
    data = _versions(run_dir)
    subjects = data.get(key) if isinstance(data, dict) else None
    if not isinstance(subjects, dict):
        return {}
    return {str(k): str(v.get("version", "")) if isinstance(v, dict) else str(v) for k, v in subjects.items()}


def _loaded(run_dir: Path) -> tuple[str | None, str | None]:
    """(NIXL, UCX) versions the run loaded, from ``versions.json`` (``"1.5.1 (nixl)"`` -> ``1.5.1``)."""
    data = _versions(run_dir)
    if not isinstance(data, dict):
        return None, None

    def bare(v: Any) -> str | None:
        return str(v).split(" (")[0] if v else None

    return bare(data.get("nixl")), bare(data.get("ucx"))


def _runs_from_folders(out_dir: Path) -> dict[str, list[RunRecordDoc]]:
    """``{scenario: [run]}`` from ``DIR/<scenario>/<stamp>/verdict.json`` (no summary.json)."""
    found: dict[str, list[RunRecordDoc]] = {}
    for vpath in run_verdict_files(out_dir):
        doc = VerdictDoc.read_or_none(vpath)
        if doc is None:
            continue
        run = RunRecordDoc(verdict=doc.verdict, run_dir=str(vpath.parent), seed=doc.seed, seconds=doc.seconds)
        found.setdefault(doc.scenario or vpath.parent.parent.name, []).append(run)
    return found


@dataclass
class ColumnRead:
    cells: dict[str, MatrixCell] = field(default_factory=dict)
    nixl: list[str] = field(default_factory=list)  # versions the column's runs loaded
    ucx: list[str] = field(default_factory=list)


def _raw_for(raw_gbps: float | Mapping[str, float | None] | None, name: str) -> float | None:
    if isinstance(raw_gbps, Mapping):
        return raw_gbps.get(name)
    return raw_gbps


def read_column(out_dir: Path, scenarios: Sequence[str],
                raw_gbps: float | Mapping[str, float | None] | None = None) -> ColumnRead:
    """Every scenario's cell in one column folder (a scenario with no run: verdict ``none``).
    ``raw_gbps``: the raw READ the cells' ``read_ratio`` divides by, one for all or per scenario."""
    summary = SummaryDoc.read_or_none(SummaryDoc.in_folder(out_dir))
    by_summary = summary.scenarios if summary is not None else {}
    by_folders = _runs_from_folders(out_dir) if not by_summary else {}
    col = ColumnRead()
    for name in scenarios:
        entry = by_summary.get(name)
        runs: list[RunRecordDoc] = list(entry.runs) if entry else by_folders.get(name, [])
        verdicts = [r.verdict for r in runs]
        counts = Counter(verdicts)
        conclusive = [v for v in verdicts if v != "skip"]
        cell: dict[str, Any] = {
            "verdict": entry.cell if entry and entry.cell else cell_verdict(verdicts),
            "verdicts": dict(sorted(counts.items())),
            "failures": {"k": sum(1 for v in conclusive if v in BAD), "n": len(conclusive)},
            "rate": entry.rate if entry else None,
            "bound": entry.bound if entry else None,
            "measured": entry.measured if entry else None,
            "runs": [r.to_json() for r in runs],
        }
        seconds, detect, recover, fallback, gbps = [], [], [], [], []
        nixl, ucx = set(), set()
        played: dict[str, str] = {}
        served: dict[str, str] = {}
        for r in runs:
            if r.seconds is not None:
                seconds.append(float(r.seconds))
            rd = Path(r.run_dir)
            if not rd.is_dir():
                continue
            t = run_timings(rd)
            detect += [t.detection_s] if t.detection_s is not None else []
            recover += [t.recovery_s] if t.recovery_s is not None else []
            fallback += [t.fallback_s] if t.fallback_s is not None else []
            gbps += t.gbps
            played.update(_played(rd))
            served.update(_played(rd, "servers"))
            n, u = _loaded(rd)
            nixl.update([n] if n else [])
            ucx.update([u] if u else [])
        read = _median(gbps)
        cell.update(
            seconds=_median(seconds),
            detection_s=_median(detect),
            recovery_s=_median(recover),
            fallback_s=_median(fallback),
            read_gbps=read,
            read_ratio=round(read / raw, 3) if read is not None and (raw := _raw_for(raw_gbps, name)) else None,
            nixl=sorted(nixl),
            ucx=sorted(ucx),
            subjects=dict(sorted(played.items())),
            servers=dict(sorted(served.items())),
        )
        col.cells[name] = MatrixCell.model_validate(cell)
        col.nixl = sorted({*col.nixl, *nixl})
        col.ucx = sorted({*col.ucx, *ucx})
    return col
