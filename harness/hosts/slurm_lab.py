"""``mxchaos lab up --slurm``: a real SLURM cluster on the lab's hosts (munge, slurmctld, a slurmd per host).

Everything lives under the lab's state dir (``<lab>/slurm/``, root's, 0700): its own munge key,
``slurm.conf``, the controller's state, log and pid file, and per node its spool, log and pid
file. Nothing in ``/etc`` is read or changed. The one thing outside it is munge's socket folder,
``/run/mxchaos-munge-<tok>`` (0755: munged refuses a socket in a folder not everyone may
enter; the lab's state dir is 0700).

- **munged** runs as root with the lab's key (``--key-file``, ``--socket``, ``--pid-file``,
  ``--log-file``, ``--seed-file`` all the lab's); SLURM says ``AuthType=auth/munge`` and
  ``AuthInfo=socket=<it>,cred_expire=10``.
- **slurmctld** runs in the root namespace (``SlurmUser=root``), reached by the nodes at the
  management bridge's address, on a free port; ``ProctrackType=proctrack/linuxproc``,
  ``TaskPlugin=task/none`` (the namespaces share this machine's cgroups), ``JobCompType=jobcomp/filetxt``
  (no accounting database), ``MinJobAge=3600`` (finished jobs stay in ``squeue -t all``),
  ``SlurmdTimeout=10``, ``ReturnToService=2``, ``SchedulerParameters=bf_interval=1``.
- **a slurmd per lab host**, named after it (``h1`` ...), in the host's network namespace, a UTS
  namespace of its own (its hostname the node's) and a mount namespace of its own:
  ``nsenter --net=/run/netns/<ns> unshare --uts --mount`` (``ip netns exec`` would hide the cgroup
  mount slurmd needs), where the network part of ``/sys`` is the namespace's (``_NODE_SYS``), so a
  job's processes see the node's interfaces as UCX looks for them. ``NodeAddr`` is the host's
  management address, where its sshd listens too: a job's nodes are ssh hosts of the lab.
  The node's CPUs are what ``slurmd -C`` says here (a node that claims more is drained).

Each daemon's pid and start time go into ``lab.json`` (``slurm.daemons``) as it starts; ``stop``
kills those (pid and start time both matching), and, for a lab whose record is lost, the pids its
own pid files name when that process is root's and runs the daemon's binary. ``leftovers`` says
what still runs or exists. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.hosts import slurm
from harness.machine import ports, procscan, runscope, statedir

__all__ = ["TOOLS", "leftovers", "missing", "munge_dir", "restart_node", "sinfo", "start", "stop"]

TOOLS = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "srun", "salloc", "sbatch", "squeue", "scancel", "nsenter",
         "unshare")
PACKAGES = "slurmctld slurmd slurm-client munge"
READY_S = 30.0
CMD_TIMEOUT_S = 20.0
PARTITION = "lab"
_HW_KEYS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")


def missing() -> list[str]:
    """The tools a SLURM lab needs that this machine lacks (empty: it can have one)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]


def _exe(tool: str) -> str:
    found = shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None)
    if found is None:
        raise HarnessError(f"lab --slurm: no `{tool}` (install {PACKAGES}: apt-get install -y {PACKAGES})")
    return found


def munge_dir(tok: str) -> Path:
    """munge's socket folder for the lab of token ``tok``."""
    return Path(f"/run/mxchaos-munge-{tok}")


def _public_dir(path: Path) -> None:
    """``path`` made 0755 (root's, no symlink; ``/run`` is root's alone), or refused."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise statedir.StateDirError(f"lab --slurm: refusing {path}: owned by uid {st.st_uid}, not by us")
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = CMD_TIMEOUT_S,
         log: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A daemon's start command (it forks and returns): its output to ``log`` (a daemon keeps no
    pipe of ours open), bounded."""
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=timeout, check=False,
                              env={**os.environ, **(env or {})}, text=True)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"lab --slurm: `{' '.join(argv)}` did not return within {timeout:g}s") from None
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-400:].strip() if log is not None and log.exists() else ""
        raise HarnessError(f"lab --slurm: `{' '.join(argv)}` failed (rc {done.returncode}) {tail}")
    return done


