"""A matrix column run as a plan: its lanes side by side, then its lone scenarios.

Where each scenario goes (``place``, ``plan_column``: ``harness.scenario.placement``, which a
night on SLURM shares); ``run_plan`` runs a plan through the matrix's runner: each lane and the
lone set one ``mxchaos run`` into a folder of its own under the column's, their ``summary.json``
joined into the column's, which the matrix reads as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.record.saved import SlurmColumn, SlurmLane, SummaryDoc
from harness.scenario.placement import (
    GLOBAL_CAPABILITIES,
    LANES_PER_CORE,
    TIGHT_WITHIN_S,
    LanePlacement,
    Plan,
    default_jobs,
    place,
    plan_column,
    spread,
)

__all__ = ["GLOBAL_CAPABILITIES", "LANES_PER_CORE", "TIGHT_WITHIN_S", "LanePlacement", "Plan", "RunGroup", "default_jobs",
           "place", "plan_column", "run_plan", "run_plan_slurm"]

# (scenario names, the folder their ``mxchaos run`` writes) -> (returncode, its output)
RunGroup = Callable[[Sequence[str], Path], tuple[int, str]]


def run_plan(plan: Plan, out_dir: Path, run: RunGroup, repeat: int,
             log: Callable[[str], None] = lambda _m: None) -> tuple[int, list[str]]:
    """Run ``plan`` into ``out_dir``: every lane at once (``lane-<i>/``), then the lone scenarios
    one after another in one run (``alone/``); then ``out_dir/summary.json`` joins their
    summaries. Returns the worst exit code (0 < 1 < anything else) and every run's output."""
    groups = [(f"lane-{i + 1}", lane) for i, lane in enumerate(plan.lanes)]
    log(f"{len(groups)} lanes side by side: " + "; ".join(f"{folder}: {', '.join(names)}" for folder, names in groups))
    results: list[tuple[int, str]] = []
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        results += list(pool.map(lambda g: run(g[1], out_dir / g[0]), groups))
    folders = [folder for folder, _ in groups]
    if plan.alone:
        log(f"then alone, one at a time: {', '.join(plan.alone)}")
        results.append(run(plan.alone, out_dir / "alone"))
        folders.append("alone")
    # a run that wrote no (readable) summary: its cells read as having no runs
    parts = [doc for folder in folders if (doc := SummaryDoc.read_or_none(SummaryDoc.in_folder(out_dir / folder)))]
    SummaryDoc.merged(parts, repeat).write(SummaryDoc.in_folder(out_dir))
    codes = [rc for rc, _ in results]
    worst = next((rc for rc in codes if rc not in (0, 1)), max(codes, default=0))
    return worst, [text for _, text in results]


def run_plan_slurm(placements: Sequence[LanePlacement], out_dir: Path, argv_of: Callable[[Sequence[str]], list[str]],
                   env: Mapping[str, str], options: Any, repeat: int,
                   log: Callable[[str], None] = lambda _m: None) -> tuple[int, dict[str, str], SlurmColumn]:
    """``--slurm``: the column's lanes (``spread`` over the partition's nodes, each lone scenario a
    lane of its own) as one SLURM job array (``harness.hosts.slurm_dispatch``, ``options`` its
    ``Options``); ``argv_of(names)`` is a lane's ``mxchaos run`` (its ``--out`` the dispatcher's
    ``FOLDER``). Each lane writes ``out_dir/<lane>/`` (a resubmitted one ``<lane>.a2/``) on the file
    system the nodes share; then ``out_dir/summary.json`` joins them, as ``run_plan``'s. Returns the
    worst exit code, each scenario of a lane that SLURM ended twice -> the infrastructure verdict,
    and what the dispatch did (for matrix.json)."""
    from harness.hosts.slurm_array import Group, partition_nodes
    from harness.hosts.slurm_dispatch import FOLDER, dispatch

    lanes = spread(placements, options.lane_slots(partition_nodes(options.conf, options.partition)))
    for name, names in lanes:
        log(f"{name}: {', '.join(names)}")
    groups = [Group(name, tuple(argv_of(names)), Path(FOLDER), dict(env)) for name, names in lanes]
    outcomes = dispatch(groups, out_dir / "slurm", options, log,
                        folder_for=lambda g, n: out_dir / (g.name if n == 1 else f"{g.name}.a{n}"))
    parts = [doc for o in outcomes if o.infra is None
             and (doc := SummaryDoc.read_or_none(SummaryDoc.in_folder(o.folder)))]
    SummaryDoc.merged(parts, repeat).write(SummaryDoc.in_folder(out_dir))
    infra = {n: o.infra for o, (_lane, names) in zip(outcomes, lanes) if o.infra for n in names}
    codes = [o.rc if o.rc is not None else 4 for o in outcomes if o.infra is None]
    worst = next((rc for rc in codes if rc not in (0, 1)), max(codes, default=0))
    record = SlurmColumn(nodes_per_lane=options.nodes_per_lane, lanes=[
        SlurmLane(name=name, scenarios=list(names), job=o.job, node=o.node, nodes=o.nodelist, rc=o.rc, infra=o.infra,
                  attempts=o.attempts, ends=o.ends, gathered=o.gathered, queued_to_start_s=o.queued_to_start_s)
        for o, (name, names) in zip(outcomes, lanes)])
    return worst, infra, record
