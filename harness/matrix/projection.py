"""A matrix's wall time on N nodes, projected from the durations a column measured.

``mxchaos project SOURCE`` reads each scenario's measured run seconds (a ``matrix.json``: its
cells' medians, the longest column's, as the lanes are balanced on; or a ``summary.json`` of
``mxchaos run``: the median of its runs) and the scenarios' placements (``schedule.place``: which
must run alone), and projects the wall time of ``releases`` columns x the catalogue x ``repeat``
runs on clusters of 1, 4, 16, 64 nodes under the lane rules of a column spread over SLURM:

* a shared scenario's runs (``repeat`` of them, one after another, as in its lane) take one of a
  node's ``lanes_per_node`` lanes;
* an alone scenario's runs take a whole node, nothing beside them;
* every lane (an array task) pays ``overhead_s`` once: submission to its first run start, and the
  gather of its folder.

The schedule is list scheduling, longest first (the alone units first, each on the node free
soonest; then the shared units each on the lane free soonest). Never below the lower bound printed
beside it (the longest unit, or the total work over the lanes); for shared units only, longest
first is within 4/3 of the best schedule (Graham's bound), while alone units, which idle a node's
other lanes, may keep it further above the bound. Pure: ``project`` decides, ``render`` writes the table.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.record.saved import MatrixDoc, SavedDocError, SummaryDoc
from harness.scenario.placement import LanePlacement

__all__ = ["DEFAULT_NODES", "Projection", "ProjectionInput", "column_seconds", "matrix_seconds", "project",
           "read_seconds", "render"]

DEFAULT_NODES = (1, 4, 16, 64)


def matrix_seconds(doc: MatrixDoc | None) -> dict[str, float]:
    """Each scenario's run seconds in a matrix (``MatrixDoc.scenario_seconds``; none without one)."""
    return doc.scenario_seconds() if doc is not None else {}


def column_seconds(doc: SummaryDoc) -> dict[str, float]:
    """Each scenario's run seconds in one ``mxchaos run`` (the median of its runs)."""
    out: dict[str, float] = {}
    for name, cell in doc.scenarios.items():
        times = [r.seconds for r in cell.runs if r.seconds is not None and r.seconds > 0]
        if times:
            out[name] = float(statistics.median(times))
    return out


def read_seconds(source: Path) -> tuple[dict[str, float], list[str]]:
    """(scenario -> seconds, the scenario files recorded) from a ``matrix.json``, a ``summary.json``,
    or a folder holding one; ``SavedDocError`` naming the file and what is wrong otherwise."""
    path = source
    if source.is_dir():
        found = [p for p in (MatrixDoc.in_folder(source), SummaryDoc.in_folder(source)) if p.is_file()]
        if not found:
            raise SavedDocError(f"{source}: no {MatrixDoc.FILE} or {SummaryDoc.FILE} in this folder")
        path = found[0]
    if not path.is_file():
        raise SavedDocError(f"{path}: no such file (give a {MatrixDoc.FILE}, a {SummaryDoc.FILE} or a folder of one)")
    if path.name == MatrixDoc.FILE:
        matrix = MatrixDoc.read(path)
        files = [s.path for s in matrix.scenarios if s.path] if matrix is not None else []
        seconds = matrix_seconds(matrix)
    else:
        summary = SummaryDoc.read(path)
        seconds, files = (column_seconds(summary) if summary is not None else {}), []
    if not seconds:
        raise SavedDocError(f"{path}: no run with its seconds recorded: nothing to project from")
    return seconds, files


@dataclass(frozen=True)
class ProjectionInput:
    """What a projection weighs: each scenario's measured seconds a run and whether it runs alone."""

    seconds: Mapping[str, float]
    alone: frozenset[str]
    releases: int = 3
    repeat: int = 5
    lanes_per_node: int = 4
    overhead_s: float = 0.0

    def units(self) -> tuple[list[float], list[float]]:
        """(alone units, shared units): one per scenario and release, its ``repeat`` runs together."""
        alone: list[float] = []
        shared: list[float] = []
        for name, seconds in self.seconds.items():
            unit = seconds * self.repeat + self.overhead_s
            (alone if name in self.alone else shared).extend([unit] * self.releases)
        return alone, shared


@dataclass(frozen=True)
class Projection:
    nodes: int
    wall_s: float
    lower_bound_s: float
    busy: float  # the lanes' busy share of nodes x lanes x wall


def project(given: ProjectionInput, nodes: int) -> Projection:
    """The wall time of ``given`` on ``nodes`` nodes (module docstring)."""
    if nodes < 1 or given.lanes_per_node < 1:
        raise ValueError(f"nodes {nodes}, lanes per node {given.lanes_per_node}: at least 1 each")
    alone, shared = given.units()
    lanes = given.lanes_per_node
    # each node's lanes, as the times they are next free
    free: list[list[float]] = [[0.0] * lanes for _ in range(nodes)]
    for unit in sorted(alone, reverse=True):  # a whole node: it starts when the node's last lane is free
        node = min(range(nodes), key=lambda n: (max(free[n]), n))
        end = max(free[node]) + unit
        free[node] = [end] * lanes
    heap = [(t, n, i) for n in range(nodes) for i, t in enumerate(free[n])]
    heapq.heapify(heap)
    for unit in sorted(shared, reverse=True):
        t, n, i = heapq.heappop(heap)
        heapq.heappush(heap, (t + unit, n, i))
    wall = max((t for t, _, _ in heap), default=0.0)
    work = sum(shared) + sum(u * lanes for u in alone)
    bound = max(max(alone + shared, default=0.0), work / (nodes * lanes))
    return Projection(nodes, wall, bound, work / (nodes * lanes * wall) if wall else 0.0)


def placements_alone(placements: Sequence[LanePlacement]) -> frozenset[str]:
    return frozenset(p.name for p in placements if p.alone)


def _clock(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"


def render(given: ProjectionInput, rows: Sequence[Projection], unplaced: Sequence[str] = ()) -> str:
    """The projection as a table, with what it assumed."""
    alone, shared = given.units()
    head = (f"{len(given.seconds)} scenarios ({len(given.alone & set(given.seconds))} alone) x {given.releases} "
            f"releases x {given.repeat} repeats: {len(alone) + len(shared)} lane units, "
            f"{_clock(sum(alone) + sum(shared))} of runs in all; {given.lanes_per_node} lanes a node, "
            f"{given.overhead_s:g} s dispatch overhead a lane")
    lines = [head, "", f"{'nodes':>6}  {'wall':>8}  {'bound':>8}  {'busy':>5}"]
    for row in rows:
        lines.append(f"{row.nodes:>6}  {_clock(row.wall_s):>8}  {_clock(row.lower_bound_s):>8}  {row.busy:>5.0%}")
    if unplaced:
        lines += ["", f"no scenario file found for {len(unplaced)} (counted as shared): {', '.join(unplaced)}"]
    return "\n".join(lines)
