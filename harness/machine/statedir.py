"""The harness's own state directory, and the one way to make and open what lives in it.

The state directory (``$MXCHAOS_STATE_DIR``, else ``$XDG_RUNTIME_DIR/mxchaos-<uid>``, else
``/tmp/mxchaos-<uid>``) holds the run ledger (``runs/``), port reservations (``ports/``) and the
lab (``lab/``: its client key, host keys, sshd configs). The harness runs as root on shared
machines, so a directory someone else could have made or can write is refused, never used:

- every component of the path is checked with ``lstat`` from ``/`` down: none may be a symbolic
  link; each ancestor is owned by root or by us and writable by no one else, unless it is a
  sticky directory owned by root or us (as ``/tmp``: others may add entries there but cannot
  rename or remove ours);
- the directory itself (and each folder made in it) is ours: owned by our effective uid, not
  writable by group or others (refused: someone may already have put something there); a
  missing one is made 0700 and an existing one's read bits for group and others are dropped;
- files are created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (``write_new``, ``replace``), locks
  opened with ``O_NOFOLLOW`` (``open_lock``), and read back only when they are regular files we
  own (``read_owned``); a folder the harness records (a run folder) is found again by its device
  and inode (``dir_identity``, ``open_recorded_dir``), and trees are removed only when they are
  ours and no symlink (``remove_tree``).

A refusal is a ``StateDirError`` naming the path and the rule it breaks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path

from harness.errors import HarnessError

__all__ = [
    "ENV", "StateDirError", "dir_identity", "ensure_dir", "open_lock", "open_recorded_dir", "read_owned", "remove_tree",
    "replace", "state_dir", "subdir", "write_new",
]

ENV = "MXCHAOS_STATE_DIR"
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class StateDirError(HarnessError):
    """A state path that is not the harness's own (the message names the path and the rule)."""


def default_base() -> Path:
    """Where the state directory is when ``$MXCHAOS_STATE_DIR`` is not set."""
    return Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"mxchaos-{os.getuid()}"


def base() -> Path:
    """The state directory's path (absolute, not checked): ``$MXCHAOS_STATE_DIR`` or the default."""
    return Path(os.path.abspath(os.environ.get(ENV) or default_base()))


def _refuse(path: Path, rule: str, setting: str = ENV, what: str = "harness state") -> StateDirError:
    where = f" (${setting} is {os.environ[setting]!r})" if os.environ.get(setting) else ""
    return StateDirError(f"{what}: refusing {path}{where}: {rule}")


def _a_real_folder(path: Path, st: os.stat_result, link_hint: str, setting: str = ENV, what: str = "harness state") -> None:
    """A folder, not a symbolic link (``link_hint``: what to do instead of the link)."""
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, f"it is a symbolic link (to {os.readlink(path)!r}); {link_hint}", setting, what)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is not a directory", setting, what)


def _trusted_ancestor(path: Path, st: os.stat_result, setting: str = ENV, what: str = "harness state") -> None:
    euid = os.geteuid()
    _a_real_folder(path, st, "give the real path, with no symlink in it", setting, what)
    if st.st_uid not in (0, euid):
        raise _refuse(path, f"a folder on the way is owned by uid {st.st_uid}, not by root or us (uid {euid})", setting, what)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise _refuse(path, f"a folder on the way is writable by others (mode {stat.S_IMODE(st.st_mode):04o}) "
                            "and not sticky", setting, what)


def _own(path: Path, st: os.stat_result, setting: str = ENV, what: str = "harness state") -> None:
    euid = os.geteuid()
    _a_real_folder(path, st, "the harness uses only a folder it owns", setting, what)
    if st.st_uid != euid:
        raise _refuse(path, f"it is owned by uid {st.st_uid}, not by us (uid {euid}); remove it or choose another ${setting}",
                      setting, what)
    if st.st_mode & 0o022:
        raise _refuse(path, f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}), so someone "
                            f"else may have put files there; remove it or choose another ${setting}", setting, what)


def ensure_dir(path: Path | str, *, create: bool = True, setting: str = ENV, what: str = "harness state") -> Path | None:
    """``path`` checked as the module docstring says (made 0700 when missing and ``create``);
    None when it is missing and not ``create``. StateDirError when it is not ours, naming
    ``what`` and the variable that chooses the folder (``setting``: the checkpoint cache is
    checked the same way, as ``$MXCHAOS_CACHE_DIR``)."""
    target = Path(os.path.abspath(path))
    parts = target.parts
    current = Path(parts[0])
    for i, name in enumerate(parts[1:], start=1):
        current = current / name
        last = i == len(parts) - 1
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            if not create:
                return None
            with contextlib.suppress(FileExistsError):  # made at the same time by another harness: checked below
                os.mkdir(current, 0o700)
            st = os.lstat(current)
        if last:
            _own(current, st, setting, what)
            if st.st_mode & 0o077:  # ours and no one else could write it: only tighten
                fd = os.open(current, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fchmod(fd, 0o700)
                finally:
                    os.close(fd)
        else:
            _trusted_ancestor(current, st, setting, what)
    if len(parts) == 1:
        raise _refuse(target, "the file system root is no state directory", setting, what)
    return target


def state_dir() -> Path:
    """The state directory, checked (and made 0700 when missing)."""
    folder = ensure_dir(base())
    assert folder is not None
    return folder


def subdir(name: str, *, create: bool = True) -> Path | None:
    """``<state dir>/<name>``, checked like the state directory (None: missing, not ``create``)."""
    top = ensure_dir(base(), create=create)
    return None if top is None else ensure_dir(top / name, create=create)


def write_new(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create ``path`` (which must not exist, symlink included) with ``data``."""
    fd = os.open(path, _NEW, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def replace(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``path`` whole (a fresh file under a random name, then renamed over it: a reader never
    sees half of it, and a symlink at ``path`` is replaced, not followed)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        write_new(tmp, data, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_owned(path: Path) -> bytes:
    """The content of ``path`` if it is a regular file we own (not followed if a symlink);
    FileNotFoundError when missing, StateDirError when not ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink
            raise _refuse(path, "it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "it is not a regular file")
        if st.st_uid != os.geteuid():
            raise _refuse(path, f"it is owned by uid {st.st_uid}, not by us (uid {os.geteuid()})")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_lock(path: Path) -> int:
    """A read-write descriptor of the lock file ``path`` (made 0600 when missing; never through a
    symlink, never a file that is not regular); StateDirError otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "a lock file that is a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, "a lock file that is not a regular file")
    return fd


def dir_identity(path: Path) -> dict[str, int]:
    """What names a folder the harness made, so it can be found again and told from a look-alike
    (a symlink or another folder put at its path): its device and inode."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "not a directory")
    return {"dev": st.st_dev, "ino": st.st_ino}


def open_recorded_dir(path: Path, identity: object) -> int | None:
    """A descriptor of the folder at ``path`` if it is the one ``identity`` (``dir_identity``)
    recorded and we own it; None otherwise (missing, a symlink, another folder, not ours)."""
    if not isinstance(identity, dict) or not all(isinstance(identity.get(k), int) for k in ("dev", "ino")):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (identity["dev"], identity["ino"]) or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def remove_tree(path: Path) -> bool:
    """Remove the folder ``path`` and everything in it, if it is ours and no symlink (symlinks in
    it are removed, never followed); False when missing, StateDirError when not ours."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    _own(path, st)
    if not shutil.rmtree.avoids_symlink_attacks:  # pragma: no cover - Linux has the fd-based one
        raise _refuse(path, "this platform's rmtree may follow a symlink swapped in while it runs")
    shutil.rmtree(path)
    return True
