"""One task of a dispatch's SLURM job array: ``python -m harness.hosts.slurm_task MANIFEST``.

Reads group ``$SLURM_ARRAY_TASK_ID`` of the manifest (``harness.hosts.slurm_array``; ``-``: from
standard input, the here-document of the batch script when the nodes do not see the dispatcher's
folders), writes ``task.json`` into the group's folder (node, job id, when it started: the
dispatcher reads it to know the folder is visible from its side too), runs the group's ``mxchaos
run`` there, passes a SIGTERM/SIGINT on to it (``scancel`` sends SIGTERM; the run heals and tears
down) and exits with its code. Exit 3 with a line saying why when the manifest or the task id is not
usable.

**Node-local results** (the group is ``local``): its folder is on this node (``{node}`` in it and in
the argv: this node's name); the run's output goes to ``task.out`` there, and when the run has
ended the task writes ``task.done`` and holds its node (at most ``GATHER_WAIT_S``) until the
dispatcher has taken the folder: the dispatcher's ``srun --overlap --jobid J -w NODE python -m
harness.hosts.slurm_task --gather FOLDER`` (``gather``) waits for ``task.done``, writes the folder
as a tar stream on its standard output (srun carries it back), and when the dispatcher answers
``ok`` on its standard input marks the folder ``gathered``; the task then removes the folder and
exits. Unanswered, the folder stays on the node (the task says so) and the dispatcher, which did not
get it, calls the lane the infrastructure's.

What a dead dispatcher left on a node (its lanes' folders under the dispatch's own root, kept after
the hold or when ``mxchaos cleanup`` cancelled the job) is taken by cleanup in two steps of a job of
its own on that node (``harness.hosts.slurm_leftover``): ``--pack ROOT`` writes the root as a tar
stream (exit 5 when there is none), ``--remove ROOT`` removes it once cleanup has the stream.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

EXIT_BAD_TASK = 3
GATHER_WAIT_S = 300.0  # the task holds its node this long for the dispatcher to take its folder
DONE, GATHERED = "task.done", "gathered"
EXIT_NOTHING = 5  # --pack: no such folder on this node


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _on_node(text: str) -> str:
    return text.replace("{node}", _node())


def _read_manifest(source: str) -> Any:
    return json.loads(sys.stdin.read() if source == "-" else Path(source).read_text())


def gather(template: str, wait: float) -> int:
    """The dispatcher's end of a node-local folder (module docstring): 0 when it was taken."""
    folder = Path(_on_node(template))
    deadline = time.monotonic() + wait
    while not (folder / DONE).exists():
        if time.monotonic() > deadline:
            print(f"mxchaos slurm gather: {folder / DONE} not there after {wait:g}s on {_node()}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        tar.add(str(folder), arcname=".")
    sys.stdout.buffer.flush()
    return 0


def taken(template: str) -> int:
    """The dispatcher has the folder (its second step): mark it so the task removes it and ends."""
    folder = Path(_on_node(template))
    if not (folder / DONE).exists():
        print(f"mxchaos slurm taken: {folder} is no ended lane's folder on {_node()}", file=sys.stderr)
        return 1
    (folder / GATHERED).write_text(str(time.time()))
    return 0


def pack(template: str) -> int:
    """A dead dispatch's root on this node as a tar stream on standard output (cleanup's first step)."""
    root = Path(_on_node(template))
    if not root.is_dir():
        return EXIT_NOTHING
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        tar.add(str(root), arcname=".")
    sys.stdout.buffer.flush()
    return 0


def remove(template: str) -> int:
    """Cleanup has the root: remove it from this node (its second step)."""
    shutil.rmtree(Path(_on_node(template)), ignore_errors=True)
    return 0


def _hold_until_gathered(folder: Path) -> None:
    deadline = time.monotonic() + GATHER_WAIT_S
    while not (folder / GATHERED).exists():
        if time.monotonic() > deadline:
            print(f"mxchaos slurm task: nobody took {folder} on {_node()} within {GATHER_WAIT_S:g}s: it stays there",
                  file=sys.stderr)
            return
        time.sleep(0.2)
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--gather":
        return gather(argv[1], float(argv[2]))
    if len(argv) == 2 and argv[0] == "--taken":
        return taken(argv[1])
    if len(argv) == 2 and argv[0] in ("--pack", "--remove"):
        return (pack if argv[0] == "--pack" else remove)(argv[1])
    if len(argv) != 1:
        print("usage: python -m harness.hosts.slurm_task MANIFEST|- | --gather FOLDER WAIT_S", file=sys.stderr)
        return EXIT_BAD_TASK
    try:
        groups = _read_manifest(argv[0])
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
        group = groups[index]
        local = bool(group.get("local"))
        folder = Path(_on_node(str(group["folder"])) if local else group["folder"])
        command = [_on_node(str(a)) if local else str(a) for a in group["argv"]]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        print(f"mxchaos slurm task: cannot read group {os.environ.get('SLURM_ARRAY_TASK_ID')!r} of {argv[0]} "
              f"on {socket.gethostname()}: {exc} (--slurm needs the dispatcher's folders on every node)", file=sys.stderr)
        return EXIT_BAD_TASK
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.json").write_text(json.dumps({
        "node": _node(), "job": os.environ.get("SLURM_JOB_ID"), "array": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "index": index, "started": time.time(), "pid": os.getpid(), "folder": str(folder), "local": local}))
    env = {**os.environ, **{str(k): str(v) for k, v in dict(group.get("env") or {}).items()}}
    with open(folder / "task.out", "ab") if local else open(os.devnull, "wb") as out:
        sink = {"stdout": out, "stderr": subprocess.STDOUT} if local else {}
        child = subprocess.Popen(command, cwd=group.get("cwd") or None, env=env, **sink)  # type: ignore[call-overload]

        def forward(signum: int, _frame: FrameType | None) -> None:
            if child.returncode is None:
                child.send_signal(signum)
                return
            # cancelled while holding its ended lane's folder: the folder stays (cleanup takes it), the task ends now
            print(f"mxchaos slurm task: signal {signum} while holding {folder} on {_node()}: it stays there", file=sys.stderr)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        rc: int = child.wait()
    if local:
        (folder / DONE).write_text(json.dumps({"rc": rc, "ended": time.time()}))
        _hold_until_gathered(folder)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
