"""What ``harness.hosts.ssh`` runs on a host: the process wrapper, the process scan and the clock probe
(small Python programs given to the host's interpreter), and ``RemoteShell``, one long-lived
``sh`` per host for the short commands faults and signals run. A leaf of ``harness.hosts.ssh``."""

from __future__ import annotations

import contextlib
import queue
import secrets
import shlex
import subprocess
import threading
import time
from typing import IO, Protocol

from harness.hosts.base import ExecResult

__all__ = ["CLOCK", "PYTHON_FLAGS", "SAFE_PATH_ENV", "SCAN", "WORKDIR", "WRAPPER", "RemoteShell", "ShellHost", "shell_path"]

# Our own programs there run isolated (-I: no PYTHON* variables, no user site, and neither the
# working folder nor the script's on sys.path); the programs a scenario starts get PYTHONSAFEPATH=1
# (-P, Python 3.11+), which keeps the working folder off their sys.path but honours PYTHONPATH (the
# checkout) and is inherited by whatever they start. A module planted where a process runs is
# never imported.
PYTHON_FLAGS = "-I"
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}


def shell_path(path: str) -> str:
    """``path`` as a word of a remote shell line: quoted, a leading ``~/`` the login's home."""
    return f'"$HOME"/{shlex.quote(path[2:])}' if path.startswith("~/") else shlex.quote(path)


class ShellHost(Protocol):
    """What a remote shell needs of its host (``harness.hosts.ssh.SshHost``)."""

    name: str
    plumbing: str
    local_env: dict[str, str]
    lost: str | None

    def ssh_argv(self, *, tty: bool = False) -> list[str]: ...

    def mark_lost(self, why: str) -> None: ...

    def check_alive(self) -> None: ...

# Runs on the host: fork the program into its own session (the wrapper a subreaper, in the run's
# cgroup where it can join one, so the program and all it forks stay findable), report its pid and
# its end.
WRAPPER = r"""
import os, sys, json
spec = json.loads(sys.argv[1])
log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
try:  # a subreaper: what the program orphans stays below this wrapper, where the scan finds it
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
rid = spec["env"].get("MXCHAOS_RUN_ID", "")
if rid and "/" not in rid and not rid.startswith("."):  # the run's cgroup there, where one may be written
    mounts = []  # (root, `ip netns exec` hides them: a lab host has none)
    try:
        for line in open("/proc/self/mountinfo"):
            head, _, tail = line.partition(" - ")
            t = tail.split()
            if len(t) > 2 and (t[0] == "cgroup2" or (t[0] == "cgroup" and "freezer" in t[2].split(","))):
                mounts.append((t[0] != "cgroup2", head.split()[4]))
    except OSError:
        pass
    for _v1, mount in sorted(mounts):
        try:
            os.makedirs(os.path.join(mount, "mxchaos", rid), exist_ok=True)
            with open(os.path.join(mount, "mxchaos", rid, "cgroup.procs"), "w") as procs:
                procs.write("0")
            break
        except OSError:
            pass
pid = os.fork()
if pid == 0:
    os.setsid()
    os.chdir(spec["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0); os.dup2(log, 1); os.dup2(log, 2)
    env = dict(os.environ); env.update(spec["env"])
    try:
        os.execvpe(spec["argv"][0], spec["argv"], env)
    except OSError as exc:
        os.write(2, ("cannot start %r: %s\n" % (spec["argv"][0], exc)).encode())
        os._exit(127)
import signal
signal.signal(signal.SIGHUP, signal.SIG_IGN)
print("pid %d" % pid, flush=True)
_, status = os.waitpid(pid, 0)
rc = os.waitstatus_to_exitcode(status)
with open(spec["rc"] + ".%d" % pid, "w") as out:
    out.write(str(rc))
try:
    print("rc %d" % rc, flush=True)
except OSError:
    pass
"""

