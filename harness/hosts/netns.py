"""``netns`` hosts: each scenario host in its own network namespace, all on one bridge.

``Network.create(run_id, hosts)`` builds, for one run::

    root namespace                         namespace mxc-<token>-<host>
    bridge mxb<token>  10.213.N.1/24  ──  veth mxv<token>-<i>  ══  mx0  10.213.N.(10+i)/24, lo up

- ``N`` is a /24 of ``10.213.0.0/16`` leased like ``harness/machine/ports.py`` leases ports: an
  exclusive ``flock`` on ``/run/mxchaos/subnets/10.213.N.lock`` for the life of the run (so two
  harnesses, e.g. pytest-xdist workers, never share one), and skipped when any interface of
  the root namespace already has an address in it (a crashed run's bridge still up).
- ``token`` is 8 hex digits of the run id's SHA-256: interface names are at most 15 bytes.
  Every root-namespace link of the run carries the alias ``mxchaos <run id> <harness pid>
  <its start time>``, so ``mxchaos cleanup`` finds them, the run they belong to and whether
  its harness still lives, without the run's ledger entry.
- No default route anywhere: a namespace reaches its own /24 only (the other hosts and the
  bridge address, which is how the harness scrapes ``/metrics`` and probes ports). Nothing of
  the machine is touched: no existing interface, route, sysctl or firewall rule.

``NetnsHost`` is a ``harness.hosts.base.Host``: it spawns with ``ip netns exec NS argv`` (which
execs, so the pid is the program's; ``MXCHAOS_RUN_ID`` and the rest of the environment pass
through), reads files directly (the file system is shared) and probes ports at its address.

``close()`` deletes the namespaces, then the root-side veths (a namespace a process still
holds would keep them), then the bridge, and releases the subnet; ``sweep(run_id)`` does the
same for a crashed run from the names alone. Every command is bounded (``IP_TIMEOUT_S``).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HostError
from harness.hosts.base import ExecResult, LocalHost, LocalProc, Place
from harness.machine import procscan, statedir
from harness.machine.ports import try_lock

__all__ = [
    "ALIAS_PREFIX",
    "INNER_LINK",
    "Network",
    "NetnsHost",
    "SUBNET_POOL",
    "leftover_runs",
    "leftovers",
    "names_for",
    "ns_run",
    "sweep",
    "token",
]

SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
INNER_LINK = "mx0"  # the namespace side of every veth (same name in every namespace)
ALIAS_PREFIX = "mxchaos "
NS_PREFIX = "mxc-"
BRIDGE_PREFIX = "mxb"
VETH_PREFIX = "mxv"
IP_TIMEOUT_S = 10.0
FIRST_HOST = 10  # host i gets .FIRST_HOST+i; the bridge is .1
QDISC_HANDLE = "1de:"  # the handle of a rate fault's tbf qdisc (harness.faults.netns), that sweeps look for


def token(run_id: str) -> str:
    """8 hex digits naming a run's interfaces (IFNAMSIZ is 16 with the NUL)."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Names:
    token: str
    bridge: str
    ns_prefix: str

    def ns(self, host: str) -> str:
        return f"{self.ns_prefix}{host}"

    def veth(self, index: int) -> str:
        return f"{VETH_PREFIX}{self.token}-{index}"


def names_for(run_id: str) -> Names:
    tok = token(run_id)
    return Names(tok, f"{BRIDGE_PREFIX}{tok}", f"{NS_PREFIX}{tok}-")


def _ip_binary() -> str:
    found = shutil.which("ip")
    if found is None:
        raise HostError("netns hosts need `ip` (iproute2) on PATH")
    return found