# In the slurmd's own mount namespace, the network part of /sys shows its network namespace's
# interfaces (a sysfs mounted from inside it, its class/net and devices/virtual/net bound over
# this machine's), the rest of /sys, cgroups included, stays this machine's. Without it a job's
# processes on the node see this machine's /sys/class/net, and UCX, which keeps a TCP device only
# when it finds it there, offers nothing but loopback (docs/slurm-dispatch.md).
_NODE_SYS = ('d="$4/sysfs" && mkdir -p "$d" && mount -t sysfs sysfs "$d" && mount --bind "$d/class/net" /sys/class/net '
             '&& mount --bind "$d/devices/virtual/net" /sys/devices/virtual/net && umount -l "$d" && rmdir "$d"')


def _hardware() -> str:
    """``CPUs=... CoresPerSocket=...`` as ``slurmd -C`` reports this machine (every node is it)."""
    done = subprocess.run([_exe("slurmd"), "-C"], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    record = slurm.parse_record(done.stdout.splitlines()[0] if done.stdout.strip() else "")
    words = [f"{key}={record[key]}" for key in _HW_KEYS if re.fullmatch(r"\d{1,6}", record.get(key, ""))]
    if not words:
        raise HarnessError(f"lab --slurm: `slurmd -C` said nothing usable: {(done.stdout + done.stderr).strip()[:300]}")
    return " ".join(words)


def _conf(folder: Path, sock: Path, ctld_addr: str, ctld_port: int, slurmd_port: int, hosts: dict[str, Any]) -> str:
    hw = _hardware()
    lines = [
        "# written by `mxchaos lab up --slurm`; `mxchaos lab down` stops every daemon and removes it",
        "ClusterName=mxchaoslab",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({ctld_addr})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock},cred_expire=10",
        f"StateSaveLocation={folder / 'ctld' / 'state'}",
        f"SlurmctldPidFile={folder / 'ctld' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={folder / 'ctld' / 'slurmctld.log'}",
        f"SlurmdSpoolDir={folder / 'nodes' / '%n' / 'spool'}",
        f"SlurmdPidFile={folder / 'nodes' / '%n' / 'slurmd.pid'}",
        f"SlurmdLogFile={folder / 'nodes' / '%n' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder / 'ctld' / 'jobcomp.txt'}",
        "MpiDefault=none",
        "MinJobAge=3600",
        "SlurmdTimeout=10",
        "MessageTimeout=5",
        "SchedulerParameters=bf_interval=1",
        "ReturnToService=2",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
    ]
    lines += [f"NodeName={name} NodeAddr={h['mgmt_address']} {hw} State=UNKNOWN" for name, h in hosts.items()]
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(hosts)} Default=YES MaxTime=INFINITE State=UP LLN=YES")
    return "\n".join(lines) + "\n"


def _read_pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _record(info: dict[str, Any], key: str, pid_file: Path, save: Callable[[], None], ready: Callable[[], bool]) -> None:
    """Wait (bounded) for a daemon's pid file and for ``ready``; record its pid and start time."""
    deadline = time.monotonic() + READY_S
    recorded = False
    while True:
        pid = _read_pid(pid_file)
        if pid is not None and not recorded and procscan.proc_start_time(pid) is not None:
            info["slurm"]["daemons"][key] = {"pid": pid, "start": procscan.proc_start_time(pid)}
            save()
            recorded = True
        if recorded and ready():
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"lab --slurm: {key} was not ready within {READY_S:g}s (pid file {pid_file})")
        time.sleep(0.1)


