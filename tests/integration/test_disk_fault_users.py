"""The disk fault's FUSE layer serves the run's own user only (issue 36 item 7): another local user
(``nobody``, through ``setpriv``) can neither read nor write a file through the mounted layer, in a
folder whose path they may walk and whose file they could not read or write on the disk beneath.
On the parent commit the layer was mounted ``allow_other`` without ``default_permissions`` and
served every user as root: ``nobody`` read the 0600 file and appended to it through the mount."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.fault_context import FakeContext

from harness.faults import make_fault
from harness.faults.disk import DiskSpec, checkpoint_folder, fsname, mounts_named
from harness.scenario import capabilities

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.skipif(bool(capabilities.missing(["root", "fuse"])), reason="needs root and fuse"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]

NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")
SECRET = b"the checkpoint's bytes\n"


@pytest.fixture
def walkable() -> Iterator[Path]:
    """A run folder under /tmp that any user may walk (pytest's own tmp is 0700: nobody could not
    reach the mount at all, and the test would prove nothing)."""
    folder = Path(tempfile.mkdtemp(prefix="mxchaos-fuse-users-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=30, check=False)


def test_another_user_can_neither_read_nor_write_through_the_layer(walkable: Path) -> None:
    ctx = FakeContext(run_id="run-fuse-users", run_dir=walkable)
    ctx.add_process("reader-1", role="reader")
    folder = checkpoint_folder(walkable, "reader-1")
    folder.mkdir(parents=True)
    for part in (walkable / "checkpoints", folder):
        part.chmod(0o755)
    target = folder / "m.safetensors"
    target.write_bytes(SECRET)
    target.chmod(0o600)
    fault = make_fault(DiskSpec(kind="disk", target="reader-1", mode="slow", delay=0.001, match=("other*",)), "users")
    injected = fault.inject(ctx)
    try:
        assert str(folder) in mounts_named(fsname("run-fuse-users", "users"))
        assert target.read_bytes() == SECRET  # the run's own user is served
        read = _as_nobody("cat", str(target))
        assert read.returncode != 0 and SECRET.decode() not in read.stdout, f"nobody read it: {read.stdout!r}"
        write = _as_nobody("sh", "-c", f"printf planted >> {target}")
        assert write.returncode != 0, "nobody wrote through the layer"
        listing = _as_nobody("ls", str(folder))
        assert listing.returncode != 0, f"nobody listed the mount: {listing.stdout!r}"
        assert target.read_bytes() == SECRET
    finally:
        fault.heal(ctx, injected.token)
    assert mounts_named(fsname("run-fuse-users", "users")) == []
    assert target.read_bytes() == SECRET
