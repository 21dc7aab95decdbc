"""The disk fault: its scenario rules (a reader's own checkpoint, delay for slow only), the
FUSE layer's fault rules called directly on a folder (no mount), and, where this machine can
mount FUSE, a real mount over a folder that fails writes with ENOSPC and reads with EIO,
healed (unmounted) by heal and by sweep."""

from __future__ import annotations

import errno
import os
import textwrap
from pathlib import Path

import mfusepy
import pytest
from fixtures.fault_context import FakeContext

from harness.errors import ScenarioInvalid
from harness.faults import REGISTRY, make_fault
from harness.faults._faultfs import FaultFs
from harness.faults.disk import Disk, DiskSpec, checkpoint_folder, fsname, layer_counts, layer_witness, mounts_named
from harness.scenario import capabilities, parse_scenario

SCENARIO = """\
name: t
processes:
  server: {role: server}
  reader-1: {role: reader%s}
steps:
  - start: server
  - fault: {kind: disk, target: %s, mode: %s}
"""


def scenario(target: str = "reader-1", mode: str = "eio", reader: str = "") -> str:
    return textwrap.dedent(SCENARIO % (reader, target, mode))


def test_a_disk_fault_on_a_reader_validates_and_needs_root_and_fuse() -> None:
    sc = parse_scenario(scenario(), "x.yaml")
    assert sc is not None
    assert REGISTRY["disk"].requires == ("root", "fuse")
    assert capabilities.scenario_requirements(sc)["fuse"] == ["disk-1 (disk)"]


@pytest.mark.parametrize(("text", "says"), [
    (scenario(target="server"), "acts on a reader's checkpoint folder, and 'server' is a server"),
    (scenario(reader=", options: {checkpoint: m.safetensors}"), "cannot name options.checkpoint"),
    (scenario(reader=", tamper_checkpoint: {}"), "use one"),
    (scenario(mode="slow"), "a disk fault of mode slow needs delay"),
    (scenario(mode="eio, delay: 1s"), "delay applies to mode slow only"),
    (scenario(mode="rot"), "mode"),
])
def test_bad_disk_faults_are_refused_naming_the_rule(text: str, says: str) -> None:
    with pytest.raises(ScenarioInvalid) as err:
        parse_scenario(text, "x.yaml")
    assert says in str(err.value)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "m.safetensors").write_bytes(bytes(range(256)) * 16)  # 4 KiB
    (tmp_path / "notes.txt").write_bytes(b"plain")
    return tmp_path


def layer(folder: Path, mode: str, **kw: object) -> FaultFs:
    return FaultFs(os.open(folder, os.O_PATH | os.O_DIRECTORY), mode, ("*.safetensors",), **kw)  # type: ignore[arg-type]


def test_eio_fails_reads_of_matching_files_past_after_bytes_only(folder: Path) -> None:
    fs = layer(folder, "eio", after_bytes=1024)
    fh = fs.open("/m.safetensors", os.O_RDONLY)
    assert fs.read("/m.safetensors", 512, 512, fh) == (bytes(range(256)) * 4)[512:1024]  # within after_bytes
    with pytest.raises(mfusepy.FuseOSError) as err:
        fs.read("/m.safetensors", 512, 1024, fh)
    assert err.value.errno == errno.EIO
    other = fs.open("/notes.txt", os.O_RDONLY)
    assert fs.read("/notes.txt", 100, 0, other) == b"plain"  # not matched: passed through
    assert fs.faulted == 1


def test_short_reads_return_at_most_short_bytes_and_enospc_fails_writes(folder: Path) -> None:
    fs = layer(folder, "short", short_bytes=100)
    fh = fs.open("/m.safetensors", os.O_RDONLY)
    assert len(fs.read("/m.safetensors", 4096, 0, fh)) == 100
    full = layer(folder, "enospc")
    with pytest.raises(mfusepy.FuseOSError) as err:
        full.create("/new.safetensors", 0o644)
    assert err.value.errno == errno.ENOSPC
    wh = full.open("/m.safetensors", os.O_WRONLY)
    with pytest.raises(mfusepy.FuseOSError):
        full.write("/m.safetensors", b"x", 0, wh)
    assert full.read("/m.safetensors", 4, 0, full.open("/m.safetensors", os.O_RDONLY)) == bytes(range(4))  # reads pass


