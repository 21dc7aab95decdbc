"""How SLURM says a job ended, from its accounting: ``sacct``.

The dispatcher reads each array task's end from here, not from the controller's memory of it:
``scontrol show job`` lists an ended job only ``MinJobAge`` seconds (and not at all after a
controller that lost its state), while accounting keeps it. Two sources, tried in this order
(``Accounting.ended``; the first answer decides for the rest of the dispatch):

- ``sacct -X -P -n -j J,... -o JobIDRaw,State,ExitCode,NodeList`` (``SOURCE_DB``): a site with an
  accounting database (``AccountingStorageType=accounting_storage/slurmdbd``);
- ``sacct -c -P -n -j J,... -o JobID,State,ExitCode,NodeList`` (``SOURCE_JOBCOMP``): the job
  completion log (``JobCompType=jobcomp/filetxt``, as the lab has: it needs no daemon), which
  ``sacct -c`` reads where the database is off (``sacct`` then says "accounting storage is
  disabled"). SLURM 22.05's reader of that log does not know its array fields (it warns
  ``Unknown type ArrayJobId``), so jobs are asked for by their own id (the task's ``JobId``,
  known from ``scontrol`` once the task has been listed), never by ``ARRAY_INDEX``.

A site with neither gives no answer (``SOURCE_NONE``): the dispatcher keeps ``scontrol``'s word and
says so. What sacct prints is input from elsewhere: a job id or node name that is not one is dropped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.hosts import slurm

__all__ = ["SOURCE_DB", "SOURCE_JOBCOMP", "SOURCE_NONE", "Accounting", "EndState", "parse"]

SOURCE_DB, SOURCE_JOBCOMP, SOURCE_NONE = "sacct", "sacct -c (job completion log)", "none"
CMD_TIMEOUT_S = 20.0
_CODE_RE = re.compile(r"^(\d{1,3}):(\d{1,3})$")
_NODELIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.,\[\]-]{0,1000}$")
_DISABLED = ("accounting storage is disabled", "slurmdbd", "connection refused", "unable to contact")


@dataclass(frozen=True)
class EndState:
    """One job's end as accounting has it: its state word (``NODE_FAIL``, ``CANCELLED by 0`` ->
    ``CANCELLED``), its exit code (None: not given), its node, and which source said so."""

    job: str
    state: str
    rc: int | None
    node: str  # its node when it had one (else ""; a multi-node job's are in ``nodes``)
    source: str
    nodes: str = ""  # its node list as SLURM writes it (h[1-2])

    def as_dict(self) -> dict[str, object]:
        return {"job": self.job, "state": self.state, "rc": self.rc, "node": self.node, "nodes": self.nodes,
                "source": self.source}


def parse(text: str, source: str) -> dict[str, EndState]:
    """``sacct -P -n`` lines ``JOB|STATE|EXIT|NODELIST`` -> job id -> its end (the last line of a
    job wins; a line whose job id or node is not one is dropped)."""
    out: dict[str, EndState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4:
            continue
        job, state, code, node = parts[0].strip(), parts[1].strip(), parts[2].strip(), parts[3].strip()
        try:
            slurm.valid_job_id(job)
        except slurm.SlurmError:
            continue
        word = state.split()[0].rstrip("+") if state else ""
        if not re.fullmatch(r"[A-Z_]{2,24}", word):
            continue
        match = _CODE_RE.match(code)
        nodes = node if _NODELIST_RE.match(node) and node not in ("None", "(null)") else ""
        try:
            node = slurm.valid_node(nodes) if nodes else ""
        except slurm.SlurmError:
            node = ""  # a node list (a multi-node job): no one node
        out[job] = EndState(job, word, int(match.group(1)) if match else None, node, source, nodes)
    return out


class Accounting:
    """sacct for one dispatch (``conf`` its cluster); ``source`` is what answered (None: not asked yet)."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf
        self.source: str | None = None

    def _sacct(self, args: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
        exe = shutil.which("sacct")
        if exe is None:
            return None
        try:
            return subprocess.run([exe, *args], capture_output=True, text=True, errors="replace", timeout=CMD_TIMEOUT_S,
                                  check=False, stdin=subprocess.DEVNULL, env={**os.environ, "SLURM_CONF": str(self.conf)})
        except subprocess.TimeoutExpired:
            return None

    def _ask(self, source: str, jobs: Sequence[str]) -> dict[str, EndState] | None:
        """One source's answer (None: that source is not there)."""
        ids = ",".join(jobs)
        if source == SOURCE_DB:
            done = self._sacct(["-X", "-P", "-n", "-j", ids, "-o", "JobIDRaw,State,ExitCode,NodeList"])
        else:
            done = self._sacct(["-c", "-P", "-n", "-j", ids, "-o", "JobID,State,ExitCode,NodeList"])
        if done is None:
            return None
        said = (done.stderr + done.stdout).lower()
        if done.returncode != 0 or (source == SOURCE_DB and any(w in said for w in _DISABLED)):
            return None
        return parse(done.stdout, source)

    def ended(self, jobs: Sequence[str]) -> dict[str, EndState]:
        """The end of each of ``jobs`` (their own job ids) that accounting has; jobs it has not (yet)
        are left out. Only ended states are returned (a job accounting lists as still running is left out)."""
        jobs = [j for j in jobs if j and "_" not in j]
        for j in jobs:
            slurm.valid_job_id(j)
        if not jobs or self.source == SOURCE_NONE:
            return {}
        for source in ([self.source] if self.source else [SOURCE_DB, SOURCE_JOBCOMP]):
            answer = self._ask(source, jobs)
            if answer is not None:
                self.source = source
                return {j: e for j, e in answer.items() if j in jobs and e.state not in _NOT_ENDED}
        self.source = SOURCE_NONE
        return {}


_NOT_ENDED = frozenset({"PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING",
                        "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT"})
