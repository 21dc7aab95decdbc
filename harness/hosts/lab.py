"""``mxchaos lab up --hosts N`` / ``mxchaos lab down``: N ssh hosts on this machine (root needed).

Each lab host is a network namespace running a real OpenSSH ``sshd``, with two interfaces, as on
a real cluster::

    root namespace                                  namespace mxl<tok>-hI
    bridge mxlm<tok> 10.214.M.1/24 ── veth lm<tok>-I ══ mgmt0 10.214.M.(10+I)   sshd listens here
    bridge mxld<tok> 10.214.D.1/24 ── veth ld<tok>-I ══ cable0 ── data0 (macvlan) 10.214.D.(10+I)
                                                                     NIXL / gRPC traffic

Network faults act on ``cable0`` (the inventory's ``data.device``), never on ``mgmt0``, so a
partition never cuts the ssh control connection. The data address sits on a macvlan over
``cable0``: ``link_down`` (``cable0`` down) is a pulled cable, as with netns hosts: ``data0``
loses its carrier but keeps its address and routes (an admin-down ``data0`` would drop its
routes, so sends fail at once instead of going nowhere), and ``rate`` shapes what leaves by it. ``tok`` is 8 hex digits of the lab's state dir (one lab per state dir:
``$MXCHAOS_STATE_DIR/lab``, default ``/tmp/mxchaos-<uid>/lab``); ``M``/``D`` are a pair of /24s of
``10.214.0.0/16`` no root-namespace interface or route uses. The state dir holds the client key
(``id_ed25519``), ``known_hosts`` (every host key, so ssh checks strictly), and per host its
generated host key, ``sshd_config``, pid file, log and remote work dir; ``lab.json`` records it all
(``status: building`` until the lab is up), sshd's pid and start time included. The state dir is
checked as the harness's state is (``harness.machine.statedir``: ours, 0700, no symlink on the way; a
folder that is not is refused, by ``up`` and ``down`` alike). sshd runs with ``StrictModes``: the
key it accepts is in ``/run/mxchaos/lab-keys/<tok>/authorized_keys`` (root's, 0600, in folders no
one else can write: sshd refuses one under a world-writable folder such as ``/tmp``).

``down()`` kills every process inside the lab's namespaces (sshd and anything a run left) and the
sshd processes ``lab.json`` recorded (pid and start time both matching), deletes the namespaces,
then the veths and bridges (found by name and by their link alias ``mxchaos-lab <state dir>``, so a
lost ``lab.json`` still goes), then the state dir with its keys (never through a symlink). ``abandoned()`` is what ``mxchaos cleanup`` removes: a lab whose ``lab up`` died while
building it. Every command is bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import HarnessError
from harness.hosts import netns, slurm_lab
from harness.machine import procscan, statedir

__all__ = ["LAB_POOL", "LabHost", "abandoned", "add_parser", "down", "lab_dir", "leftovers", "restart_slurmd", "status", "up"]

LAB_POOL = ipaddress.IPv4Network("10.214.0.0/16")
ALIAS_PREFIX = "mxchaos-lab "
MGMT_LINK, DATA_LINK, CABLE_LINK = "mgmt0", "data0", "cable0"
SSH_PORT = 22
FIRST_HOST = 10
MAX_HOSTS = 32
CMD_TIMEOUT_S = 20.0
SSHD_READY_S = 10.0
KEYS_ROOT = Path("/run/mxchaos/lab-keys")  # authorized_keys, where sshd's StrictModes accepts it


def lab_dir() -> Path:
    """The lab's state dir (``lab/`` of the harness's state directory; not checked here)."""
    return statedir.base() / "lab"


def _checked(state: Path | None, *, create: bool = False) -> Path:
    """The lab's state dir, absolute and checked (``harness.machine.statedir``): StateDirError when it, or
    a folder on its way, is not ours or a symlink; made 0700 with ``create``."""
    path = Path(os.path.abspath(state or lab_dir()))
    statedir.ensure_dir(path.parent, create=create)
    statedir.ensure_dir(path, create=create)
    return path


def _token(state: Path) -> str:
    return hashlib.sha256(str(state).encode()).hexdigest()[:8]


def _keys_dir(state: Path) -> Path:
    return KEYS_ROOT / _token(state)


@dataclass(frozen=True)
class LabHost:
    name: str
    index: int
    netns: str
    mgmt_address: str
    data_address: str
    directory: Path

    @property
    def config(self) -> Path:
        return self.directory / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.directory / "sshd.pid"


def _run(argv: list[str], *, timeout: float = CMD_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise HarnessError(f"lab: `{argv[0]}` is not installed (the lab needs iproute2, openssh-server and openssh-client)") from None
    except subprocess.TimeoutExpired:
        raise HarnessError(f"lab: `{' '.join(argv)}` did not return within {timeout:g}s") from None
    if check and done.returncode != 0:
        raise HarnessError(f"lab: `{' '.join(argv)}` failed (rc {done.returncode}): {done.stderr.strip()}")
    return done


def _sshd() -> str:
    for candidate in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise HarnessError("lab: no sshd (install the openssh-server package)")


def _pick_subnets() -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    used = netns._root_ipv4_networks()
    free = [s for s in LAB_POOL.subnets(new_prefix=24) if not any(s.overlaps(u) for u in used)]
    for first, second in itertools.pairwise(free):
        if int(first.network_address) // 256 % 2 == 0 and int(second.network_address) - int(first.network_address) == 256:
            return first, second
    raise HarnessError(f"lab: no free pair of /24s left in {LAB_POOL}")


def _state_file(state: Path) -> Path:
    return state / "lab.json"


def status(state: Path | None = None) -> dict[str, Any] | None:
    """The recorded lab (``lab.json``, only a regular file of ours in a state dir of ours), or None
    when there is none. StateDirError when the state dir is not ours."""
    state = _checked(state)
    try:
        info = json.loads(statedir.read_owned(_state_file(state)))
    except (OSError, ValueError, statedir.StateDirError):
        return None
    return info if isinstance(info, dict) else None


def _write_state(state: Path, info: dict[str, Any]) -> None:
    statedir.replace(_state_file(state), json.dumps(info, indent=2).encode())


def restart_slurmd(node: str, state: Path | None = None) -> None:
    """Start a SLURM lab node's slurmd again (after a test killed it); recorded in ``lab.json``."""
    state = _checked(state)
    info = status(state)
    if info is None or "slurm" not in info:
        raise HarnessError(f"lab: no SLURM lab recorded in {state}")
    slurm_lab.restart_node(state, info, node, lambda: _write_state(state, info))


