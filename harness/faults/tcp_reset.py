"""Network faults on one host: reset the TCP connections between two processes.

``tcp_reset`` kills every established TCP connection between the target's current
incarnation and the peer's (``ss -K``, which needs CAP_NET_ADMIN and a kernel with
INET_DIAG_DESTROY): the reader's NIXL data socket, its metadata socket, any gRPC
channel. Both ends see the connection aborted while both processes stay alive,
which is what a middlebox or a NIC reset does, and what no signal can do. On NIXL
1.5.1 with UCX 1.23 over TCP a reset of the data connection mid-READ aborts the
*source* process (measured; see the scenario ``tcp_reset_mid_read``).

A connection can be a moment behind the event that fires the fault: the reader announces
``transfer_start`` before NIXL's first post, and a socket the source has not accepted yet has no
owner in ``ss``. So the inject looks again every 20 ms, bounded by ``wait`` (default 2s), and
records how long it waited (``waited_s``).

Nothing is left to heal: the connections are gone and the peers reconnect (or not)
on their own. ``ss`` runs through ``harness.faults.commands`` (the seam unit tests stub), where
each process's host answers its fault commands (``HostView.place``: this machine's root
namespace for a local host, the host's namespace, an ssh host's own shell): the target's
sockets are listed and reset on its host, the peer's listed on its own (on another host, the
two ends are matched by address, as the hosts see each other's: no NAT between them).
"""

from __future__ import annotations

import re
import time
from typing import Literal

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, commands, process_of, register
from harness.hosts.base import Place
from harness.record.witness import Witness
from harness.spec import Duration, Name, Target

__all__ = ["TcpReset", "TcpResetSpec", "connections_between"]

_USERS = re.compile(r"pid=(\d+)")


def _sockets(place: Place | None = None) -> list[tuple[str, str, set[int]]]:
    """(local, peer, owning pids) of every established TCP socket at ``place`` (None: this machine)."""
    argv = ["ss", "-tnpH", "state", "established"]
    rc, out = commands.shell.run(place, argv)
    if rc != 0:
        raise FaultError(f"tcp_reset: {' '.join(argv)} failed (rc {rc}{f', at {place}' if place else ''}): {out}")
    sockets = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        # Recv-Q Send-Q Local Peer [Process]
        local, peer = fields[2], fields[3]
        pids = {int(p) for p in _USERS.findall(line)}
        sockets.append((local, peer, pids))
    return sockets


def connections_between(pid_a: int, pid_b: int, place_a: Place | None = None,
                        place_b: Place | None = None) -> list[tuple[str, str]]:
    """(local, peer) of each connection held by ``pid_a`` (on the host at ``place_a``) whose
    other end ``pid_b`` (on the host at ``place_b``) holds."""
    sockets = _sockets(place_a)
    theirs = sockets if place_b == place_a else _sockets(place_b)
    owned_by_b = {_plain(local) for local, _peer, pids in theirs if pid_b in pids}
    return [(local, peer) for local, peer, pids in sockets if pid_a in pids and _plain(peer) in owned_by_b]


def _plain(endpoint: str) -> str:
    """``endpoint`` with an IPv4-mapped IPv6 address as the IPv4 one: a dual-stack socket shows
    ``[::ffff:10.0.0.1]:5000`` where its IPv4 peer shows ``10.0.0.1:5000``."""
    host, port = _split(endpoint)
    return f"{host.removeprefix('::ffff:')}:{port}" if "." in host else endpoint


def _split(endpoint: str) -> tuple[str, str]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), port


class TcpResetSpec(FaultSpec):
    """Reset (``ss -K``) every established TCP connection between ``target`` and ``peer``;
    ``wait`` bounds how long the inject looks for one before it fails."""

    kind: Literal["tcp_reset"]
    target: Name
    peer: Target
    wait: Duration = 2.0

    def process_refs(self) -> tuple[str, ...]:
        return (self.target, process_of(self.peer))

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target, self.peer)


@register
class TcpReset(Fault[TcpResetSpec, None]):
    kind = "tcp_reset"
    Spec = TcpResetSpec
    requires = ("root", "ss")
    ssh_needs = ("root", "ss")  # on an ssh host: its own ss, as root (sudo -n where the inventory says)

    def inject(self, ctx: FaultContext) -> Injected[None]:
        spec = self.spec
        if not commands.shell.have("ss"):
            raise FaultError("tcp_reset needs `ss` (iproute2)")
        peer = ctx.resolve(spec.peer)
        a, b = ctx.proc(spec.target), ctx.proc(peer)
        if a.pid is None or not a.alive or b.pid is None or not b.alive:
            raise FaultError(f"tcp_reset: {spec.target} and {peer} must both be running")
        here, there = ctx.locate(spec.target).place, ctx.locate(peer).place
        began = time.monotonic()
        while not (pairs := connections_between(a.pid, b.pid, here, there)):
            waited = time.monotonic() - began
            if waited >= spec.wait:
                raise FaultError(f"tcp_reset: no established TCP connection between {spec.target} and {peer} "
                                 f"within {spec.wait:g}s (wait)")
            ctx.sleep(min(0.02, spec.wait - waited))
        waited_s = round(time.monotonic() - began, 3)
        killed = []
        for local, remote in pairs:
            (lhost, lport), (phost, pport) = _split(local), _split(remote)
            cmd = ["ss", "-K", "-tn", "src", f"{lhost}:{lport}", "dst", f"{phost}:{pport}"]
            rc, out = commands.shell.run(here, cmd)
            if rc != 0:
                raise FaultError(f"tcp_reset: {' '.join(cmd)} failed (rc {rc}): {out}")
            killed.append(f"{local}->{remote}")
        # the witness: which of them are gone now (an ``ss -K`` on a kernel without
        # INET_DIAG_DESTROY answers 0 and destroys nothing)
        still = set(connections_between(a.pid, b.pid, here, there)) & set(pairs)
        gone = len(pairs) - len(still)
        figures = {"connections": len(pairs), "destroyed": gone, "still": sorted(f"{x}->{y}" for x, y in still)}
        witness = (Witness.seen(f"{gone} of {len(pairs)} connections destroyed", **figures) if gone
                   else Witness.none(f"all {len(pairs)} connections still established after ss -K", **figures))
        return Injected(None, {"target": spec.target, "peer": peer, "connections": killed, "waited_s": waited_s,
                               "witness": witness.to_json()})
