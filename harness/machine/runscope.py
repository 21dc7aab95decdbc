"""A run's scope: the one way to find, and end, every process a run started, children included.

A process's environment is no way to find it: a program may start its children with a clean one,
and redis-server and sshd overwrite theirs with their process title (``/proc/PID/environ`` of a
running redis-server is blank). So every process a run starts through a host's spawn path
(``harness.hosts.base``) joins the run's scope between fork and exec, and whatever it forks later is in
it too:

- **cgroup** (root and a writable cgroup file system): the child writes itself into
  ``<mount>/mxchaos/<run id>/cgroup.procs``. cgroup v2 when mounted (``cgroup.kill`` ends the
  whole group in one write, forks in flight included), else cgroup v1's ``freezer`` (frozen, each
  member SIGKILLed, thawed: nothing forks away meanwhile). No controller is enabled: membership
  only, no limit and no accounting changes. A child cannot leave a cgroup it did not create.
- **ledger** (always; all there is without cgroups): ``<ledger dir>/<run id>.pids`` names the
  harness (pid and start time) and each process it spawned (pid and start time). Each is a
  session leader (hosts start every child in a session of its own), so the run's processes are
  also those whose session is a recorded leader's (a leader whose pid now names another session
  leader, by its start time, no longer counts), and every descendant of any of them.

Every signal goes through ``signal_exact``: to the process with that pid *and* the start time it
had when it was found, through a pidfd (so a pid reused in between is never signalled).

``members`` is every live pid of a run found either way (and the descendants of ``seeds``, the
processes found by their ``MXCHAOS_RUN_ID``: ``harness.machine.procscan.find`` merges the two); ``kill``
ends them, cgroup first; ``remove`` deletes the scope (cgroups, ledger) once it is empty; ``runs``
lists the runs that have one and ``owner`` the harness of one. ``MXCHAOS_CGROUP`` = ``auto``
(default), ``v2``, ``freezer`` or ``off`` picks what new processes join; finding and killing
always look at every hierarchy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.machine import ledger

__all__ = [
    "ENV_CGROUP",
    "Hierarchy",
    "ProcStat",
    "hierarchies",
    "joining",
    "kill",
    "members",
    "owner",
    "proc_stat",
    "record",
    "remove",
    "runs",
    "scope_paths",
    "signal_exact",
    "valid_run_id",
]

ENV_CGROUP = "MXCHAOS_CGROUP"
SCOPE_DIR = "mxchaos"
FREEZE_WAIT_S = 1.0
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:+=-]{0,199}$")


def valid_run_id(run_id: str) -> str:
    """``run_id`` if it can name a cgroup and a ledger file (no ``/``, no leading dot); ValueError
    naming the rule otherwise (a ``--run-id`` from the command line is checked here)."""
    if not _RUN_ID_RE.match(run_id):
        raise ValueError(f"run id {run_id!r}: 1 to 200 of A-Z a-z 0-9 _ . : + = -, not starting with . or -")
    return run_id


# ---------------------------------------------------------------------------- /proc


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    session: int
    start: int  # clock ticks since boot (field 22)


def proc_stat(pid: int) -> ProcStat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[3]), int(fields[19]))


def signal_exact(pid: int, start: int | None, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process that started at ``start`` (clock
    ticks since boot, as found): a pidfd is opened first, the start time checked after, and the
    signal sent through the pidfd, so the process checked is the one signalled. ``start`` None
    (not known) sends nothing. Whether it was sent."""
    if start is None:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            return False  # gone (ESRCH), or not ours to open
        st = proc_stat(pid)  # a kernel before 5.3: checked, then signalled by pid (a narrow window)
        if st is None or st.start != start:
            return False
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
            return True
        return False
    try:
        st = proc_stat(pid)
        if st is None or st.start != start:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _all_stats() -> dict[int, ProcStat]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None:
                out[st.pid] = st
    return out


# ---------------------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class Hierarchy:
    kind: str  # "v2" or "freezer"
    mount: Path

    def scope(self, run_id: str) -> Path:
        return self.mount / SCOPE_DIR / run_id


def _mounted() -> list[Hierarchy]:
    """The cgroup v2 and v1-freezer hierarchies mounted here (v2 first)."""
    found: list[Hierarchy] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields, extra = head.split(), tail.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        mount = Path(fields[4].replace("\\040", " "))
        if extra[0] == "cgroup2":
            found.insert(0, Hierarchy("v2", mount))
        elif extra[0] == "cgroup" and "freezer" in extra[2].split(","):
            found.append(Hierarchy("freezer", mount))
    return found


