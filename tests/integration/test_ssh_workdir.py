"""Remote work dirs on a real ssh host (a one-host lab, ``harness.hosts.lab``), as a hostile local user of
that host would meet them (issue 36 item 1):

- a module planted in the folder a process runs in is never imported (the programs a scenario
  starts run with ``PYTHONSAFEPATH``, our own helpers with ``-I``): the planted ``mxref`` was
  imported as root on the old code;
- a work dir someone else could have made or can write (world-writable, another user's, reached
  through a symlink, or in a folder others can write such as a shared temp dir) is refused when the
  host opens, naming the host and the path; nothing is made in it;
- the host's process scan counts a run id only on a process of the login's own user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.lab_hosts import lab_inventory

from harness.errors import HostError
from harness.hosts.inventory import DEFAULT_WORK_DIR, Inventory, Machine
from harness.hosts.ssh import SshHost

pytestmark = [
    pytest.mark.integration,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "ssh", "ssh-keygen")) or not Path("/usr/sbin/sshd").exists(),
                       reason="needs iproute2, openssh-client and openssh-server"),
]

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inventory]:
    yield from lab_inventory(tmp_path_factory.mktemp("wlab"), 1)


def _host(machine: Machine, run_dir: Path, **update: str) -> SshHost:
    return SshHost("h1", "h1", machine.model_copy(update=update), f"wd-{os.getpid()}-{len(update)}", run_dir)


def test_a_module_planted_where_a_process_runs_is_not_imported(inventory: Inventory, tmp_path: Path) -> None:
    """The attack of issue 36: the run folder is a remote process's working folder; a package named
    ``mxref`` put there was imported (``python -m mxref`` / ``-c``: the working folder is
    ``sys.path[0]``). Now the checkout's ``mxref`` is imported and the planted one never runs."""
    machine = inventory.machines["h1"]
    host = _host(machine, tmp_path / "run")
    host.open()
    try:
        planted = Path(host.remote_dir) / "mxref"
        planted.mkdir()
        (planted / "__init__.py").write_text(f"open({str(planted / 'RAN')!r}, 'w').write('planted')\n")
        done = host.exec([sys.executable, "-c", "import mxref; print(mxref.__file__)"],
                         env={}, cwd=tmp_path / "run", timeout=60)
        assert done.rc == 0, done.stderr
        assert done.stdout.strip() == str(REPO / "mxref" / "__init__.py"), done.stdout
        assert not (planted / "RAN").exists(), "the planted module ran"
        assert host.remote_dir.startswith(machine.work_dir) and os.stat(host.remote_dir).st_mode & 0o777 == 0o700
    finally:
        host.close()
    assert not Path(host.remote_dir).exists()


@pytest.mark.parametrize("case", ["world-writable", "another user's", "a symlink on the way", "a shared temp dir"])
def test_a_work_dir_someone_else_could_have_made_is_refused_naming_host_and_path(case: str, inventory: Inventory,
                                                                                tmp_path: Path) -> None:
    machine = inventory.machines["h1"]
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    work = base / "work"
    expected = ""
    if case == "world-writable":
        work.mkdir()
        work.chmod(0o777)
        expected = f"{work}: writable by group or others (mode 0777)"
    elif case == "another user's":
        work.mkdir(mode=0o700)
        os.chown(work, NOBODY, NOBODY)
        expected = f"{work}: owned by uid {NOBODY}, not by the login user (uid 0)"
    elif case == "a symlink on the way":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        base.rmdir()
        base.symlink_to(tmp_path / "elsewhere")
        expected = f"{base}: a symbolic link"
    else:
        base.chmod(0o1777)  # as /tmp: anyone may make the work dir there first
        expected = f"{base}: the work dir's parent is writable by others (mode 1777)"
    made = work.exists()
    host = _host(machine, tmp_path / "run", work_dir=str(work))
    try:
        with pytest.raises(HostError) as err:
            host.open()
    finally:
        host.close_master()
    text = str(err.value)
    assert "ssh host h1 (h1, root@" in text and f"refusing work dir {work}" in text and expected in text, text
    assert (list(work.iterdir()) == []) if made else not work.exists()  # nothing made in it, nor it


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_on_an_ssh_host_another_users_process_carrying_a_run_id_is_not_the_runs(inventory: Inventory,
                                                                               tmp_path: Path) -> None:
    """The host's process scan (what ``cleanup --inventory`` kills by) counts a run id only on a
    process of the login's own user (issue 36 item 2, on ssh hosts): on the parent commit a
    ``nobody`` process carrying the id was listed as the run's (and would have been killed)."""
    rid = f"forged-{os.getpid()}"
    env = {"PATH": os.environ["PATH"], "MXCHAOS_RUN_ID": rid, "MXCHAOS_PROC": "server"}
    forger = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sleep", "60"], env=env)
    mine = subprocess.Popen(["sleep", "60"], env=env)
    host = _host(inventory.machines["h1"], tmp_path / "run")
    try:
        found = {p.pid for p in host.run_processes(rid)}
        assert forger.pid not in found, "another user's process was taken for the run's"
        assert mine.pid in found  # the same scan still finds one of ours (the lab shares this machine's /proc)
    finally:
        host.shell.close()
        host.close_master()
        for proc in (forger, mine):
            proc.kill()
            proc.wait(10)


def test_the_default_work_dir_is_made_under_the_logins_home(inventory: Inventory, tmp_path: Path) -> None:
    """No work_dir in the inventory: ``~/.cache/mxchaos/work`` of the login (root here, whose home
    this machine shares with the lab host), made 0700; the run folder in it goes at close."""
    home_work = Path(pwd.getpwuid(0).pw_dir) / ".cache" / "mxchaos" / "work"
    made = not home_work.exists()
    machine = inventory.machines["h1"].model_copy(update={"work_dir": DEFAULT_WORK_DIR})
    host = SshHost("h1", "h1", machine, f"wd-default-{os.getpid()}", tmp_path / "run")
    try:
        host.open()
        assert host.remote_dir == f"{home_work}/wd-default-{os.getpid()}"
        assert os.stat(home_work).st_mode & 0o777 == 0o700 and os.stat(host.remote_dir).st_mode & 0o777 == 0o700
    finally:
        host.close()
        if made:
            home_work.rmdir()  # nothing of this test left behind
    assert not Path(host.remote_dir).exists()
