"""The FUSE pass-through layer the ``disk`` fault mounts over a folder (its own process).

``python harness/faults/_faultfs.py FOLDER --fsname NAME --mode MODE ...`` opens ``FOLDER``
(an ``O_PATH`` descriptor), then mounts a FUSE file system on top of it whose every call is
passed through to that descriptor (``openat``, ``pread``, ``fstatat`` ...), so the folder's own
files stay reachable under the mount. Calls on the files that ``--match`` (shell patterns of
names) meet the fault:

``eio``     every read fails with EIO (a failing sector, a dead network disk)
``short``   every read returns at most ``--short-bytes`` bytes (a kernel that caches pages takes
            a short read for the file's end and fills the rest with zeros: the bytes lie)
``slow``    every read is delayed ``--delay`` seconds (a saturated or throttled disk)
``enospc``  every write, create and truncate fails with ENOSPC (a full disk)

``--after-bytes N``: the first N bytes read of each file are served honestly (the fault meets
a read that is under way). The layer runs in the foreground with ``direct_io`` off (readers
may ``mmap``) and ``kernel_cache`` off (every open drops the pages, so every read reaches it),
counts the calls it faulted and prints one ``faultfs ready`` line once mounted. It serves the
mounting user only (no ``allow_other``), with ``default_permissions`` (the kernel checks modes
and owners): another local user can neither read nor write through it. It dies with
the harness (``harness.faults._tether`` runs it) and unmounts on SIGTERM/SIGINT (libfuse's
handlers), so a harness killed outright leaves no live mount behind; one whose layer was SIGKILLed leaves a
dead one, which ``harness.faults.disk.sweep`` unmounts by its ``fsname``.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import os
import sys
import threading
import time
from typing import Any

import mfusepy

__all__ = ["MODES", "FaultFs", "main"]

MODES = ("eio", "short", "slow", "enospc")


class FaultFs(mfusepy.Operations):  # type: ignore[misc]  # mfusepy is untyped
    """Pass-through to the folder behind ``root`` (an ``O_PATH`` descriptor), faulting the
    files whose name matches ``match``."""

    use_ns = True

    def __init__(self, root: int, mode: str, match: tuple[str, ...], *, delay: float = 0.0,
                 short_bytes: int = 512, after_bytes: int = 0) -> None:
        self.root = root
        self.mode = mode
        self.match = match
        self.delay = delay
        self.short_bytes = short_bytes
        self.after_bytes = after_bytes
        self.faulted = 0
        self._read: dict[str, int] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _rel(path: str) -> str:
        rel = path.lstrip("/")
        return rel or "."

    def _hit(self, path: str) -> bool:
        name = os.path.basename(path)
        return any(fnmatch.fnmatch(name, pattern) for pattern in self.match)

    def _fault(self, op: str, path: str) -> None:
        """Count one faulted call and print its line, ``faultfs faulted MODE N OP PATH`` (the
        disk fault's witness reads them back: ``harness.faults.disk.layer_witness``)."""
        with self._lock:
            self.faulted += 1
            count = self.faulted
        print(f"faultfs faulted {self.mode} {count} {op} {path}", flush=True)

    # ------------------------------------------------------------------ metadata

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.stat(self._rel(path), dir_fd=self.root, follow_symlinks=False)
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
        out = {key: getattr(st, key) for key in keys}
        for key in ("st_atime", "st_mtime", "st_ctime"):
            out[key] = out.pop(key + "_ns")
        return out

    def readdir(self, path: str, fh: int) -> list[str]:
        fd = os.open(self._rel(path), os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root)
        try:
            return [".", "..", *os.listdir(fd)]
        finally:
            os.close(fd)

    def statfs(self, path: str) -> dict[str, int]:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.root)
        try:
            st = os.fstatvfs(fd)
        finally:
            os.close(fd)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_namemax")
        return {key: getattr(st, key) for key in keys}

    # ------------------------------------------------------------------ files

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR) and flags & os.O_TRUNC and self.mode == "enospc" and self._hit(path):
            self._fault("open", path)
            raise mfusepy.FuseOSError(errno.ENOSPC)
        return os.open(self._rel(path), flags & ~os.O_CREAT, dir_fd=self.root)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        if self.mode == "enospc" and self._hit(path):
            self._fault("create", path)
            raise mfusepy.FuseOSError(errno.ENOSPC)
        return os.open(self._rel(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, dir_fd=self.root)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if not self._hit(path) or self.mode == "enospc" or offset + size <= self.after_bytes:
            return os.pread(fh, size, offset)
        self._fault("read", path)
        if self.mode == "eio":
            raise mfusepy.FuseOSError(errno.EIO)
        if self.mode == "slow":
            time.sleep(self.delay)
            return os.pread(fh, size, offset)
        return os.pread(fh, min(size, self.short_bytes), offset)  # short

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        if self.mode == "enospc" and self._hit(path):
            self._fault("write", path)
            raise mfusepy.FuseOSError(errno.ENOSPC)
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        if self.mode == "enospc" and self._hit(path) and length > 0:
            self._fault("truncate", path)
            raise mfusepy.FuseOSError(errno.ENOSPC)
        fd = os.open(self._rel(path), os.O_WRONLY, dir_fd=self.root) if fh is None else fh
        try:
            os.ftruncate(fd, length)
        finally:
            if fh is None:
                os.close(fd)

    def unlink(self, path: str) -> None:
        os.unlink(self._rel(path), dir_fd=self.root)

    def rename(self, old: str, new: str) -> None:
        os.rename(self._rel(old), self._rel(new), src_dir_fd=self.root, dst_dir_fd=self.root)

    def flush(self, path: str, fh: int) -> None:
        return None

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        os.fsync(fh)

    def release(self, path: str, fh: int) -> None:
        os.close(fh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python harness/faults/_faultfs.py", description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--fsname", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--match", action="append", default=[])
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--short-bytes", type=int, default=512)
    parser.add_argument("--after-bytes", type=int, default=0)
    args = parser.parse_args(argv)
    root = os.open(args.folder, os.O_PATH | os.O_DIRECTORY)
    fs = FaultFs(root, args.mode, tuple(args.match or ["*"]), delay=args.delay, short_bytes=args.short_bytes,
                 after_bytes=args.after_bytes)
    try:
        # no allow_other: only the mounting user (the harness's, the run's processes') is served, and
        # default_permissions has the kernel check each file's mode and owner against the caller as
        # for any file system (the layer itself runs as root and would otherwise serve anyone as root)
        mfusepy.FUSE(fs, args.folder, foreground=True, nothreads=False, fsname=args.fsname, subtype="mxchaos",
                     default_permissions=True)
    except RuntimeError as exc:  # libfuse's loop ended by SIGTERM/SIGINT reads as an error code here
        print(f"faultfs loop ended: {exc}", flush=True)
    print(f"faultfs unmounted faulted={fs.faulted}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