def start(state: Path, info: dict[str, Any], save: Callable[[], None]) -> None:
    """munged, slurmctld and a slurmd per host of ``info`` (the lab being built), recorded in
    ``info['slurm']`` (``save`` writes it) as each starts; HarnessError when one does not come up
    (the caller takes the lab down)."""
    lacking = missing()
    if lacking:
        raise HarnessError(f"lab --slurm: this machine lacks {', '.join(lacking)} (apt-get install -y {PACKAGES})")
    folder = state / "slurm"
    for sub in (folder, folder / "munge", folder / "ctld", folder / "ctld" / "state", folder / "nodes"):
        statedir.ensure_dir(sub)
    sock_dir = munge_dir(info["token"])
    conf = folder / "slurm.conf"
    info["slurm"] = {"conf": str(conf), "env_file": str(folder / "slurm.env"), "munge_socket": str(sock_dir / "munge.sock"),
                     "daemons": {}}
    save()
    _public_dir(sock_dir)
    sock = sock_dir / "munge.sock"
    statedir.write_new(folder / "munge" / "munge.key", secrets.token_bytes(1024), 0o400)
    _run([_exe("munged"), f"--socket={sock}", f"--key-file={folder / 'munge' / 'munge.key'}",
          f"--pid-file={folder / 'munge' / 'munged.pid'}", f"--log-file={folder / 'munge' / 'munged.log'}",
          f"--seed-file={folder / 'munge' / 'munged.seed'}"], log=folder / "munge" / "start.log")
    _record(info, "munged", folder / "munge" / "munged.pid", save, sock.exists)
    ctld_addr = str(next(ipaddress.ip_network(info["mgmt_subnet"]).hosts()))  # the management bridge's
    with ports.lease_port("0.0.0.0") as ctld_port, ports.lease_port("0.0.0.0") as slurmd_port:
        text = _conf(folder, sock, ctld_addr, ctld_port.port, slurmd_port.port, info["hosts"])
        statedir.write_new(conf, text.encode(), 0o600)
        statedir.write_new(folder / "slurm.env", f"export SLURM_CONF={conf}\n".encode(), 0o600)
        info["slurm"]["controller"] = f"{ctld_addr}:{ctld_port.port}"
        env = {"SLURM_CONF": str(conf)}
        ctld_port.release()
        _run([_exe("slurmctld"), "-f", str(conf)], env=env, log=folder / "ctld" / "start.log")
        _record(info, "slurmctld", folder / "ctld" / "slurmctld.pid", save, lambda: _pings(conf))
        slurmd_port.release()
        for name in info["hosts"]:
            _start_slurmd(state, info, name, save)
    _await_idle(conf, list(info["hosts"]))


def _start_slurmd(state: Path, info: dict[str, Any], name: str, save: Callable[[], None]) -> None:
    """Node ``name``'s slurmd, in its host's network namespace and a UTS namespace of its own; recorded."""
    slurm.valid_node(name)
    folder, conf = state / "slurm", Path(info["slurm"]["conf"])
    node = folder / "nodes" / name
    statedir.ensure_dir(node)
    statedir.ensure_dir(node / "spool")
    with contextlib.suppress(OSError):
        (node / "slurmd.pid").unlink()  # a killed slurmd's: the new one writes its own
    _run(["setsid", _exe("nsenter"), f"--net=/run/netns/{info['hosts'][name]['netns']}", _exe("unshare"), "--uts",
          "--mount", "--propagation", "private", "sh", "-c", _NODE_SYS + ' && hostname "$1" && exec "$2" -f "$3" -N "$1"',
          "sh", name, _exe("slurmd"), str(conf), str(node)],
         env={"SLURM_CONF": str(conf)}, log=node / "start.log")
    _record(info, f"slurmd {name}", node / "slurmd.pid", save, lambda: True)


def restart_node(state: Path, info: dict[str, Any], name: str, save: Callable[[], None]) -> None:
    """Start node ``name``'s slurmd again (a test killed it) and wait (bounded) until SLURM has it idle
    (``ReturnToService=2``: a node that registers again returns to service)."""
    if name not in info.get("hosts", {}):
        raise HarnessError(f"lab --slurm: no node {name!r} in this lab ({', '.join(info.get('hosts', {}))})")
    _start_slurmd(state, info, name, save)
    _await_idle(Path(info["slurm"]["conf"]), [name])


def _pings(conf: Path) -> bool:
    try:
        slurm.ping(conf)
    except HarnessError:
        return False
    return True


def _await_idle(conf: Path, names: list[str]) -> None:
    deadline = time.monotonic() + READY_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = _node_states(conf)
        if states and all(states.get(n, "").rstrip("*") == "idle" for n in names):
            return
        time.sleep(0.2)
    raise HarnessError(f"lab --slurm: the nodes were not idle within {READY_S:g}s: {states or 'sinfo said nothing'}")