def hierarchies() -> list[Hierarchy]:
    """Where scopes may live, in the order new processes prefer (``MXCHAOS_CGROUP`` narrows it)."""
    choice = os.environ.get(ENV_CGROUP, "auto")
    usable = [h for h in _mounted() if os.access(h.mount, os.W_OK)]
    if choice == "off":
        return []
    if choice in ("v2", "freezer"):
        return [h for h in usable if h.kind == choice]
    return usable


def _scopes(run_id: str) -> list[Path]:
    """The run's cgroups in every mounted hierarchy (whatever the preference), nested ones too."""
    out = []
    for h in _mounted():
        top = h.scope(run_id)
        if top.is_dir():
            out += [Path(d) for d, _subdirs, _files in os.walk(top)]
    return out


def scope_paths(run_id: str) -> list[Path]:
    """The run's cgroups (top level, each hierarchy) and its ledger file, those that exist."""
    valid_run_id(run_id)
    paths = [h.scope(run_id) for h in _mounted() if h.scope(run_id).is_dir()]
    return paths + [p for p in [_ledger_file(run_id)] if p.exists()]


def _cgroup_pids(folder: Path) -> set[int]:
    with contextlib.suppress(OSError, ValueError):
        return {int(x) for x in (folder / "cgroup.procs").read_text().split()}
    return set()


