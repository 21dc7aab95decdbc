"""Run the matrix: build (or reuse) each version's env, run every column, write the results.

For each column (``cells.Column``: a NIXL version x a subject x one value of each env axis) the
env's own ``mxchaos run --repeat N --out OUT/<column id> -q [--subject S] SCENARIOS`` runs with the axis values set
in its environment, bounded by ``timeout_per_run`` x runs (+ a margin). An env whose
``mxchaos run`` has no ``--repeat`` is run N times instead (the folders are then read without
a ``summary.json``). Before the scenarios, ``python -m mxref.bench.raw`` measures a raw NIXL READ
in the same env and environment, once per READ size among the scenarios (their models' sizes:
``raw_reads``, bytes -> GB/s): a cell's ``read_ratio`` is its READ over the raw READ of the same
size. A
version whose env cannot be built is a column with ``error`` and no runs. Without versions
(``--subject`` alone) the columns run in this project's own environment (``here_env``). Then
``OUT/matrix.json`` and ``OUT/matrix.html`` (``harness.reports.matrix_page``) are written, with the
``--baseline`` diff (``harness.record.baseline``) when one is given; both are rewritten after
every column. A cell whose every run failed before any fault for an environment reason
(``harness.judge.envbroken``) is ``env_broken``, with ``error`` "environment broken: <reason>", not a
verdict. With ``resume`` a column whose folder already holds all its runs (an earlier,
interrupted matrix into the same ``--out``) is kept, not run again; its raw READs are measured anew.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.hosts.slurm_dispatch import FOLDER
from harness.judge.envbroken import ENV_BROKEN, LABEL, cell_reason, text_reason
from harness.matrix.defects import defect_here, defect_status
from harness.matrix.projection import matrix_seconds
from harness.matrix.schedule import LanePlacement, plan_column, run_plan, run_plan_slurm
from harness.record.baseline import diff_matrices
from harness.record.cells import NOT_INSTALLABLE, Column, read_column
from harness.record.saved import (
    ColumnSchedule,
    KnownDefect,
    MatrixCell,
    MatrixColumn,
    MatrixDoc,
    MatrixHeadline,
    MatrixScenario,
    SummaryDoc,
)
from harness.subjects.nixl_envs import EnvResult, ensure_env, error_line

__all__ = ["Execute", "MatrixSpec", "build_matrix", "default_execute", "not_installable", "run_matrix"]

SCHEMA_VERSION = 1
RAW_READ_BYTES = 64 << 20
RAW_READ_TIMEOUT_S = 120.0


@dataclass
class MatrixSpec:
    scenarios: list[Path]  # scenario files
    names: list[str]  # their scenario names, same order
    defects: dict[str, KnownDefect]  # name -> defect_info (the file's, shown on its row)
    columns: list[Column]
    repeat: int = 1
    out: Path = Path("matrix")
    repo: Path = Path(".")
    timeout_per_run: float = 300.0
    raw_read: bool = True
    read_bytes: dict[str, int] = field(default_factory=dict)  # name -> bytes its readers READ (the model's size)
    baseline: MatrixDoc | None = None
    drop: float = 0.2
    rebuild_envs: bool = False
    resume: bool = False  # reuse a column whose folder already holds all its runs (summary.json)
    jobs: int = 1  # lanes of a column at once (harness.matrix.schedule); 1: one run after another
    placements: list[LanePlacement] = field(default_factory=list)  # who may run beside others (none: all in one run)
    slurm: Any = None  # --slurm: harness.hosts.slurm_dispatch.Options; a column's lanes as one SLURM job array
    extra: dict[str, Any] = field(default_factory=dict)
    # name -> column id -> the defect in force there (harness.matrix.defects.column_defects); a name
    # not in it: its row's defect, where its servers' column runs it (defect_here)
    cell_defects: dict[str, dict[str, KnownDefect]] = field(default_factory=dict)
    # an --mx-server version or a --subject value that cannot play here (a nightly that did not
    # resolve, build or install) -> why: its columns are "not installable", never a failure
    unplayable: dict[str, str] = field(default_factory=dict)

    def unplayable_why(self, column: Column) -> str | None:
        return self.unplayable.get(column.mx_server) or self.unplayable.get(column.subject)


# (argv, env overrides, timeout) -> (returncode, stdout + stderr)
Execute = Callable[[Sequence[str], Mapping[str, str], float], tuple[int, str]]


def default_execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """Run a child with ``env`` added to ours; its output is returned (and also kept in the column's log)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, **env})
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, f"{out}\n(timed out after {timeout:g}s)"
    except OSError as exc:
        return 127, f"{type(exc).__name__}: {exc}"
    return done.returncode, done.stdout + done.stderr


def here_env() -> EnvResult:
    """This project's own environment (the interpreter running the matrix): the columns of a
    matrix without ``--nixl`` (``--subject`` only) run its ``mxchaos``."""
    return EnvResult("", Path(sys.prefix))


def here_nixl() -> str:
    """The NIXL version installed here ("" when none is)."""
    try:
        return importlib.metadata.version("nixl")
    except importlib.metadata.PackageNotFoundError:
        return ""


def not_installable(env: EnvResult) -> str:
    """What a column whose env could not be built says: ``not installable: <the step>: <pip's or
    Python's line>`` (``nixl`` 1.5.2: ``not installable: nixl: ERROR: No matching distribution found
    for nixl-cu12==1.5.2``)."""
    return f"not installable: {env.error}"


def _raw_read(env: EnvResult, column: Column, execute: Execute, nbytes: int) -> tuple[float | None, str | None]:
    argv = [*env.module("mxref.bench.raw"), "--bytes", str(nbytes), "--repeat", "3"]
    rc, out = execute(argv, {**column.env_dict(), **env.run_env()}, RAW_READ_TIMEOUT_S)
    for line in reversed(out.splitlines()):
        if line.startswith('{"raw_read"'):
            try:
                return float(json.loads(line)["raw_read"]["median_gbps"]), None
            except (ValueError, KeyError, TypeError):
                break
    return None, f"raw READ failed (rc {rc}): {error_line(out)}"


def column_complete(out_dir: Path, names: Sequence[str], repeat: int) -> bool:
    """Whether a column's folder holds a finished ``mxchaos run --repeat`` of exactly these
    scenarios: its ``summary.json`` (written once every scenario is judged) says ``repeat`` and
    has each scenario with its runs (fewer only when it was skipped)."""
    summary = SummaryDoc.read_or_none(SummaryDoc.in_folder(out_dir))
    if summary is None or summary.repeat != repeat:
        return False
    cells = summary.scenarios
    if set(cells) != set(names):
        return False
    return all(len(c.runs) == repeat or c.cell == "SKIP" for c in cells.values())


def _run_column(spec: MatrixSpec, env: EnvResult, column: Column, execute: Execute,
                log: Callable[[str], None], raw_reads: dict[Any, tuple[float | None, str | None]],
                say: Callable[[str], None]) -> MatrixColumn:
    """Run one column's scenarios; what running it left (the raw READs, the tool's exit code, the
    lanes), as the keys of its ``matrix.json`` column. ``log`` hears the column's own lines,
    ``say`` where its work went (a SLURM array's id and its resubmissions: what a user needs to
    find or cancel it, printed even when the column's lines are not)."""
    out_dir = spec.out / column.id
    if spec.resume and out_dir.is_dir() and not column_complete(out_dir, spec.names, spec.repeat):
        aside = spec.out / f"{column.id}.interrupted"  # what an interrupted column left, kept for a look
        shutil.rmtree(aside, ignore_errors=True)
        out_dir.rename(aside)
        log(f"[{column.id}] not complete in {out_dir}: moved to {aside.name}, running it again")
    out_dir.mkdir(parents=True, exist_ok=True)
    info = MatrixColumn(id=column.id, raw_read_gbps=None, raw_read_error=None, raw_reads={}, rc=None)
    if spec.raw_read:  # per READ size, once per env and environment: the subject columns of one env share them
        for nbytes in sorted(set(spec.read_bytes.values())) or [RAW_READ_BYTES]:
            key = (str(env.path), column.env, nbytes)
            if key not in raw_reads:
                raw_reads[key] = _raw_read(env, column, execute, nbytes)
            gbps, error = raw_reads[key]
            info.raw_reads[str(nbytes)] = gbps
            info.raw_read_error = info.raw_read_error or error
            info.raw_read_gbps = gbps  # the largest size's, for the column's line
            log(f"[{column.id}] raw READ of {nbytes / (1 << 20):g} MiB: {gbps or error} GB/s")
    if spec.resume and column_complete(out_dir, spec.names, spec.repeat):
        info.rc, info.resumed = 0, True
        log(f"[{column.id}] every scenario has its {spec.repeat} runs in {out_dir}: kept (--resume)")
        return info
    mxchaos, run_env = env.mxchaos(), {**column.env_dict(), **env.run_env()}
    rc_help, help_text = execute([*mxchaos, "run", "--help"], env.run_env(), 60.0)
    paths = [str(p.resolve()) for p in spec.scenarios]
    subject = column.subject_arg()
    runs = spec.repeat * len(paths)
    budget = spec.timeout_per_run * runs + 120.0
    logs = []
    plan = plan_column(spec.placements, spec.jobs, matrix_seconds(spec.baseline)) if spec.placements else None
    if rc_help == 0 and "--repeat" in help_text and spec.slurm is not None and spec.placements:
        by_name = dict(zip(spec.names, paths))

        def lane(names: Sequence[str]) -> list[str]:
            return [*mxchaos, "run", "--repeat", str(spec.repeat), "--out", FOLDER, "-q", *subject,
                    *(by_name[n] for n in names)]

        info.rc, info.infra, info.slurm = run_plan_slurm(spec.placements, out_dir, lane, run_env, spec.slurm,
                                                          spec.repeat, log=lambda m: say(f"[{column.id}] {m}"))
        logs += [f.read_text(errors="replace") for f in sorted((out_dir / "slurm").glob("*.out"))]
    elif rc_help == 0 and "--repeat" in help_text and plan is not None and plan.side_by_side:
        by_name = dict(zip(spec.names, paths))

        def group(names: Sequence[str], folder: Path) -> tuple[int, str]:
            argv = [*mxchaos, "run", "--repeat", str(spec.repeat), "--out", str(folder.resolve()), "-q", *subject,
                    *(by_name[n] for n in names)]
            return execute(argv, run_env, spec.timeout_per_run * spec.repeat * len(names) + 120.0)

        info.rc, texts = run_plan(plan, out_dir, group, spec.repeat, log=lambda m: log(f"[{column.id}] {m}"))
        info.schedule = ColumnSchedule(lanes=[list(lane) for lane in plan.lanes], alone=list(plan.alone))
        logs += texts
    elif rc_help == 0 and "--repeat" in help_text:
        argv = [*mxchaos, "run", "--repeat", str(spec.repeat), "--out", str(out_dir.resolve()), "-q", *subject, *paths]
        log(f"[{column.id}] run --repeat {spec.repeat} ... ({runs} runs, at most {budget:g}s)")
        rc, text = execute(argv, run_env, budget)
        info.rc = rc
        logs.append(text)
    else:  # an env whose mxchaos has no --repeat: N plain runs into the same folder
        for i in range(spec.repeat):
            argv = [*mxchaos, "run", "--out", str(out_dir.resolve()), "-q", *subject, *paths]
            log(f"[{column.id}] run {i + 1}/{spec.repeat} (no --repeat in this env; at most {budget / spec.repeat:g}s)")
            rc, text = execute(argv, run_env, budget / spec.repeat)
            info.rc = rc if info.rc in (None, 0, 1) else info.rc
            logs.append(text)
    (out_dir / "mxchaos-run.log").write_text("\n".join(logs))
    if info.rc not in (0, 1):  # 0/1: the runs ran (pass / something failed); else say what the tool said
        info.run_error = f"mxchaos run exited {info.rc}: {error_line(logs[-1] if logs else '')}"
    return info


def build_matrix(spec: MatrixSpec, envs: Mapping[str, EnvResult], infos: Mapping[str, MatrixColumn]) -> MatrixDoc:
    """``matrix.json``'s content from the column folders already under ``spec.out``."""
    columns: list[MatrixColumn] = []
    cells: dict[str, dict[str, MatrixCell]] = {name: {} for name in spec.names}
    headlines: list[MatrixHeadline] = []
    spelled = {r["version"]: r["spelling"] for r in spec.extra.get("resolved", ()) if r.get("version")}
    for column in spec.columns:
        env = envs[column.nixl]
        col = MatrixColumn.model_validate({
            "id": column.id, "label": column.label, "nixl": column.nixl, "subject": column.subject,
            "mx_server": column.mx_server, "env": column.env_dict(), "available": env.ok, "error": env.error,
            "env_path": str(env.path), "out_dir": column.id,
            **(infos[column.id].to_json() if column.id in infos else {})})
        for value in (column.mx_server, column.subject.partition("@")[2]):
            if value in spelled:  # the column's release came from latest-nightly: both are recorded
                col.resolved_from = {"spelling": spelled[value], "version": value}
        axis_why = spec.unplayable_why(column)
        if not env.ok or axis_why:  # the release cannot be installed here: a column saying why, no verdict on its scenarios
            col.error = why = not_installable(env) if not env.ok else f"not installable: {axis_why}"
            col.available = False
            for name in spec.names:
                cells[name][column.id] = MatrixCell(verdict=NOT_INSTALLABLE, error=why, runs=[], verdicts={},
                                                    failures={"k": 0, "n": 0})
            col.loaded_nixl, col.loaded_ucx = [], []
            columns.append(col)
            continue
        raw = {n: col.raw_reads.get(str(spec.read_bytes.get(n)), col.raw_read_gbps) for n in spec.names}
        read = read_column(spec.out / column.id, spec.names, raw)
        col.loaded_nixl, col.loaded_ucx = read.nixl, read.ucx
        for name in spec.names:
            cell = read.cells[name]
            if cell.verdict == "none" and col.run_error:
                cell.error = col.run_error
            # every run failed before any fault, for its environment (or no run, the tool itself did not
            # start there): no verdict on NIXL (harness.judge.envbroken)
            broken = (cell_reason(r.run_dir for r in cell.runs) if cell.runs
                      else (col.infra or {}).get(name) or text_reason(col.run_error or ""))
            if broken:
                cell.verdict, cell.error = ENV_BROKEN, f"{LABEL}: {broken}"
            for run in cell.runs:  # links relative to matrix.json
                rd = Path(run.run_dir)
                if rd.is_absolute():
                    try:
                        run.link = str(rd.resolve().relative_to(spec.out.resolve()))
                    except ValueError:
                        run.link = str(rd)
            if name in spec.cell_defects:  # the defect in force as this column plays it (column_defects)
                defect = spec.cell_defects[name].get(column.id)
            else:
                defect = spec.defects.get(name)
                played = "" if not column.mx_server else "mxref" if column.mx_server == "mxref" else "modelexpress"
                defect = defect if defect and defect_here(defect, played) else None
            if defect:
                cell.defect = status = defect_status(defect, column.nixl or here_nixl(), cell.verdicts)
                if status.headline:
                    headlines.append(MatrixHeadline(scenario=name, column=column.id, text=status.headline))
            cells[name][column.id] = cell
        columns.append(col)
    matrix = MatrixDoc.model_validate({
        "schema": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "repeat": spec.repeat,
        "scenarios": [MatrixScenario(name=n, path=str(p), defect=spec.defects.get(n))
                      for n, p in zip(spec.names, spec.scenarios)],
        "columns": columns,
        "cells": cells,
        "headlines": headlines,
        **spec.extra,
    })
    if spec.baseline is not None:
        matrix.baseline_changes = diff_matrices(spec.baseline, matrix, spec.drop)
    return matrix


def run_matrix(
    spec: MatrixSpec,
    *,
    ensure: Callable[[str], EnvResult] | None = None,
    execute: Execute = default_execute,
    log: Callable[[str], None] = lambda _m: None,
    column_log: Callable[[str], None] | None = None,
    started: Callable[[int, Column], None] = lambda _i, _c: None,
    ended: Callable[[int, Column, MatrixDoc], None] = lambda _i, _c, _m: None,
) -> MatrixDoc:
    """Build the envs, run every column, write ``matrix.json`` and ``matrix.html``; the matrix.
    ``log`` hears the envs being built and where a column's work went (its SLURM array),
    ``column_log`` (default: ``log``) what a column does as it runs; ``started(i, column)`` and ``ended(i, column, matrix so far)`` frame each column (i from 1)."""
    from harness.reports.matrix_page import render_matrix

    spec.out.mkdir(parents=True, exist_ok=True)
    make = ensure or (lambda v: ensure_env(v, spec.repo, log=log, rebuild=spec.rebuild_envs))
    envs: dict[str, EnvResult] = {}
    for version in dict.fromkeys(c.nixl for c in spec.columns):
        if not version:  # no --nixl: this project's own environment, nothing to build
            envs[version] = here_env()
            continue
        envs[version] = make(version)
        log(f"NIXL {version}: " + ("env ready" + (" (cached)" if envs[version].cached else "") if envs[version].ok
                                   else not_installable(envs[version])))
    infos: dict[str, MatrixColumn] = {}
    raw_reads: dict[Any, tuple[float | None, str | None]] = {}
    matrix = MatrixDoc(cells={})
    for i, column in enumerate(spec.columns, 1):
        started(i, column)
        if envs[column.nixl].ok and not spec.unplayable_why(column):
            infos[column.id] = _run_column(spec, envs[column.nixl], column, execute, column_log or log, raw_reads, log)
        # written after every column: a long matrix shows what it has so far (columns not run yet: no runs)
        matrix = build_matrix(spec, envs, infos)
        matrix.write(MatrixDoc.in_folder(spec.out))
        (spec.out / "matrix.html").write_text(render_matrix(matrix))
        ended(i, column, matrix)
    return matrix