def up(hosts: int, *, inventory_out: Path | None = None, state: Path | None = None, slurm: bool = False) -> dict[str, Any]:
    """Build the lab (see the module docstring; ``slurm``: and a SLURM cluster on its hosts,
    ``harness.hosts.slurm_lab``); on any failure what was made goes again."""
    if not 1 <= hosts <= MAX_HOSTS:
        raise HarnessError(f"lab up --hosts: between 1 and {MAX_HOSTS} (got {hosts})")
    if os.geteuid() != 0:
        raise HarnessError("lab up needs root (it creates network namespaces and runs sshd)")
    state = _checked(state, create=True)
    if slurm and slurm_lab.missing():
        raise HarnessError(f"lab up --slurm: this machine lacks {', '.join(slurm_lab.missing())} "
                           f"(apt-get install -y {slurm_lab.PACKAGES})")
    if status(state) is not None or [x for x in leftovers(state) if not x.startswith("dir ")]:
        raise HarnessError(f"lab: one is already up (state {state}); run `mxchaos lab down` first")
    sshd = _sshd()
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise HarnessError(f"lab: no `{tool}` (install the openssh-client package)")
    tok = _token(state)
    mgmt, data = _pick_subnets()
    info: dict[str, Any] = {
        "status": "building", "builder_pid": os.getpid(), "builder_start": procscan.proc_start_time(os.getpid()),
        "state": str(state), "token": tok, "mgmt_subnet": str(mgmt), "data_subnet": str(data),
        "mgmt_bridge": f"mxlm{tok}", "data_bridge": f"mxld{tok}", "hosts": {},
    }
    _write_state(state, info)
    try:
        _build(state, info, hosts, sshd, mgmt, data)
        if slurm:
            slurm_lab.start(state, info, lambda: _write_state(state, info))
    except BaseException:
        with contextlib.suppress(Exception):
            down(state)
        raise
    info["status"] = "up"
    _write_state(state, info)
    if inventory_out is not None:
        write_inventory(info, inventory_out)
        info["inventory"] = str(inventory_out)
        _write_state(state, info)
    if slurm:
        slurm_out = state / "slurm-inventory.yaml"
        write_inventory(info, slurm_out, slurm=True)
        info["slurm"]["inventory"] = str(slurm_out)
        _write_state(state, info)
    return info


