"""The harness's state directory is its own (``harness.machine.statedir``): a state directory someone else
made, one others can write, or a symlink is refused by everything that uses it (the ledger, port
reservations, the lab); files in it are never followed through a symlink; ``mxchaos cleanup``
writes its CRASHED note only into the run folder a run made."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.commands import cleanup
from harness.hosts import lab
from harness.machine import ledger, ports, statedir
from harness.machine.statedir import StateDirError

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(folder))
    return folder


def _refused_by_every_user(path: Path, rule: str) -> None:
    """The ledger (write and read), port reservations and the lab all refuse, naming path and rule."""
    for use in (lambda: ledger.write_entry("r-20260101T000000-abcdef", {"run_id": "x"}), ledger.entries,
                ports.lease_port, lambda: lab.status(), lambda: lab.down()):
        with pytest.raises(StateDirError, match=rule) as info:
            use()
        assert str(path) in str(info.value)


@as_root
def test_a_state_dir_owned_by_another_user_is_refused(state: Path) -> None:
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    _refused_by_every_user(state, f"owned by uid {NOBODY}, not by us")
    assert list(state.iterdir()) == []  # nothing was written there


@as_root
def test_the_default_state_dir_made_by_another_user_first_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MXCHAOS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    squatted = tmp_path / f"mxchaos-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chmod(squatted, 0o777)
    os.chown(squatted, NOBODY, NOBODY)
    _refused_by_every_user(squatted, "owned by uid")


def test_a_world_writable_state_dir_is_refused(state: Path) -> None:
    state.mkdir()
    os.chmod(state, 0o777)
    _refused_by_every_user(state, "writable by group or others")
    assert list(state.iterdir()) == []


def test_a_symlinked_state_dir_is_refused(state: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    state.symlink_to(real)
    _refused_by_every_user(state, "symbolic link")
    assert list(real.iterdir()) == []


def test_a_symlink_or_a_writable_folder_on_the_way_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "link" / "state"))
    with pytest.raises(StateDirError, match="symbolic link"):
        ledger.write_entry("r-1-2", {})
    assert not (tmp_path / "real" / "state").exists()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could rename our folder away and put theirs in its place
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(shared / "state"))
    with pytest.raises(StateDirError, match=r"writable by others .* and not sticky"):
        ledger.write_entry("r-1-2", {})


@as_root
def test_a_sticky_root_folder_on_the_way_is_fine_and_the_state_dir_is_made_0700(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # as /tmp
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(sticky / "state"))
    ledger.write_entry("r-20260101T000000-abcdef", {"run_id": "r"})
    assert ledger.read_entry("r-20260101T000000-abcdef") == {"run_id": "r"}
    for folder in (sticky / "state", sticky / "state" / "runs"):
        assert (os.stat(folder).st_mode & 0o777, os.stat(folder).st_uid) == (0o700, os.geteuid())
    assert os.stat(sticky / "state" / "runs" / "r-20260101T000000-abcdef.json").st_mode & 0o777 == 0o600


def test_an_existing_state_dir_of_ours_readable_by_others_is_tightened(state: Path) -> None:
    state.mkdir()
    os.chmod(state, 0o755)
    with ports.lease_port():
        pass
    assert os.stat(state).st_mode & 0o777 == 0o700


def test_ledger_entries_that_are_symlinks_or_not_ours_are_no_entries(state: Path, tmp_path: Path) -> None:
    ledger.write_entry("mine-20260101T000000-aaaaaa", {"run_id": "mine"})
    elsewhere = tmp_path / "forged.json"
    elsewhere.write_text(json.dumps({"run_id": "forged", "run_dir": "/etc"}))
    (state / "runs" / "forged-20260101T000000-bbbbbb.json").symlink_to(elsewhere)
    assert set(ledger.entries()) == {"mine-20260101T000000-aaaaaa"}
    assert ledger.read_entry("forged-20260101T000000-bbbbbb") is None


def test_a_ledger_entry_is_never_written_through_a_planted_symlink(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    rid = "r-20260101T000000-cccccc"
    (state / "runs").mkdir(parents=True)
    for name in (f"{rid}.json", f".{rid}.json.{os.getpid()}"):  # the entry, and the temporary name it used to go by
        (state / "runs" / name).symlink_to(victim)
    ledger.write_entry(rid, {"run_id": "r"})
    assert victim.read_text() == "precious\n"
    assert ledger.read_entry(rid) == {"run_id": "r"}


def test_a_lock_file_that_is_a_symlink_is_refused_not_followed(state: Path, tmp_path: Path) -> None:
    folder = statedir.subdir("ports")
    assert folder is not None
    target = tmp_path / "made-through-the-link"
    (folder / "4242.lock").symlink_to(target)
    with pytest.raises(StateDirError, match="symbolic link"):
        ports.try_lock(folder / "4242.lock")
    assert not target.exists()


def test_write_new_never_writes_through_an_existing_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "link").symlink_to(victim)
    for name in ("link", "victim"):
        with pytest.raises(FileExistsError):
            statedir.write_new(tmp_path / name, b"x")
    assert victim.read_text() == "precious\n"


def _crashed_run(run_dir: Path, run_id: str, identity: object) -> None:
    info = {"run_id": run_id, "run_dir": str(run_dir), "harness_pid": 2**22 + 11, "harness_start": 1}
    if identity is not None:
        info["run_dir_id"] = identity
    ledger.write_entry(run_id, info)


def test_cleanup_writes_crashed_only_into_the_run_folder_the_run_made(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"  # what an entry naming a folder that is not the run's must not touch
    victim.mkdir()
    made = tmp_path / "made"
    made.mkdir()
    identity = statedir.dir_identity(made)
    swapped = tmp_path / "swapped"  # the run's folder, replaced by a symlink after the run recorded it
    swapped.mkdir()
    swapped_identity = statedir.dir_identity(swapped)
    swapped.rmdir()
    swapped.symlink_to(victim)
    _crashed_run(victim, "unrecorded-20260101T000000-000001", None)  # an entry with no identity
    _crashed_run(victim, "other-20260101T000000-000002", identity)  # another folder's identity
    _crashed_run(swapped, "swapped-20260101T000000-000003", swapped_identity)
    _crashed_run(made, "made-20260101T000000-000004", identity)
    for rid in ("unrecorded-20260101T000000-000001", "other-20260101T000000-000002", "swapped-20260101T000000-000003",
                "made-20260101T000000-000004"):
        cleanup.sweep(run_id=rid, wait=0.5)
        assert ledger.read_entry(rid) is None
    assert list(victim.iterdir()) == []
    assert (made / "CRASHED").read_text().startswith("the harness of this run died")


@as_root
def test_cleanup_does_not_write_into_a_folder_of_another_user(state: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    identity = statedir.dir_identity(theirs)
    os.chown(theirs, NOBODY, NOBODY)
    _crashed_run(theirs, "theirs-20260101T000000-000005", identity)
    cleanup.sweep(run_id="theirs-20260101T000000-000005", wait=0.5)
    assert list(theirs.iterdir()) == []


def test_an_ssh_control_folder_someone_else_made_is_refused_and_never_swept_through(tmp_path: Path) -> None:
    from harness.hosts import ssh
    from harness.hosts.inventory import parse_inventory

    machine = parse_inventory("machines:\n  h1: {address: 10.0.0.1}\n").machines["h1"]
    run_id = f"ctl-20260101T000000-{os.getpid():06x}"[-27:]
    host = ssh.SshHost("a", "h1", machine, run_id, tmp_path / "run")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    folder = ssh.control_dir(run_id, "a")
    folder.symlink_to(victim)  # planted where the run's control socket will go
    try:
        with pytest.raises(StateDirError, match="symbolic link"):
            host.ssh_argv()
        ssh.sweep_local(run_id)  # `mxchaos cleanup` after the run "crashed"
        assert (victim / "precious").exists()
    finally:
        folder.unlink()
