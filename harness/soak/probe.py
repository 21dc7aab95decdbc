"""What a soak samples of one process, seen by the harness itself from ``/proc`` and asked of the
process's ``/metrics`` (the NIXL audit, ``mxref.audit``).

From ``/proc/<pid>``: ``fds`` (entries of ``fd/``), ``rss_kib`` (``VmRSS`` of ``status``),
``threads`` (``Threads``), ``tcp``, ``tcp_established`` and ``tcp_close_wait``: the process's TCP sockets, found by the
inodes of its ``socket:[N]`` descriptors in ``net/tcp`` and ``net/tcp6`` (UCX's endpoints over TCP
are such sockets, beside its listeners and gRPC's connections). From ``/metrics``:
``nixl_<resource>_open`` (``mxref_nixl_resources_open``, the process's sum over its agents) and the
made counters (``mxref_nixl_resources_total{op="made"}``) that the soak cross-checks against the
loads it counted itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.scrape import sample_value, scrape

__all__ = ["AUDIT_RESOURCES", "ProcessGone", "proc_sample", "audit_sample", "tcp_sockets"]

AUDIT_RESOURCES = ("handles", "dlists", "registrations", "remote_agents")  # mxref.audit.RESOURCES
SCRAPE_TIMEOUT_S = 5.0
_ESTABLISHED, _CLOSE_WAIT = "01", "08"  # the state column of /proc/net/tcp
_PROC = Path("/proc")


class ProcessGone(RuntimeError):
    """The process sampled has exited (its /proc entry is gone)."""


def _socket_inodes(pid: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    fd_dir = proc / str(pid) / "fd"
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / name)
        except OSError:  # closed between the listing and the look
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_sockets(pid: int, proc: Path = _PROC) -> tuple[int, int, int]:
    """(TCP sockets, of which established, of which in CLOSE_WAIT: the peer closed, this process did
    not) that ``pid`` holds a descriptor of."""
    inodes = _socket_inodes(pid, proc)
    total = established = close_wait = 0
    for table in ("tcp", "tcp6"):
        path = proc / str(pid) / "net" / table
        try:
            lines = path.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                total += 1
                established += cols[3] == _ESTABLISHED
                close_wait += cols[3] == _CLOSE_WAIT
    return total, established, close_wait


def proc_sample(pid: int, proc: Path = _PROC) -> dict[str, float]:
    """``fds``, ``rss_kib``, ``threads``, ``tcp``, ``tcp_established``, ``tcp_close_wait`` of ``pid``;
    ProcessGone if it exited."""
    try:
        fds = len(os.listdir(proc / str(pid) / "fd"))
        status = (proc / str(pid) / "status").read_text()
        tcp, established, close_wait = tcp_sockets(pid, proc)
    except FileNotFoundError as exc:
        raise ProcessGone(f"process {pid} is gone") from exc
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith("Z"):
        raise ProcessGone(f"process {pid} has exited (a zombie)")
    rss = float(fields.get("VmRSS", "0 kB").split()[0])
    threads = float(fields.get("Threads", "0").strip())
    return {"fds": float(fds), "rss_kib": rss, "threads": threads, "tcp": float(tcp),
            "tcp_established": float(established), "tcp_close_wait": float(close_wait)}


def audit_sample(metrics_url: str) -> tuple[dict[str, float], dict[str, float]]:
    """(``nixl_<resource>_open`` per resource, made per resource) from the process's ``/metrics``;
    a resource the process never counted is 0. Raises OSError / ValueError when the scrape fails."""
    samples = scrape(metrics_url, SCRAPE_TIMEOUT_S)
    opened: dict[str, float] = {}
    made: dict[str, float] = {}
    for resource in AUDIT_RESOURCES:
        opened[f"nixl_{resource}_open"] = sample_value(samples, "mxref_nixl_resources_open", {"resource": resource}) or 0.0
        made[resource] = sample_value(samples, "mxref_nixl_resources_total", {"resource": resource, "op": "made"}) or 0.0
    return opened, made


def describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in values.items() if isinstance(v, int | float))