def _build(state: Path, info: dict[str, Any], count: int, sshd: str,
           mgmt: ipaddress.IPv4Network, data: ipaddress.IPv4Network) -> None:
    tok, alias = info["token"], f"{ALIAS_PREFIX}{state}"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "mxchaos-lab", "-f", str(state / "id_ed25519")])
    statedir.remove_tree(_keys_dir(state))  # one a lab of this state dir left (no lab is up: checked)
    keys = statedir.ensure_dir(_keys_dir(state))
    assert keys is not None
    statedir.write_new(keys / "authorized_keys", statedir.read_owned(state / "id_ed25519.pub"), 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir (Debian)
    for bridge, net in ((info["mgmt_bridge"], mgmt), (info["data_bridge"], data)):
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        _run(["ip", "link", "set", "dev", bridge, "alias", alias])
        _run(["ip", "addr", "add", f"{next(net.hosts())}/24", "dev", bridge])
        _run(["ip", "link", "set", "dev", bridge, "up"])
    known: list[str] = []
    for i in range(1, count + 1):
        name = f"h{i}"
        host = LabHost(name, i, f"mxl{tok}-{name}", str(mgmt.network_address + FIRST_HOST + i),
                       str(data.network_address + FIRST_HOST + i), state / "hosts" / name)
        for folder in (state / "hosts", host.directory, host.directory / "work"):
            statedir.ensure_dir(folder)
        _run(["ip", "netns", "add", host.netns])
        for prefix, inner, bridge in (("lm", MGMT_LINK, info["mgmt_bridge"]), ("ld", CABLE_LINK, info["data_bridge"])):
            veth = f"{prefix}{tok}-{i}"
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", inner, "netns", host.netns])
            _run(["ip", "link", "set", "dev", veth, "alias", alias])
            _run(["ip", "link", "set", "dev", veth, "master", bridge, "up"])
            _run(["ip", "-n", host.netns, "link", "set", "dev", inner, "up"])
        # the data address sits on a macvlan over the "cable": taking cable0 down is a pulled cable
        # (data0 loses its carrier, keeps its address and route), as the netns hosts' link_down
        _run(["ip", "-n", host.netns, "link", "add", DATA_LINK, "link", CABLE_LINK, "type", "macvlan", "mode", "bridge"])
        _run(["ip", "-n", host.netns, "addr", "add", f"{host.mgmt_address}/24", "dev", MGMT_LINK])
        _run(["ip", "-n", host.netns, "addr", "add", f"{host.data_address}/24", "dev", DATA_LINK])
        _run(["ip", "-n", host.netns, "link", "set", "dev", DATA_LINK, "up"])
        _run(["ip", "-n", host.netns, "link", "set", "dev", "lo", "up"])
        key = host.directory / "ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"mxchaos-lab-{name}", "-f", str(key)])
        statedir.write_new(host.config, _sshd_config(host, state).encode(), 0o600)
        _run([sshd, "-t", "-f", str(host.config)])
        _run(["ip", "netns", "exec", host.netns, sshd, "-f", str(host.config), "-E", str(host.directory / "sshd.log")])
        pid = _await_sshd(host)
        start = procscan.proc_start_time(pid)
        public = (host.directory / "ssh_host_ed25519_key.pub").read_text().split()
        known.append(f"{host.mgmt_address} {public[0]} {public[1]}")
        info["hosts"][name] = {"netns": host.netns, "mgmt_address": host.mgmt_address, "data_address": host.data_address,
                               "data_device": CABLE_LINK, "sshd_pid": pid, "sshd_start": start, "dir": str(host.directory),
                               "work_dir": str(host.directory / "work")}
        _write_state(state, info)
    statedir.write_new(state / "known_hosts", ("\n".join(known) + "\n").encode(), 0o644)


def _sshd_config(host: LabHost, state: Path) -> str:
    return "\n".join([
        f"ListenAddress {host.mgmt_address}:{SSH_PORT}",
        f"HostKey {host.directory / 'ssh_host_ed25519_key'}",
        f"PidFile {host.pid_file}",
        f"AuthorizedKeysFile {_keys_dir(state) / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes yes",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxSessions 128",  # one multiplexed connection carries every process and events tail
        "MaxStartups 64:30:128",
        "LogLevel ERROR",
        "",
    ])


def _await_sshd(host: LabHost) -> int:
    """Until sshd wrote its pid file and accepts on the management address (bounded)."""
    deadline = time.monotonic() + SSHD_READY_S
    while True:
        pid = _read_pid(host.pid_file)
        if pid is not None:
            with contextlib.suppress(OSError), socket.create_connection((host.mgmt_address, SSH_PORT), timeout=0.5) as conn:
                if conn.recv(4).startswith(b"SSH-"):
                    return pid
        if time.monotonic() > deadline:
            log = (host.directory / "sshd.log")
            tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
            raise HarnessError(f"lab: sshd of {host.name} did not answer on {host.mgmt_address}:{SSH_PORT} "
                               f"within {SSHD_READY_S:g}s {tail.strip()}")
        time.sleep(0.05)


def _read_pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def write_inventory(info: dict[str, Any], path: Path, *, slurm: bool = False) -> None:
    """The lab as an inventory file (``harness.hosts.inventory``): strict host keys, the lab's client
    key, this harness's Python and checkout (the file system is shared, not the work dirs). Written
    whole under a fresh name and renamed over ``path`` (``statedir.replace``): a symlink planted at
    ``path`` is replaced, never followed, and a reader never sees half a file.
    ``slurm``: an allocation's inventory (``harness.hosts.allocation``): the machines are the nodes
    of the job it is used in; the file gives each node's data plane and work dir."""
    state = Path(info["state"])
    repo = Path(__file__).resolve().parents[2]  # the checkout (this file is harness/hosts/lab.py)
    doc: dict[str, Any] = {
        "defaults": {
            "user": "root",
            "identity_file": str(state / "id_ed25519"),
            "known_hosts": {"policy": "strict", "file": str(state / "known_hosts")},
            "python": sys.executable,
            "repo": str(repo),
            "transport": "ucx-tcp-any",
        },
    }
    machines = {name: {"address": h["mgmt_address"], "work_dir": h["work_dir"],
                       "data": {"address": h["data_address"], "device": h["data_device"]}}
                for name, h in info["hosts"].items()}
    if slurm:
        nodes = {name: {k: v for k, v in m.items() if k != "address"} for name, m in machines.items()}
        doc["slurm"] = {"conf": info["slurm"]["conf"], "nodes": nodes}
    else:
        doc["machines"] = machines
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# written by `mxchaos lab up` ({info['state']}); `mxchaos lab down` removes the lab\n"
            + yaml.safe_dump(doc, sort_keys=False))
    statedir.replace(path, text.encode(), 0o644)