# Runs on the host: the processes of a run (pid, run id, proc, state, cmdline, harness pid and start):
# those of the login's user carrying MXCHAOS_RUN_ID=<run id> (empty: any), those in the run's cgroup there (the wrapper
# joins mxchaos/<run id> where it can: root, a cgroup v2 or v1 freezer mounted, not hidden as
# `ip netns exec` hides it), and every descendant of them and of the run's wrappers (a child started with a clean environment, or one that overwrote it with its process
# title; what a program orphaned stays below its wrapper, a subreaper), named after its nearest
# tagged ancestor. With a second argument: the harness's own remote plumbing of a run instead
# (MXCHAOS_SSH_RUN_ID: tails, shells, wrappers), which a crashed harness leaves behind.
SCAN = r"""
import os, sys, json
want = sys.argv[1].encode()
plumbing = len(sys.argv) > 2
key = (sys.argv[2] if plumbing else "MXCHAOS_RUN_ID").encode() + b"="
wrap = b"MXCHAOS_SSH_RUN_ID="
procs, tags = {}, {}
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) == os.getpid():
        continue
    try:
        stat = open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()
        env = open("/proc/%s/environ" % d, "rb").read().split(b"\0")
        cmd = open("/proc/%s/cmdline" % d, "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    procs[int(d)] = (stat[0], int(stat[1]), cmd)
    try:  # a tag counts only on a process of the login's own user: anyone may write an environment
        own = [ln.split()[1:3] for ln in open("/proc/%s/status" % d) if ln.startswith("Uid:")][0] == [str(os.geteuid())] * 2
    except (OSError, IndexError):
        own = False
    if not own:
        continue
    run = [e[len(key):] for e in env if e.startswith(key)]
    wrapper = [e[len(wrap):] for e in env if e.startswith(wrap)] if not plumbing else []
    if run and (not want or run[0] == want):
        proc = [e[13:].decode() for e in env if e.startswith(b"MXCHAOS_PROC=")]
        hp = [e[20:].decode() for e in env if e.startswith(b"MXCHAOS_HARNESS_PID=")]
        hs = [e[22:].decode() for e in env if e.startswith(b"MXCHAOS_HARNESS_START=")]
        tags[int(d)] = [run[0].decode(), proc[0] if proc else None, int(hp[0]) if hp and hp[0].isdigit() else None,
                        int(hs[0]) if hs and hs[0].isdigit() else None, True]
    elif wrapper and (not want or wrapper[0] == want):
        tags[int(d)] = [wrapper[0].decode(), None, None, None, False]
scoped = {}  # the run's cgroups there (the wrapper joins one where it can)
if not plumbing:
    try:
        for line in open("/proc/self/mountinfo"):
            head, _, tail = line.partition(" - ")
            t = tail.split()
            if len(t) > 2 and (t[0] == "cgroup2" or (t[0] == "cgroup" and "freezer" in t[2].split(","))):
                top = os.path.join(head.split()[4], "mxchaos")
                for rid in ([want.decode()] if want else (os.listdir(top) if os.path.isdir(top) else [])):
                    for folder, _dirs, _files in os.walk(os.path.join(top, rid)):
                        for p in open(os.path.join(folder, "cgroup.procs")).read().split():
                            scoped[int(p)] = rid
    except (OSError, ValueError):
        pass
out = []
for pid, (state, ppid, cmd) in procs.items():
    tag, up, seen = tags.get(pid), ppid, {pid}
    while tag is None and up in procs and up not in seen:
        seen.add(up)
        tag, up = tags.get(up), procs[up][1]
    if tag is None and pid in scoped:
        tag = [scoped[pid], None, None, None, True]
    if tag is None or state == "Z" or (pid in tags and not tag[4]):
        continue
    out.append([pid, tag[0], tag[1], state, cmd[:300], tag[2], tag[3]])
print(json.dumps(out))
"""