def _open_procs(run_id: str) -> int | None:
    """``cgroup.procs`` of the run's cgroup in the preferred hierarchy, open for writing (made if
    need be); None without a usable hierarchy."""
    for h in hierarchies():
        folder = h.scope(run_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            continue
    return None


@contextlib.contextmanager
def joining(run_id: str | None) -> Iterator[Callable[[], None] | None]:
    """A ``preexec_fn`` that puts the child into the run's cgroup (None: no run id, or no
    cgroup: the ledger still finds it). The child only writes "0" (itself) to a descriptor
    opened here, so it is safe in a threaded parent; a failed write leaves it to the ledger."""
    fd = _open_procs(valid_run_id(run_id)) if run_id else None
    if fd is None:
        yield None
        return

    def join() -> None:
        with contextlib.suppress(OSError):
            os.write(fd, b"0")

    try:
        yield join
    finally:
        os.close(fd)


def _kill_cgroup(folder: Path) -> None:
    """SIGKILL every process in ``folder`` with nothing forking away meanwhile: v2's
    ``cgroup.kill``; else freeze, kill each, thaw (v2 ``cgroup.freeze`` or v1 ``freezer.state``)."""
    kill_file = folder / "cgroup.kill"
    if kill_file.exists():
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
            return
    v1 = (folder / "freezer.state").exists()
    freeze, thaw = (("freezer.state", "FROZEN"), ("freezer.state", "THAWED")) if v1 else \
        (("cgroup.freeze", "1"), ("cgroup.freeze", "0"))
    frozen = False
    with contextlib.suppress(OSError):
        (folder / freeze[0]).write_text(freeze[1])
        frozen = True
        deadline = time.monotonic() + FREEZE_WAIT_S  # a task in D state may take a while: kill anyway
        while time.monotonic() < deadline:
            state = (folder / "freezer.state").read_text() if v1 else (folder / "cgroup.events").read_text()
            if ("FROZEN" in state) if v1 else ("frozen 1" in state):
                break
            time.sleep(0.01)
    try:
        for pid in _cgroup_pids(folder):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    finally:
        if frozen:
            with contextlib.suppress(OSError):
                (folder / thaw[0]).write_text(thaw[1])


# ---------------------------------------------------------------------------- the ledger of pids


def _ledger_file(run_id: str) -> Path:
    return ledger.ledger_dir() / f"{run_id}.pids"


def record(run_id: str, pid: int, harness: tuple[int, int | None] | None = None) -> None:
    """Add ``pid`` (with its start time) to the run's ledger; the first record names the harness.
    Best effort: the cgroup (and the run's tag) still find it."""
    path = _ledger_file(valid_run_id(run_id))
    st = proc_stat(pid)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            lines = ""
            if os.fstat(fd).st_size == 0:
                hp, hs = harness or (os.getpid(), _start_of(os.getpid()))
                lines += f"harness {hp} {hs if hs is not None else '-'}\n"
            lines += f"pid {pid} {st.start if st else '-'}\n"
            os.write(fd, lines.encode())
        finally:
            os.close(fd)


def _start_of(pid: int) -> int | None:
    st = proc_stat(pid)
    return st.start if st else None


def _read_ledger(run_id: str) -> tuple[tuple[int, int | None] | None, list[tuple[int, int | None]]]:
    """(harness, spawned pids), each with its start time. A file another user could have written
    (not ours, or writable by others, or a link) is ignored: it could name any process."""
    try:
        fd = os.open(_ledger_file(run_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None, []
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or not stat.S_ISREG(info.st_mode):
            return None, []
        with os.fdopen(os.dup(fd)) as src:
            text = src.read(1 << 20)
    finally:
        os.close(fd)
    harness: tuple[int, int | None] | None = None
    pids: list[tuple[int, int | None]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        entry = (int(parts[1]), int(parts[2]) if parts[2].isdigit() else None)
        if parts[0] == "harness":
            harness = entry
        elif parts[0] == "pid":
            pids.append(entry)
    return harness, pids


def owner(run_id: str) -> tuple[int | None, int | None]:
    """The harness (pid, start time) the run's ledger names; (None, None) when it has none."""
    harness, _pids = _read_ledger(run_id)
    return harness if harness is not None else (None, None)


# ---------------------------------------------------------------------------- finding and ending


def members(run_id: str, seeds: Iterable[int] = ()) -> set[int]:
    """Every live process of the run: in its cgroups; a recorded process (same start time) or a
    member of a recorded leader's session; and every descendant of those and of ``seeds``."""
    return set(_members(run_id, seeds))


def _members(run_id: str, seeds: Iterable[int] = ()) -> dict[int, int]:
    """``members``, each with its start time as found."""
    valid_run_id(run_id)
    stats = _all_stats()
    live = {pid for pid, st in stats.items() if st.state not in ("Z", "X")}
    found: set[int] = set()
    for folder in _scopes(run_id):
        found |= _cgroup_pids(folder)
    _harness, recorded = _read_ledger(run_id)
    sessions = set()
    for pid, start in recorded:
        st = stats.get(pid)
        if st is not None and start is not None and st.start == start:
            found.add(pid)
        holder = stats.get(pid)  # the pid now names another session's leader: not ours any more
        if holder is None or holder.session != pid or holder.start == start:
            sessions.add(pid)
    found |= {p for p, st in stats.items() if st.session in sessions}
    found |= set(seeds)
    children: dict[int, list[int]] = {}
    for st in stats.values():
        children.setdefault(st.ppid, []).append(st.pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(os.getpid())
    return {pid: stats[pid].start for pid in found & live}


def kill(run_id: str, seeds: Iterable[int] = (), wait: float = 5.0) -> list[int]:
    """SIGKILL the whole run (its cgroups at once, then each member found), again until none is
    left or ``wait`` has passed; the pids still alive then."""
    deadline = time.monotonic() + wait
    seeds = set(seeds)
    while True:
        for folder in _scopes(run_id):
            _kill_cgroup(folder)
        left = _members(run_id, seeds)
        for pid, start in left.items():
            signal_exact(pid, start)
        seeds &= set(left)
        if not left or time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.02)


def remove(run_id: str) -> list[str]:
    """Delete the run's cgroups (they must be empty: a cgroup with a member stays) and its ledger
    file once no cgroup is left; what went."""
    gone = []
    for folder in sorted(_scopes(run_id), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
            gone.append(f"cgroup {folder}")
    path = _ledger_file(run_id)
    if path.exists() and not _scopes(run_id):
        with contextlib.suppress(OSError):
            path.unlink()
            gone.append(f"pid ledger {path}")
    return gone


def runs() -> set[str]:
    """Every run with a scope here (a cgroup in any hierarchy, or a ledger of pids)."""
    found = set()
    for h in _mounted():
        with contextlib.suppress(OSError):
            found |= {p.name for p in (h.mount / SCOPE_DIR).iterdir() if p.is_dir() and _RUN_ID_RE.match(p.name)}
    with contextlib.suppress(OSError):
        found |= {p.name[: -len(".pids")] for p in ledger.ledger_dir().glob("*.pids") if _RUN_ID_RE.match(p.name[:-5])}
    return found