def ip(*args: str, check: bool = True, timeout: float = IP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``ip ARGS`` bounded by ``timeout``; HostError on failure when ``check``."""
    argv = [_ip_binary(), *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HostError(f"`{' '.join(argv)}` did not return within {timeout:g}s") from None
    if check and done.returncode != 0:
        raise HostError(f"`{' '.join(argv)}` failed (rc {done.returncode}): {done.stderr.strip()}")
    return done


def ns_run(ns: str, argv: Sequence[str], *, timeout: float = IP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a short command inside namespace ``ns`` (bounded); never raises on its exit code."""
    full = [_ip_binary(), "netns", "exec", ns, *argv]
    try:
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HostError(f"`{' '.join(full)}` did not return within {timeout:g}s") from None


def namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[dict[str, object]]:
    done = ip("-j", "link", "show", check=False)
    try:
        return list(json.loads(done.stdout or "[]"))
    except ValueError:
        return []


def _root_ipv4_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address or a route in."""
    texts: list[str] = []
    with contextlib.suppress(ValueError):
        for link in json.loads(ip("-j", "-4", "addr", "show", check=False).stdout or "[]"):
            texts += [f"{info.get('local')}/{info.get('prefixlen')}" for info in link.get("addr_info", ())]
    with contextlib.suppress(ValueError):
        for route in json.loads(ip("-j", "-4", "route", "show", "table", "all", check=False).stdout or "[]"):
            dst = str(route.get("dst") or "default")
            if dst != "default":
                texts.append(dst if "/" in dst else f"{dst}/32")
    nets = []
    for text in texts:
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(text, strict=False))
    return nets


# ---------------------------------------------------------------------------- subnet leases


SUBNET_LOCK_DIR = Path("/run/mxchaos/subnets")  # machine-wide, whatever MXCHAOS_STATE_DIR says


def _lock_dir() -> Path:
    """Subnets are a resource of the machine, not of one state dir: one folder for every harness."""
    try:  # both checked as the state directory is (harness.machine.statedir): ours, no symlink
        statedir.ensure_dir(SUBNET_LOCK_DIR)
        return SUBNET_LOCK_DIR
    except (OSError, statedir.StateDirError):  # not root: /run is not ours
        path = statedir.default_base() / "subnets"
        statedir.ensure_dir(path)
        return path


@dataclass
class SubnetLease:
    network: ipaddress.IPv4Network
    _fd: int | None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def lease_subnet(run_id: str, pool: ipaddress.IPv4Network = SUBNET_POOL) -> SubnetLease:
    """A /24 of ``pool`` no other harness holds and the root namespace does not use."""
    folder = _lock_dir()
    used = _root_ipv4_networks()
    subnets = list(pool.subnets(new_prefix=24))
    start = int(token(run_id), 16) % len(subnets)  # spread runs over the pool
    for subnet in subnets[start:] + subnets[:start]:
        if any(subnet.overlaps(net) for net in used):
            continue
        fd = try_lock(folder / f"{subnet.network_address}.lock")
        if fd is None:
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{run_id} {os.getpid()}\n".encode())
        return SubnetLease(subnet, fd)
    raise HostError(f"no free /24 left in {pool} for a netns run")


# ---------------------------------------------------------------------------- hosts


class NetnsHost(LocalHost):
    """Processes inside the namespace ``netns``, reached at ``address`` over the run's bridge."""

    kind = "netns"
    own_address = True  # its processes bind and advertise the namespace's address

    def __init__(self, name: str, netns: str, address: str, link: str, index: int) -> None:
        super().__init__(name)
        self.netns = netns
        self.address = address
        self.link: str = link  # the root-namespace end of its veth (a bridge port)
        self.inner_link: str = INNER_LINK
        self.index = index

    def fault_place(self) -> Place:
        return Place(self.netns)  # its network faults' commands run in its namespace

    def _wrap(self, argv: Sequence[str]) -> list[str]:
        return [_ip_binary(), "netns", "exec", self.netns, *argv]

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> LocalProc:
        return super().spawn(self._wrap(argv), env=env, cwd=cwd, log_path=log_path)

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> ExecResult:
        return super().exec(self._wrap(argv), env=env, cwd=cwd, timeout=timeout)

    def _ns_inode(self) -> int | None:
        try:
            return os.stat(f"/run/netns/{self.netns}").st_ino
        except OSError:
            return None

    def run_processes(self, run_id: str) -> list[procscan.RunProcess]:
        """The run's processes inside this namespace (all of the run's when it is gone)."""
        inode = self._ns_inode()
        found = procscan.find(run_id)
        if inode is None:
            return found
        inside = []
        for p in found:
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{p.pid}/ns/net").st_ino == inode:
                    inside.append(p)
        return inside

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "netns": self.netns, "address": self.address, "link": self.link,
                "inner_link": self.inner_link}


