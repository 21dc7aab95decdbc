"""Reaching a node of a SLURM allocation through ``srun`` instead of ssh (``reach: srun``).

Where a site refuses ssh into its nodes, a host bound to a node of a running job is reached with
a job step of that job on that node: every command the host runs there (the process wrapper, the
long-lived shell faults and signals use, the tails of events files, the clock probe, the fetch of
the per-run folder) goes through ``argv`` + a shell line, where an ssh host puts its ssh client::

    srun --overlap --jobid=J -w NODE --nodes=1 --ntasks=1 --quiet --export=PATH,HOME,... /bin/sh -c LINE

``--overlap``: the step shares the job's resources with its other steps (the harness's several at a
time, and the job's own work). ``--export``: only what a login shell would have (and the harness's
plumbing tag), never the harness's whole environment, as over ssh. Signals reach a process by the pid
its wrapper reported, from the host's shell (itself a step on the node), so freeze (SIGSTOP), kill
and stop work as over ssh.

``failure``: srun's own failures (no such job, a node the job does not hold, a step that could not
be created or was cancelled under the command) told from the command's exit code, which srun
passes on: srun reports its own trouble on stderr as ``srun: error:`` / ``srun: fatal:`` /
``slurmstepd: error:`` lines, and the command's end as ``srun: error: NODE: task N: Exited with exit
code C`` (or a signal's name). A failure of srun's is the environment's (the host is lost, rc 255
as for ssh's own failure), never the command's.
"""

from __future__ import annotations

import re

__all__ = ["EXPORT", "argv", "failure"]

EXPORT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "MXCHAOS_SSH_RUN_ID")
_OWN = re.compile(r"^(srun: (error|fatal)|slurmstepd: error):")
_TASK_END = re.compile(r"^srun: error: \S+: tasks? [0-9,\-]+: ")


def argv(job: str, node: str) -> list[str]:
    """The command prefix a shell line is appended to (``[*argv(job, node), line]``); ``job`` and
    ``node`` are checked by the inventory (``harness.hosts.inventory.SrunPlace``)."""
    return ["srun", "--overlap", f"--jobid={job}", "-w", node, "--nodes=1", "--ntasks=1", "--quiet",
            f"--export={','.join(EXPORT)}", "--job-name=mxchaos-step", "/bin/sh", "-c"]


def failure(rc: int | None, stderr: str) -> str | None:
    """srun's own failure (its lines, joined), or None when the exit code is the command's."""
    if rc in (0, None):
        return None
    own = [line.strip() for line in stderr.splitlines() if _OWN.match(line.strip()) and not _TASK_END.match(line.strip())]
    return "; ".join(own)[-400:] if own else None
