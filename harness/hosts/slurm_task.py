"""One task of a dispatch's SLURM job array: ``python -m harness.hosts.slurm_task MANIFEST``.

Reads group ``$SLURM_ARRAY_TASK_ID`` of the manifest (``harness.hosts.slurm_array``), writes
``task.json`` into the group's folder (node, job id, when it started: the dispatcher reads it to
know the folder is visible from its side too), runs the group's ``mxchaos run`` there, passes a
SIGTERM/SIGINT on to it (``scancel`` sends SIGTERM; the run heals and tears down) and exits with
its code. Exit 3 with a line saying why when the manifest or the task id is not usable.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

EXIT_BAD_TASK = 3


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.hosts.slurm_task MANIFEST", file=sys.stderr)
        return EXIT_BAD_TASK
    manifest = Path(argv[0])
    try:
        groups = json.loads(manifest.read_text())
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
        group = groups[index]
        folder = Path(group["folder"])
        command = [str(a) for a in group["argv"]]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        print(f"mxchaos slurm task: cannot read group {os.environ.get('SLURM_ARRAY_TASK_ID')!r} of {manifest} "
              f"on {socket.gethostname()}: {exc} (--slurm needs the dispatcher's folders on every node)", file=sys.stderr)
        return EXIT_BAD_TASK
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps({
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "job": os.environ.get("SLURM_JOB_ID"),
        "array": os.environ.get("SLURM_ARRAY_JOB_ID"), "index": index, "started": time.time(), "pid": os.getpid()}))
    env = {**os.environ, **{str(k): str(v) for k, v in dict(group.get("env") or {}).items()}}
    child = subprocess.Popen(command, cwd=group.get("cwd") or None, env=env)

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