@pytest.mark.skipif(bool(capabilities.missing(["root", "fuse"])), reason="needs root and fuse")
def test_a_real_mount_faults_reads_and_writes_and_heal_and_sweep_unmount_it(tmp_path: Path) -> None:
    ctx = FakeContext(run_id="run-disk", run_dir=tmp_path)
    ctx.add_process("reader-1", role="reader")
    folder = checkpoint_folder(tmp_path, "reader-1")
    folder.mkdir(parents=True)
    (folder / "m.safetensors").write_bytes(b"\0" * 8192)
    fault = make_fault(DiskSpec(kind="disk", target="reader-1", mode="eio"), "bad")
    injected = fault.inject(ctx)
    try:
        assert str(folder) in mounts_named(fsname("run-disk", "bad"))
        with pytest.raises(OSError) as err:
            (folder / "m.safetensors").read_bytes()
        assert err.value.errno == errno.EIO
    finally:
        healed = fault.heal(ctx, injected.token)
    assert healed is not None and healed["unmounted"] and healed["faulted"] >= 1
    assert healed["witness"]["effect"] == "seen" and healed["witness"]["figures"]["by_call"]["read"] >= 1
    assert (folder / "m.safetensors").read_bytes() == b"\0" * 8192
    assert mounts_named(fsname("run-disk", "bad")) == []
    # a layer killed outright leaves a dead mount: sweep detaches it by the run's name
    full = make_fault(DiskSpec(kind="disk", target="reader-1", mode="enospc", match=("*",)), "full")
    token = full.inject(ctx).token
    with pytest.raises(OSError) as err:
        (folder / "new.bin").write_bytes(b"x")
    assert err.value.errno == errno.ENOSPC
    os.kill(token.pid, 9)
    assert Disk.sweep("run-disk") == [f"FUSE mount {folder}"]
    assert mounts_named(fsname("run-disk", "full")) == []
    full.heal(ctx, token)  # idempotent: nothing left to undo


def test_a_faulted_readers_checkpoint_is_a_copy_never_a_link_to_the_cache(tmp_path: Path) -> None:
    """Issue 36 item 7: the faulted folder hard-linked the shared cache's file, so anything written
    through it (any user, through the FUSE layer) rewrote the checkpoint every later run reads."""
    from harness.judge.content import reader_checkpoint
    from harness.record.timeline import Timeline

    cache = tmp_path / "cache"
    cache.mkdir()
    prepared = cache / "m.safetensors"
    prepared.write_bytes(b"weights" * 100)
    sc = parse_scenario(scenario(mode="enospc"))
    timeline = Timeline()
    mine = reader_checkpoint(sc, "reader-1", prepared, tmp_path / "run", timeline)
    assert mine is not None and mine.parent == checkpoint_folder(tmp_path / "run", "reader-1")
    assert os.stat(mine).st_ino != os.stat(prepared).st_ino and os.stat(prepared).st_nlink == 1
    mine.write_bytes(b"rewritten")  # what a write through the faulted folder does
    assert prepared.read_bytes() == b"weights" * 100
    assert [e.value["how"] for e in timeline.entries() if e.f == "checkpoint_folder"] == ["copy"]


@pytest.mark.parametrize("case", ["world-writable", "another user's", "a symlink"])
def test_a_checkpoint_cache_someone_else_could_write_is_refused(case: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache every run's readers fall back to is checked as the state directory is."""
    from harness.engine.checkpoint import checkpoint_cache
    from harness.machine.statedir import StateDirError

    cache = tmp_path / "cache"
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(cache))
    assert checkpoint_cache() == cache / "checkpoints"  # made, ours
    assert os.stat(cache / "checkpoints").st_mode & 0o777 == 0o700
    folder = cache / "checkpoints"
    if case == "world-writable":
        folder.chmod(0o777)
        rule = "writable by group or others (mode 0777)"
    elif case == "another user's":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the folder away")
        os.chown(folder, 65534, 65534)
        rule = "owned by uid 65534"
    else:
        folder.rmdir()
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
        rule = "it is a symbolic link"
    with pytest.raises(StateDirError) as err:
        checkpoint_cache()
    text = str(err.value)
    assert text.startswith(f"checkpoint cache: refusing {folder} ($MXCHAOS_CACHE_DIR is ") and rule in text, text


def test_the_layers_own_lines_are_its_witness(tmp_path: Path) -> None:
    log = tmp_path / "d.faultfs.log"
    log.write_text("faultfs ready\nfaultfs faulted short 1 read /m.safetensors\n"
                   "faultfs faulted short 2 read /m.safetensors\nfaultfs faulted short 3\n"
                   "faultfs unmounted faulted=3\n")
    assert layer_counts(log.read_text()) == {"read": 3}  # a line without its call (an older layer) is a read
    seen = layer_witness(str(log), "short", "/x")
    assert seen.effect == "seen" and seen.figures["faulted"] == 3 and "3 short reads" in seen.why
    log.write_text("faultfs ready\nfaultfs unmounted faulted=0\n")
    assert layer_witness(str(log), "eio", "/x").effect == "none"
    assert layer_witness(str(tmp_path / "gone.log"), "eio", "/x").effect == "unwitnessed"


def test_the_layer_prints_one_line_per_faulted_call(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fs = layer(folder, "slow", delay=0.001)
    fs.read("/m.safetensors", 16, 0, fs.open("/m.safetensors", os.O_RDONLY))
    fs.read("/notes.txt", 16, 0, fs.open("/notes.txt", os.O_RDONLY))  # not matched: not faulted, not counted
    assert layer_counts(capsys.readouterr().out) == {"read": 1}