# Runs on the host (as the login user, under -I): make and check the work dir and make the run's
# folder in it, through descriptors so nothing can be swapped between check and use. Every
# component from / is lstat'ed: no symbolic link; each folder on the way owned by root or the login
# and writable by no one else unless sticky (as /tmp); the work dir's parent writable by no one
# else at all (sticky or not: someone could make the work dir first); the work dir owned by the
# login and writable by no one else (a missing folder is made 0700, the work dir's group and other
# bits are dropped). Then <run>/ (new: mkdir fails on one that exists), its marker, procs/ and
# files/, all 0700. Prints the work dir's absolute path; a refusal is rc 3 and one line naming the
# path and the rule. The interpreter must be Python 3.11+ (PYTHONSAFEPATH).
WORKDIR = r"""
import os, stat, sys
raw, run, marker = sys.argv[1], sys.argv[2], sys.argv[3]
work = os.path.join(os.path.expanduser("~"), raw[2:]) if raw.startswith("~/") else raw
euid = os.geteuid()
def no(path, rule):
    sys.stderr.write("refusing work dir %s: %s: %s\n" % (work, path, rule))
    sys.exit(3)
if sys.version_info < (3, 11):
    no(sys.executable, "Python %d.%d; the harness needs 3.11+ there (PYTHONSAFEPATH keeps the working folder "
       "off sys.path)" % sys.version_info[:2])
parts = work.split("/")[1:]
if not work.startswith("/") or not all(parts) or "." in parts or ".." in parts:
    no(work, "not an absolute path of plain names (no ., .., //)")
if not run or run in (".", "..") or "/" in run:
    no(run, "not a run id")
FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
fd, path = os.open("/", FLAGS), ""
for i, name in enumerate(parts):
    path += "/" + name
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        no(path, "a symbolic link (to %r); give the real path, with no symlink in it" % os.readlink(name, dir_fd=fd))
    if not stat.S_ISDIR(st.st_mode):
        no(path, "not a directory")
    if i == len(parts) - 1:
        if st.st_uid != euid:
            no(path, "owned by uid %d, not by the login user (uid %d); remove it or give another work_dir" % (st.st_uid, euid))
        if mode & 0o022:
            no(path, "writable by group or others (mode %04o), so someone else may have put files there; remove it "
               "or give another work_dir" % mode)
    else:
        if st.st_uid not in (0, euid):
            no(path, "a folder on the way is owned by uid %d, not by root or the login user (uid %d)" % (st.st_uid, euid))
        if mode & 0o022 and (i == len(parts) - 2 or not mode & stat.S_ISVTX):
            no(path, "the work dir's parent is writable by others (mode %04o): someone could make or replace the work "
               "dir there (a shared temp dir is no work_dir)" % mode if i == len(parts) - 2 else
               "a folder on the way is writable by others (mode %04o) and not sticky" % mode)
    nfd = os.open(name, FLAGS, dir_fd=fd)
    if (os.fstat(nfd).st_dev, os.fstat(nfd).st_ino) != (st.st_dev, st.st_ino):
        no(path, "it changed while it was checked")
    os.close(fd)
    fd = nfd
os.fchmod(fd, 0o700)
os.mkdir(run, 0o700, dir_fd=fd)
rfd = os.open(run, FLAGS, dir_fd=fd)
for sub in ("procs", "files"):
    os.mkdir(sub, 0o700, dir_fd=rfd)
m = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=rfd)
os.write(m, (run + "\n").encode())
os.close(m)
print(work)
"""

CLOCK = "import sys,time\nfor line in sys.stdin:\n    print(repr(time.monotonic()), flush=True)\n"


class RemoteShell:
    """One long-lived ``sh`` on the host over the master, for the short commands faults and
    signals run (an ssh session per command costs a session set-up on the host, ~0.3 s on a
    loaded machine). Each command runs in a subshell, followed by a marker line with its exit
    code; one at a time; a command past its deadline (or a lost connection) ends the shell and
    the next command starts a new one."""

    MARK = "__mxchaos_rc__"

    def __init__(self, host: ShellHost) -> None:
        self.host = host
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([*self.host.ssh_argv(), f"{self.host.plumbing} exec sh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env=self.host.local_env)
        lines: queue.Queue[bytes | None] = queue.Queue()

        def pump(out: IO[bytes]) -> None:
            with contextlib.suppress(ValueError, OSError):  # closed under it by _end
                for raw in out:
                    lines.put(raw)
            lines.put(None)

        assert proc.stdout is not None
        threading.Thread(target=pump, args=(proc.stdout,), name=f"mxchaos-sh-{self.host.name}", daemon=True).start()
        self._lines = lines
        return proc

    def run(self, line: str, timeout: float) -> ExecResult:
        started = time.monotonic()
        if self.host.lost:
            return ExecResult(255, "", self.host.lost, 0.0)
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            nonce = secrets.token_hex(6)
            try:
                assert proc.stdin is not None
                proc.stdin.write(f"( {line} ) </dev/null 2>&1; rc=$?; printf '\\n{self.MARK}{nonce} %d\\n' $rc\n".encode())
                proc.stdin.flush()
            except OSError:
                self._end()
                return ExecResult(255, "", f"{self.host.name}: the remote shell is gone", time.monotonic() - started)
            out: list[str] = []
            deadline = started + timeout
            while True:
                try:
                    raw = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self._end()
                    self.host.mark_lost(f"`{line[:80]}` got no answer within {timeout:g}s")
                    return ExecResult(None, "".join(out), f"{self.host.name}: no answer within {timeout:g}s",
                                      time.monotonic() - started)
                if raw is None:
                    self._end()
                    self.host.check_alive()
                    return ExecResult(255, "".join(out), f"{self.host.name}: the connection ended", time.monotonic() - started)
                text = raw.decode(errors="replace")
                if text.startswith(f"{self.MARK}{nonce} "):
                    text_out = "".join(out)
                    return ExecResult(int(text.split()[1]), text_out[:-1] if text_out.endswith("\n") else text_out, "",
                                      time.monotonic() - started)
                out.append(text)

    def _end(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):  # its end of input first: the shell there ends by itself
                if proc.stdin is not None:
                    proc.stdin.close()
            with contextlib.suppress(OSError):
                proc.terminate()  # (an srun client cancels its step on SIGTERM; SIGKILL would leave it)
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()

    def close(self) -> None:
        with self._lock:
            self._end()
