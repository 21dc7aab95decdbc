"""Data-plane network faults between ``netns`` hosts: partition, reject, link_down, rate.

Each acts on the run's own namespaces and veths (``harness/netns.py``), never on the
machine's interfaces or firewall:

- ``partition``: drop every packet between two hosts (both directions), or only those to or
  from the given ``ports`` (TCP and UDP, either end's port). iptables rules in a chain of our
  own, ``mxc-<token>-<fault>`` (token: from the run id), in the *target* host's namespace,
  jumped to from its INPUT and OUTPUT. Heal: unhook and delete the chain.
- ``reject``: the same, but TCP is answered with a reset (``REJECT --reject-with tcp-reset``)
  and anything else with ICMP port-unreachable, sent to whoever sent the packet: a socket
  that only receives hears nothing until it sends (on the receiving side of a READ that took
  UCX's keepalive, about 9 s here), so reject where the receiver's packets arrive.
  ``direction`` (both, in, out) cuts one way only, for both kinds.
- ``link_down``: the host's veth goes down on the bridge side (the cable is pulled: the
  namespace keeps its address and route, its packets go nowhere). Heal: up again.
- ``rate``: a ``tbf`` qdisc (handle ``1de:``) on the host's egress (its namespace end of the
  veth), ingress (the bridge end) or both. Heal: delete our qdisc. ``tc netem`` (delay, loss)
  is missing on many kernels, this one included, and is not used.

What NIXL + UCX-TCP does under each: notes/nixl-faults.md §5 (a DROP is a wedge: no error
within 150 s, TCP backoff after the heal; a REJECT reset is REMOTE_DISCONNECT in ms).

A host target is a host name, a process name (the host it runs on) or ``{source_of: reader}``
(the host of the source that reader is attempting when the fault fires). After a crash,
``mxchaos cleanup`` first removes the run's chains (``partition``'s ``sweep``), then its network
sweep deletes the namespaces and veths, and with them every rule, qdisc and link state.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from typing import Any, Literal

from pydantic import Field, field_validator

from harness import netns
from harness.errors import FaultError, HostError
from harness.faults import Fault, FaultContext, FaultSpec, HostView, register
from harness.spec import Duration, SourceOf, Target, custom_error

__all__ = ["LinkDown", "Partition", "Rate", "Reject", "chain_name", "parse_rate"]

IPT_TIMEOUT_S = 10.0
QDISC_HANDLE = "1de:"


def chain_name(run_id: str, fault: str) -> str:
    """Our iptables chain for one fault (at most 28 characters): run token + fault hash."""
    return f"{_chain_prefix(run_id)}{hashlib.sha256(fault.encode()).hexdigest()[:6]}"


def _chain_prefix(run_id: str) -> str:
    return f"mxc-{netns.token(run_id)}-"


def _describe(target: Target) -> str:
    return f"source_of({target.source_of})" if isinstance(target, SourceOf) else str(target)


def _netns_host(ctx: FaultContext, target: Target, kind: str) -> HostView:
    host = ctx.locate(target)
    if host.kind != "netns" or not host.netns:
        raise FaultError(f"{kind}: {_describe(target)} is on host {host.name} ({host.kind}); it needs a netns host")
    return host


def _ns(ns: str, argv: list[str]) -> tuple[int, str]:
    try:
        done = netns.ns_run(ns, argv, timeout=IPT_TIMEOUT_S)
    except HostError as exc:
        raise FaultError(str(exc)) from None
    return done.returncode, (done.stdout + done.stderr).strip()


def _iptables(ns: str, *args: str, check: bool = True) -> tuple[int, str]:
    rc, out = _ns(ns, ["iptables", "-w", "5", *args])
    if check and rc != 0:
        raise FaultError(f"iptables {' '.join(args)} in {ns} failed (rc {rc}): {out}")
    return rc, out


def _ns_exists(ns: str) -> bool:
    try:
        return ns in netns.namespaces()
    except HostError:
        return False


def _remove_chain(ns: str, chain: str) -> bool:
    """Unhook ``chain`` from INPUT/OUTPUT and delete it; False when it did not exist."""
    if not _ns_exists(ns) or _iptables(ns, "-S", chain, check=False)[0] != 0:
        return False
    for hook in ("INPUT", "OUTPUT"):
        for _ in range(16):  # bounded: each pass removes one jump
            if _iptables(ns, "-D", hook, "-j", chain, check=False)[0] != 0:
                break
    _iptables(ns, "-F", chain)
    _iptables(ns, "-X", chain)
    return True


class _Between(FaultSpec):
    target: Target  # a host, a process (its host) or {source_of: reader}
    peer: Target
    ports: tuple[int, ...] = Field((), max_length=15)  # only packets to/from these ports (TCP, UDP)
    # both: everything between them; in: only what target receives from peer; out: only what it sends
    direction: Literal["both", "in", "out"] = "both"

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        for port in value:
            if not 1 <= port <= 65535:
                raise custom_error("port", f"{port} is not a port (1..65535)")
        return value


class PartitionSpec(_Between):
    """Drop the traffic between ``target``'s host and ``peer``'s host (``direction`` both, or
    only ``in`` to / ``out`` of the target's host; only packets to or from ``ports`` when
    given): a blackhole, TCP retransmits into the void."""

    kind: Literal["partition"]


class RejectSpec(_Between):
    """Like ``partition``, but a packet is answered: TCP with a reset, anything else with ICMP
    port-unreachable, *to its sender*. A host that only receives (a reader during a READ)
    learns of it when it next sends: put the rules where that host's packets arrive (``target``
    its peer) to reset it at once."""

    kind: Literal["reject"]


class _Firewall(Fault):
    healable = True
    requires = ("root", "netns", "iptables")
    reject = False

    def targets(self) -> tuple[str, ...]:
        return ()

    def host_targets(self) -> tuple[tuple[str, Target], ...]:
        spec: _Between = self.spec  # type: ignore[assignment]
        return (("target", spec.target), ("peer", spec.peer))

    def _matches(self) -> list[list[str]]:
        ports = ",".join(str(p) for p in self.spec.ports)  # type: ignore[attr-defined]
        if not ports:
            return [[]]
        return [["-p", proto, "-m", "multiport", "--ports", ports] for proto in ("tcp", "udp")]

    def _hooks(self) -> list[tuple[str, str]]:
        """(iptables direction flag, hook) per direction this fault cuts."""
        direction = self.spec.direction  # type: ignore[attr-defined]
        return [(flag, hook) for flag, hook, which in (("-s", "INPUT", "in"), ("-d", "OUTPUT", "out"))
                if direction in (which, "both")]

    def _rules(self, peer: str) -> list[list[str]]:
        rules: list[list[str]] = []
        for direction, _hook in self._hooks():
            for match in self._matches():
                base = [direction, peer, *match]
                if not self.reject:
                    rules.append([*base, "-j", "DROP"])
                    continue
                if "udp" not in base:
                    tcp = base if "tcp" in base else [*base, "-p", "tcp"]
                    # resets pass: those REJECT sends the peer (OUTPUT) and those it hands our
                    # own sockets (they come in through lo with the peer's source address)
                    rules.append([*tcp, "--tcp-flags", "RST", "RST", "-j", "RETURN"])
                    rules.append([*tcp, "-j", "REJECT", "--reject-with", "tcp-reset"])
                if "tcp" not in base:  # UDP, or everything else
                    rules.append([*base, "-j", "REJECT", "--reject-with", "icmp-port-unreachable"])
        return rules

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: _Between = self.spec  # type: ignore[assignment]
        if shutil.which("iptables") is None:
            raise FaultError(f"{self.kind} needs iptables")
        here, there = _netns_host(ctx, spec.target, self.kind), _netns_host(ctx, spec.peer, self.kind)
        if here.name == there.name:
            raise FaultError(f"{self.kind}: {_describe(spec.target)} and {_describe(spec.peer)} are both on host {here.name}")
        assert here.netns is not None
        chain = chain_name(ctx.run_id, self.name)
        self._applied = (here.netns, chain)
        _remove_chain(here.netns, chain)  # a leftover of an earlier attempt
        _iptables(here.netns, "-N", chain)
        rules = self._rules(there.address)
        for rule in rules:
            _iptables(here.netns, "-A", chain, *rule)
        for _flag, hook in self._hooks():
            _iptables(here.netns, "-I", hook, "1", "-j", chain)
        return {"host": here.name, "peer_host": there.name, "between": [here.address, there.address],
                "netns": here.netns, "chain": chain, "direction": spec.direction,
                "rules": [" ".join(r) for r in rules], "ports": list(spec.ports)}

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        applied = getattr(self, "_applied", None)
        if applied is None:
            return {"noop": True}
        ns, chain = applied
        removed = _remove_chain(ns, chain)
        return {"chain": chain, "removed": removed}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        if shutil.which("iptables") is None or shutil.which("ip") is None:
            return []
        prefix = _chain_prefix(run_id)
        removed = []
        for ns in netns.namespaces():
            if not ns.startswith(netns.names_for(run_id).ns_prefix):
                continue
            rc, out = _iptables(ns, "-S", check=False)
            chains = {line.split()[1] for line in out.splitlines() if line.startswith("-N ") and line.split()[1].startswith(prefix)}
            for chain in sorted(chains):
                if _remove_chain(ns, chain):
                    removed.append(f"{ns} iptables chain {chain}")
        return removed


@register
class Partition(_Firewall):
    kind = "partition"
    Spec = PartitionSpec


@register
class Reject(_Firewall):
    kind = "reject"
    Spec = RejectSpec
    reject = True

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        return []  # the same chains as partition: swept there


# ---------------------------------------------------------------------------- link_down


class LinkDownSpec(FaultSpec):
    """The host's veth goes down at the bridge (a pulled cable): nothing in or out."""

    kind: Literal["link_down"]
    target: Target