# ---------------------------------------------------------------------------- down / cleanup


def _lab_namespaces(tok: str) -> list[str]:
    return [ns for ns in netns.namespaces() if ns.startswith(f"mxl{tok}-")]


def _lab_links(state: Path, tok: str) -> list[str]:
    alias = f"{ALIAS_PREFIX}{state}"
    names = []
    for link in netns._links():
        name = str(link.get("ifname", ""))
        if str(link.get("ifalias") or "") == alias or name in (f"mxlm{tok}", f"mxld{tok}") \
                or name.startswith((f"lm{tok}-", f"ld{tok}-")):
            names.append(name)
    return names


def leftovers(state: Path | None = None) -> list[str]:
    """What of the lab still exists: namespaces, links, recorded sshd processes, the state dir and
    the authorized_keys folder. StateDirError when the state dir is not ours."""
    state = _checked(state)
    tok = _token(state)
    found = [f"netns {ns}" for ns in _lab_namespaces(tok)] + [f"link {n}" for n in _lab_links(state, tok)]
    found += [f"sshd pid {pid}" for pid in _lab_sshd_pids(state)]
    found += slurm_lab.leftovers(state, tok, status(state))
    found += [f"dir {folder}" for folder in (state, _keys_dir(state)) if os.path.lexists(folder)]
    return found


def _lab_sshd_pids(state: Path) -> list[int]:
    """The sshd processes ``lab.json`` recorded that still run (pid and start time both match: a
    pid the kernel gave to another process since is not ours)."""
    info = status(state) or {}
    hosts = info.get("hosts")
    pids = []
    for host in hosts.values() if isinstance(hosts, dict) else ():
        pid, start = (host.get("sshd_pid"), host.get("sshd_start")) if isinstance(host, dict) else (None, None)
        if isinstance(pid, int) and isinstance(start, int) and procscan.proc_start_time(pid) == start and _alive(pid):
            pids.append(pid)
    return pids