def _node_states(conf: Path) -> dict[str, str]:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([_exe("sinfo"), "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=10,
                              check=False, env={**os.environ, "SLURM_CONF": str(conf)}, stdin=subprocess.DEVNULL)
        return dict(line.split(None, 1) for line in done.stdout.splitlines() if len(line.split()) == 2)
    return {}


def sinfo(info: dict[str, Any]) -> str:
    """``sinfo``'s table for the lab (or why there is none)."""
    record = info.get("slurm")
    if not isinstance(record, dict):
        return "no SLURM in this lab (lab up --slurm)"
    try:
        done = subprocess.run([_exe("sinfo")], capture_output=True, text=True, timeout=10, check=False,
                              env={**os.environ, "SLURM_CONF": str(record.get("conf"))}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, HarnessError) as exc:
        return f"sinfo: {exc}"
    return (done.stdout + done.stderr).rstrip()


def _daemon_binary(key: str) -> str:
    return key.split()[0]


def _ours(pid: int, key: str) -> bool:
    """``pid`` is root's (ours) and runs the daemon's binary (a pid file of a lost record)."""
    try:
        st = os.stat(f"/proc/{pid}")
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    try:
        binary = os.path.realpath(_exe(_daemon_binary(key)))  # /usr/sbin/slurmctld is slurmctld-wlm on Debian
    except HarnessError:
        return False
    return st.st_uid == os.geteuid() and exe == binary


def _live_daemons(state: Path, info: dict[str, Any] | None) -> dict[str, int]:
    """Daemon -> pid, of those the record names (pid and start time matching) or, without one,
    those the lab's pid files name that are ours and run the daemon's binary."""
    found: dict[str, int] = {}
    record = (info or {}).get("slurm")
    daemons = record.get("daemons") if isinstance(record, dict) else None
    for key, entry in (daemons or {}).items() if isinstance(daemons, dict) else ():
        pid, start = (entry.get("pid"), entry.get("start")) if isinstance(entry, dict) else (None, None)
        if isinstance(pid, int) and isinstance(start, int) and procscan.proc_start_time(pid) == start and _alive(pid):
            found[key] = pid
    folder = state / "slurm"
    pid_files = {"munged": folder / "munge" / "munged.pid", "slurmctld": folder / "ctld" / "slurmctld.pid"}
    with contextlib.suppress(OSError):
        for node in (folder / "nodes").iterdir():
            pid_files[f"slurmd {node.name}"] = node / "slurmd.pid"
    for key, path in pid_files.items():
        pid = _read_pid(path)
        if key not in found and pid is not None and _alive(pid) and _ours(pid, key):
            found[key] = pid
    return found


def _children(parents: set[int]) -> list[int]:
    """The live children of ``parents`` (read once from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = runscope.proc_stat(int(entry.name))
            if st is not None and st.ppid in parents and st.state != "Z":
                found.append(st.pid)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop(state: Path, tok: str, info: dict[str, Any] | None) -> list[str]:
    """SIGKILL every daemon of the lab's SLURM (see the module), then remove munge's socket folder;
    returns what went."""
    removed = []
    live = _live_daemons(state, info)
    children = _children(set(live.values()))  # slurmctld's slurmscriptd, a slurmd's slurmstepd
    for key, pid in sorted(live.items(), key=lambda kv: kv[0] != "slurmctld"):  # the controller first: no rescheduling
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            removed.append(f"{key} pid {pid}")
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            removed.append(f"pid {pid} (a daemon's child)")
    live = {**live, **{f"child {pid}": pid for pid in children}}
    deadline = time.monotonic() + 5.0
    while any(_alive(pid) for pid in live.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    folder = munge_dir(tok)
    if os.path.lexists(folder):
        st = os.lstat(folder)
        if st.st_uid == os.geteuid():
            if Path(folder).is_symlink():
                folder.unlink()
            else:
                shutil.rmtree(folder)
            removed.append(f"dir {folder}")
    return removed


def leftovers(state: Path, tok: str, info: dict[str, Any] | None) -> list[str]:
    """What of the lab's SLURM still runs or exists (daemons, munge's socket folder)."""
    found = [f"{key} pid {pid}" for key, pid in sorted(_live_daemons(state, info).items())]
    if os.path.lexists(munge_dir(tok)):
        found.append(f"dir {munge_dir(tok)}")
    return found