@dataclass
class Network:
    """One run's bridge, namespaces and veth pairs (see the module docstring)."""

    run_id: str
    names: Names
    subnet: ipaddress.IPv4Network
    bridge_address: str
    hosts: dict[str, NetnsHost] = field(default_factory=dict)
    _lease: SubnetLease | None = None
    _alias: str = ""
    closed: bool = False

    @classmethod
    def create(cls, run_id: str, host_names: Sequence[str], owner: tuple[int, int | None] | None = None) -> Network:
        """Build it all; on any failure what was made is removed again (HostError). ``owner``:
        the harness's (pid, start time), recorded in the link aliases for ``mxchaos cleanup``."""
        names = names_for(run_id)
        lease = lease_subnet(run_id)
        hosts_ = list(lease.network.hosts())
        if len(host_names) > len(hosts_) - FIRST_HOST:
            lease.release()
            raise HostError(f"at most {len(hosts_) - FIRST_HOST} netns hosts per run")
        net = cls(run_id, names, lease.network, str(hosts_[0]), _lease=lease)
        pid, start = owner or (os.getpid(), procscan.proc_start_time(os.getpid()))
        net._alias = f"{ALIAS_PREFIX}{run_id} {pid} {start if start is not None else '-'}"
        try:
            net._build(host_names)
        except BaseException:
            with contextlib.suppress(Exception):
                net.close()
            raise
        return net

    def _build(self, host_names: Sequence[str]) -> None:
        alias = self._alias
        prefix = self.subnet.prefixlen
        bridge = self.names.bridge
        ip("link", "add", bridge, "type", "bridge")
        ip("link", "set", "dev", bridge, "alias", alias)
        ip("addr", "add", f"{self.bridge_address}/{prefix}", "dev", bridge)
        ip("link", "set", "dev", bridge, "up")
        addresses = list(self.subnet.hosts())
        for index, host in enumerate(host_names):
            ns, veth = self.names.ns(host), self.names.veth(index)
            address = str(addresses[FIRST_HOST - 1 + index])
            ip("netns", "add", ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", INNER_LINK, "netns", ns)
            self.hosts[host] = NetnsHost(host, ns, address, veth, index)
            ip("link", "set", "dev", veth, "alias", alias)
            ip("link", "set", "dev", veth, "master", bridge, "up")
            ip("-n", ns, "addr", "add", f"{address}/{prefix}", "dev", INNER_LINK)
            ip("-n", ns, "link", "set", "dev", INNER_LINK, "up")
            ip("-n", ns, "link", "set", "dev", "lo", "up")
        self._await_reachable()

    def _await_reachable(self, within: float = 5.0) -> None:
        """Until every namespace link is up (carrier through the bridge); bounded."""
        deadline = time.monotonic() + within
        for host in self.hosts.values():
            while True:
                out = ip("-n", host.netns, "-br", "link", "show", "dev", INNER_LINK, check=False).stdout
                if " UP " in f" {out} " and "NO-CARRIER" not in out:
                    break
                if time.monotonic() > deadline:
                    raise HostError(f"{host.netns}: {INNER_LINK} did not come up: {out.strip()}")
                time.sleep(0.02)

    def describe(self) -> dict[str, object]:
        return {
            "token": self.names.token,
            "subnet": str(self.subnet),
            "bridge": self.names.bridge,
            "bridge_address": self.bridge_address,
            "hosts": {name: host.describe() for name, host in self.hosts.items()},
        }

    def close(self) -> dict[str, object]:
        """Delete everything of the run (idempotent); returns what was removed and any leftover."""
        removed = sweep(self.run_id)
        deadline = time.monotonic() + 3.0  # the kernel deletes a namespace's veth asynchronously
        left = leftovers(self.run_id)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            removed += sweep(self.run_id)
            left = leftovers(self.run_id)
        if self._lease is not None and not left:  # a subnet still in use stays leased until we exit
            self._lease.release()
            self._lease = None
        self.closed = True
        return {"removed": removed, "leftovers": left}


# ---------------------------------------------------------------------------- cleanup


def _parse_alias(alias: str) -> tuple[str, int | None, int | None] | None:
    """(run id, harness pid, its start time) from a link alias of ours; None for any other."""
    if not alias.startswith(ALIAS_PREFIX):
        return None
    parts = alias[len(ALIAS_PREFIX):].split()
    if not parts:
        return None
    pid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    start = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
    return parts[0], pid, start


def _run_links(run_id: str) -> list[str]:
    names = names_for(run_id)
    out = []
    for link in _links():
        name = str(link.get("ifname", ""))
        owner = _parse_alias(str(link.get("ifalias") or ""))
        if (owner and owner[0] == run_id) or name == names.bridge or name.startswith(f"{VETH_PREFIX}{names.token}-"):
            out.append(name)
    return out


def leftovers(run_id: str) -> list[str]:
    """What of the run's network still exists: ``netns NAME`` / ``link NAME`` entries."""
    prefix = names_for(run_id).ns_prefix
    found = [f"netns {ns}" for ns in namespaces() if ns.startswith(prefix)]
    return found + [f"link {name}" for name in _run_links(run_id)]


def leftover_runs() -> dict[str, tuple[int | None, int | None]]:
    """Run id -> (harness pid, its start time) of every run whose links are on this machine
    (from the ``mxchaos <run id> <pid> <start>`` aliases)."""
    runs: dict[str, tuple[int | None, int | None]] = {}
    for link in _links():
        owner = _parse_alias(str(link.get("ifalias") or ""))
        if owner is not None:
            runs.setdefault(owner[0], (owner[1], owner[2]))
    return runs


def sweep(run_id: str) -> list[str]:
    """Delete the run's namespaces, veths and bridge (whatever exists); returns what went."""
    removed: list[str] = []
    if shutil.which("ip") is None:
        return removed
    prefix = names_for(run_id).ns_prefix
    for ns in namespaces():
        if ns.startswith(prefix) and ip("netns", "del", ns, check=False).returncode == 0:
            removed.append(f"netns {ns}")
    bridge = names_for(run_id).bridge
    links = _run_links(run_id)
    for name in sorted(links, key=lambda n: n == bridge):  # veths first, the bridge last
        if ip("link", "del", "dev", name, check=False).returncode == 0:
            removed.append(f"link {name}")
    return removed