@register
class LinkDown(Fault):
    kind = "link_down"
    Spec = LinkDownSpec
    healable = True
    requires = ("root", "netns")

    def targets(self) -> tuple[str, ...]:
        return ()

    def host_targets(self) -> tuple[tuple[str, Target], ...]:
        return (("target", self.spec.target),)  # type: ignore[attr-defined]

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        host = _netns_host(ctx, self.spec.target, self.kind)  # type: ignore[attr-defined]
        assert host.link is not None
        self._link = host.link
        try:
            netns.ip("link", "set", "dev", host.link, "down")
        except HostError as exc:
            raise FaultError(str(exc)) from None
        return {"host": host.name, "link": host.link}

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        link = getattr(self, "_link", None)
        if link is None:
            return {"noop": True}
        done = netns.ip("link", "set", "dev", link, "up", check=False)
        if done.returncode != 0 and "Cannot find device" not in done.stderr:
            raise FaultError(f"ip link set dev {link} up failed: {done.stderr.strip()}")
        return {"link": link, "up": done.returncode == 0}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        return []  # the run's veths are deleted by the network sweep


# ---------------------------------------------------------------------------- rate

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)\s*$", re.IGNORECASE)
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(text: str) -> float:
    """Bits per second of a tc rate (``10mbit``, ``500kbit``, ``2mbps`` = 2 MB/s)."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a rate (e.g. 500kbit, 10mbit, 1gbit, 2mbps = 2 MB/s)")
    bits = float(match[1]) * _RATE_SCALE[match[2].lower()]
    if bits < 8000:
        raise ValueError(f"{text!r} is below 8kbit")
    return bits


class RateSpec(FaultSpec):
    """Limit the host's bandwidth with tbf: ``rate`` (tc units: ``10mbit``, ``2mbps`` = 2 MB/s),
    ``direction`` egress (what the host sends, default), ingress (what it receives) or both;
    ``burst`` bytes (default 20 ms at the rate, at least 16 KiB), ``latency`` the queue bound."""

    kind: Literal["rate"]
    target: Target
    rate: str
    direction: Literal["egress", "ingress", "both"] = "egress"
    burst: int | None = Field(None, ge=1600)
    latency: Duration = 0.2

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        try:
            parse_rate(value)
        except ValueError as exc:
            raise custom_error("rate", str(exc)) from None
        return value.strip().lower()


def _tc(ns: str | None, *args: str) -> tuple[int, str]:
    """``tc ARGS`` in namespace ``ns`` (None: the root namespace, for the bridge end of a veth)."""
    if ns is not None:
        return _ns(ns, ["tc", *args])
    try:
        done = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=IPT_TIMEOUT_S, check=False)  # noqa: S603, S607
    except subprocess.TimeoutExpired:
        raise FaultError(f"tc {' '.join(args)} did not return within {IPT_TIMEOUT_S:g}s") from None
    return done.returncode, (done.stdout + done.stderr).strip()


def _ours(ns: str | None, dev: str) -> bool:
    rc, out = _tc(ns, "qdisc", "show", "dev", dev)
    return rc == 0 and f"qdisc tbf {QDISC_HANDLE}" in out


@register
class Rate(Fault):
    kind = "rate"
    Spec = RateSpec
    healable = True
    requires = ("root", "netns", "tc")

    def targets(self) -> tuple[str, ...]:
        return ()

    def host_targets(self) -> tuple[tuple[str, Target], ...]:
        return (("target", self.spec.target),)  # type: ignore[attr-defined]

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: RateSpec = self.spec  # type: ignore[assignment]
        host = _netns_host(ctx, spec.target, self.kind)
        bits = parse_rate(spec.rate)
        burst = spec.burst or max(16384, int(bits / 8 * 0.02))
        devices: list[tuple[str | None, str]] = []
        if spec.direction in ("egress", "both"):
            devices.append((host.netns, str(host.inner_link)))
        if spec.direction in ("ingress", "both"):
            devices.append((None, str(host.link)))
        self._devices: list[tuple[str | None, str]] = []
        for ns, dev in devices:
            rc, out = _tc(ns, "qdisc", "replace", "dev", dev, "root", "handle", QDISC_HANDLE, "tbf",
                          "rate", spec.rate, "burst", str(burst), "latency", f"{int(spec.latency * 1000)}ms")
            if rc != 0:
                raise FaultError(f"tc qdisc replace dev {dev} ({ns or 'bridge side'}) failed: {out}")
            self._devices.append((ns, dev))
        return {"host": host.name, "rate": spec.rate, "bits_per_s": bits, "burst": burst,
                "devices": [f"{ns or 'root'}:{dev}" for ns, dev in self._devices]}

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        removed = []
        for ns, dev in getattr(self, "_devices", []):
            if ns is not None and not _ns_exists(ns):
                continue
            if _ours(ns, dev):
                rc, out = _tc(ns, "qdisc", "del", "dev", dev, "root", "handle", QDISC_HANDLE)
                if rc != 0 and _ours(ns, dev):
                    raise FaultError(f"tc qdisc del dev {dev} failed: {out}")
                removed.append(f"{ns or 'root'}:{dev}")
        return {"removed": removed}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        return []  # our qdiscs live on the run's veths, which the network sweep deletes