def down(state: Path | None = None) -> list[str]:
    """Remove the lab (idempotent); returns what went. HarnessError listing what would not go;
    StateDirError (before anything is touched) when the state dir is not ours or a symlink."""
    state = _checked(state)
    tok = _token(state)
    removed: list[str] = slurm_lab.stop(state, tok, status(state))  # the controller and munged live outside the namespaces
    for ns in _lab_namespaces(tok):  # everything inside: sshd, its sessions, anything a run left
        for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
                removed.append(f"pid {pid} in {ns}")
    for sshd_pid in _lab_sshd_pids(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(sshd_pid, signal.SIGKILL)
            removed.append(f"sshd pid {sshd_pid}")
    for ns in _lab_namespaces(tok):
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(f"netns {ns}")
    deadline = time.monotonic() + 5.0
    while True:
        links = _lab_links(state, tok)
        for name in sorted(links, key=lambda n: n.startswith("mxl")):  # veths first, bridges last
            if _run(["ip", "link", "del", "dev", name], check=False).returncode == 0:
                removed.append(f"link {name}")
        if not _lab_links(state, tok) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for folder in (state, _keys_dir(state)):
        if statedir.remove_tree(folder):
            removed.append(f"dir {folder}")
    left = leftovers(state)
    if left:
        raise HarnessError(f"lab down: could not remove {', '.join(left)}")
    return removed


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def abandoned(state: Path | None = None) -> bool:
    """A lab whose ``lab up`` died while building it (what ``mxchaos cleanup`` removes)."""
    info = status(state)
    if info is None or info.get("status") != "building":
        return False
    pid, start = info.get("builder_pid"), info.get("builder_start")
    return not procscan.harness_alive(pid if isinstance(pid, int) else None, start if isinstance(start, int) else None)


# ---------------------------------------------------------------------------- command line


def add_parser(sub: Any) -> None:
    """Register ``lab`` (``up``, ``down``, ``status``) on ``mxchaos``'s sub-parsers."""
    lab = sub.add_parser("lab", help="N ssh hosts on this machine (network namespaces running sshd; root)")
    verbs = lab.add_subparsers(dest="lab_command", required=True)
    p_up = verbs.add_parser("up", help="build the lab and write its inventory")
    p_up.add_argument("--hosts", type=int, required=True, metavar="N")
    p_up.add_argument("--inventory-out", metavar="FILE", help="write the lab's inventory here (default: <state>/inventory.yaml)")
    p_up.add_argument("--slurm", action="store_true",
                      help="also a SLURM cluster: munge, slurmctld and a slurmd per host, all under the lab's state dir "
                           "(harness/hosts/slurm_lab.py); prints the SLURM_CONF to use")
    p_up.set_defaults(fn=_cmd_up)
    verbs.add_parser("down", help="remove every namespace, veth, bridge, sshd and key of the lab").set_defaults(fn=_cmd_down)
    verbs.add_parser("status", help="print the lab's state (exit 1 when none is up)").set_defaults(fn=_cmd_status)


def _cmd_up(args: Any) -> int:
    out = Path(args.inventory_out) if args.inventory_out else lab_dir() / "inventory.yaml"
    try:
        info = up(args.hosts, inventory_out=out, slurm=args.slurm)
    except HarnessError as exc:
        print(f"mxchaos lab up: {exc}", file=sys.stderr)
        return 1
    for name, h in info["hosts"].items():
        print(f"{name}  ssh root@{h['mgmt_address']}  data {h['data_address']} ({h['data_device']})  netns {h['netns']}")
    print(f"inventory: {out}\nssh: ssh -i {info['state']}/id_ed25519 -o UserKnownHostsFile={info['state']}/known_hosts "
          f"root@{next(iter(info['hosts'].values()))['mgmt_address']}")
    if args.slurm:
        record = info["slurm"]
        print(f"slurm: controller {record['controller']}, nodes {','.join(info['hosts'])}\n"
              f"  export SLURM_CONF={record['conf']}   (or: . {record['env_file']})\n"
              f"  inside an allocation (salloc -N2 ...): mxchaos run --inventory {record['inventory']} SCENARIO")
    return 0


def _cmd_down(args: Any) -> int:
    try:
        removed = down()
    except HarnessError as exc:
        print(f"mxchaos lab down: {exc}", file=sys.stderr)
        return 1
    print(f"removed {len(removed)} thing(s)" if removed else "no lab")
    return 0


def _cmd_status(args: Any) -> int:
    try:
        info = status()
        left = leftovers() if info is None else []
    except HarnessError as exc:
        print(f"mxchaos lab status: {exc}", file=sys.stderr)
        return 1
    if info is None:
        print("no lab" + (f" (leftovers: {', '.join(left)}; run `mxchaos lab down`)" if left else ""))
        return 1
    print(json.dumps(info, indent=2))
    if "slurm" in info:
        print(slurm_lab.sinfo(info))
    return 0
