"""What a dead dispatcher's node-local lanes left on their nodes, taken back and removed by ``mxchaos cleanup``.

With ``--node-local DIR`` each lane writes its folder under the dispatch's own root on its node
(``DIR/<node>/<label>-<hex>``) and the dispatcher takes it back while the task holds its node. A
dispatcher that died never takes it: the task keeps it there once its hold ends, and a job that
cleanup cancels leaves it too. The dispatch's record (``harness.hosts.slurm_array``) names that
root (``local``) and the nodes its tasks ran on (``local_nodes``), so cleanup, once the jobs are
cancelled, runs on each such node two steps of a job of its own (the dispatch's jobs are gone; ``srun
--immediate``: a node that is not free within ``IMMEDIATE_S`` is reported, never waited for):
``python -m harness.hosts.slurm_task --pack ROOT`` writes the root as a tar stream, extracted into
``<spool>/left/<node>/`` here (the dispatch's spool, in the night's or column's folder: every member
through ``tarfile``'s ``data`` filter), and only then ``--remove ROOT`` removes it from the node. Each
node gives one line of the cleanup report: what was taken (bytes, where to) and removed, that nothing
was there, or why it was left (and where it stays); a member the filter refuses (a link out of the
folder, a device) is named and not taken.

Required as for the dispatch itself: this checkout and its interpreter at the same path on every node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.hosts import slurm
from harness.hosts.slurm_gather import Counted

__all__ = ["IMMEDIATE_S", "STEP_TIMEOUT_S", "sweep_node_local"]

IMMEDIATE_S = 30  # srun --immediate: a node not free this long is reported, not waited for
STEP_TIMEOUT_S = 300.0
EXIT_NOTHING = 5  # slurm_task --pack: no such folder on the node
_ROOT_RE = re.compile(r"^/[A-Za-z0-9_./-]*/\{node\}/[A-Za-z0-9_.-]+-[0-9a-f]{8}$")


def _step(name: str, node: str, *args: str) -> list[str]:
    srun = shutil.which("srun") or "srun"
    return [srun, f"--nodelist={slurm.valid_node(node)}", "-N1", "-n1", "--quiet", "--input=none",
            f"--immediate={IMMEDIATE_S}", f"--job-name={name}-sweep", sys.executable, "-m", "harness.hosts.slurm_task",
            *args]


def _take(name: str, node: str, root: str, into: Path, conf: Path) -> str:
    """One node: its root taken into ``into`` and removed there; the report's line."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    where = root.replace("{node}", node)
    proc = subprocess.Popen(_step(name, node, "--pack", root), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=os.getcwd())
    assert proc.stdout is not None and proc.stderr is not None
    counted, error, refused = Counted(proc.stdout), None, []
    try:
        with tarfile.open(fileobj=counted, mode="r|") as tar:  # type: ignore[call-overload]
            into.mkdir(parents=True, exist_ok=True)
            for member in tar:
                try:
                    tar.extract(member, into, filter="data")
                except tarfile.FilterError:  # a link out, a device: not taken (named), the rest is
                    refused.append(member.name)
    except (OSError, tarfile.TarError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    try:
        rc = proc.wait(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    said = proc.stderr.read().decode(errors="replace").strip()[-300:]
    proc.stdout.close()
    proc.stderr.close()
    if rc == EXIT_NOTHING:
        return f"nothing left of {name} on node {node} ({where})"
    if rc != 0 or error is not None or counted.count == 0:
        why = f"srun exited {rc}: {said or '(nothing said)'}" if rc != 0 else (error or "an empty stream")
        return f"left {where} on node {node} ({name}): could not take it ({why})"
    done = subprocess.run(_step(name, node, "--remove", root), capture_output=True, text=True, env=env,
                          timeout=STEP_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL, cwd=os.getcwd())
    if done.returncode != 0:
        return (f"took {where} from node {node} into {into} ({counted.count} bytes) but could not remove it there "
                f"(srun exited {done.returncode}: {done.stderr.strip()[-300:]})")
    skipped = f"; not taken (a link out of it, or no plain file): {', '.join(refused)[:300]}" if refused else ""
    return f"took {where} from node {node} into {into} ({counted.count} bytes) and removed it there{skipped}"


def sweep_node_local(record: Mapping[str, Any], conf: Path, *, dry_run: bool = False) -> list[str]:
    """A dead dispatch's node-local lane folders (module docstring): one line per node it ran on."""
    root, nodes, name = record.get("local"), record.get("local_nodes") or [], str(record.get("name", ""))
    if not isinstance(root, str):
        return []
    if not _ROOT_RE.match(root) or "/../" in f"{root}/" or not isinstance(nodes, list):
        return [f"the record of {name} names no node-local root of ours ({root!r}): nothing taken from its nodes"]
    spool = Path(str(record.get("spool") or ""))
    out = []
    for node in sorted({str(n) for n in nodes}):
        try:
            slurm.valid_node(node)
        except slurm.SlurmError as exc:
            out.append(f"not swept on a node of {name}: {exc}")
            continue
        if dry_run:
            out.append(f"would take {root.replace('{node}', node)} from node {node} ({name}) and remove it there")
            continue
        into = spool / "left" / node if spool.is_absolute() and spool.is_dir() else None
        if into is None:
            out.append(f"left {root.replace('{node}', node)} on node {node} ({name}): its spool {spool} is not here "
                       "to take it into")
            continue
        try:
            out.append(_take(name, node, root, into, conf))
        except (OSError, subprocess.SubprocessError) as exc:
            out.append(f"left {root.replace('{node}', node)} on node {node} ({name}): {exc}")
    return out
