"""Data-plane network faults between ``netns`` hosts: partition, reject, link_down, rate.

Each acts on the run's own namespaces and veths (``harness/hosts/netns.py``), never on the
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

What NIXL + UCX-TCP does under each: docs/nixl-facts.md#network-faults (a DROP is a wedge: no error
within 150 s, TCP backoff after the heal; a REJECT reset is REMOTE_DISCONNECT in ms).

A host target is a host name, a process name (the host it runs on) or ``{source_of: reader}``
(the host of the source that reader is attempting when the fault fires). After a crash,
``mxchaos cleanup`` first removes the run's chains (``partition``'s ``sweep``), then its network
sweep deletes the namespaces and veths, and with them every rule, qdisc and link state.

Each inject returns a token naming exactly what it changed (``Chain``: its place and chain;
``link_down``: the link; ``Qdiscs``: the devices), which its heal undoes. Every command runs
through ``harness.faults.commands`` (the seam the unit tests stub).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, HostView, Injected, commands, register, undo_on_failure
from harness.hosts import netns
from harness.hosts.base import Place
from harness.hosts.netns import QDISC_HANDLE
from harness.record.fault_windows import target_text
from harness.record.witness import Witness
from harness.spec import Duration, Target, custom_error

__all__ = [
    "Chain",
    "LinkDown",
    "LinkDownSpec",
    "Partition",
    "PartitionSpec",
    "Qdiscs",
    "RateLimit",
    "RateSpec",
    "Reject",
    "RejectSpec",
    "chain_name",
    "firewall_hooks",
    "firewall_rules",
    "parse_rate",
]



def chain_name(run_id: str, fault: str) -> str:
    """Our iptables chain for one fault (at most 28 characters): run token + fault hash."""
    return f"{_chain_prefix(run_id)}{hashlib.sha256(fault.encode()).hexdigest()[:6]}"


def _chain_prefix(run_id: str) -> str:
    return f"mxc-{netns.token(run_id)}-"


def _describe(target: Target) -> str:
    return target_text(target) or ""


def _netns_host(ctx: FaultContext, target: Target, kind: str) -> tuple[HostView, Place]:
    """The netns host ``target`` leads to now, and where its fault commands run, as the host
    answers it (its namespace; an ``ssh`` host: its own shell)."""
    host = ctx.locate(target)
    if host.place is None:
        raise FaultError(f"{kind}: {_describe(target)} is on host {host.name} ({host.kind}); it needs a netns host")
    return host, host.place


def _iptables(ns: Place, *args: str, check: bool = True) -> tuple[int, str]:
    rc, out = commands.shell.run(ns, ["iptables", "-w", "5", *args])
    if check and rc != 0:
        raise FaultError(f"iptables {' '.join(args)} in {ns} failed (rc {rc}): {out}")
    return rc, out


def _ns_exists(ns: Place) -> bool:
    """Whether its namespace still exists (an ssh host: whether it is still open for the run)."""
    return ns.remote.connected if ns.remote is not None else ns.name in commands.shell.namespaces()


_HITS = ("DROP", "REJECT")  # the rules that act (the RETURN of resets passes them)


def chain_witness(ns: Place, chain: str) -> Witness:
    """What our chain did: the packets and bytes its DROP / REJECT rules met (``iptables -L -v
    -x``), and how many hooks jump to it. A chain nothing jumps to, or whose rules no packet
    met, had no effect."""
    if not _ns_exists(ns):
        return Witness.unwitnessed(f"{ns} is gone: chain {chain}'s counters cannot be read")
    rc, out = _iptables(ns, "-L", chain, "-v", "-x", "-n", check=False)
    if rc != 0:
        return Witness.unwitnessed(f"iptables -L {chain} failed (rc {rc}): {out[:200]}")
    packets = octets = 0
    refs = 0
    for line in out.splitlines():
        fields = line.split()
        if line.startswith("Chain ") and "references)" in line:
            match = re.search(r"\((\d+) references\)", line)
            refs = int(match[1]) if match else 0
        elif len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit() and fields[2] in _HITS:
            packets, octets = packets + int(fields[0]), octets + int(fields[1])
    figures = {"chain": chain, "packets": packets, "bytes": octets, "hooks": refs}
    if packets:
        return Witness.seen(f"{packets} packets ({octets} bytes) met chain {chain}'s rules", **figures)
    why = "no hook jumps to it" if refs == 0 else "no packet met its rules"
    return Witness.none(f"chain {chain}: 0 packets ({why})", **figures)


def _remove_chain(ns: Place, chain: str) -> bool:
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


class BetweenSpec(FaultSpec):
    """The keys of ``partition`` and ``reject``."""

    reject: ClassVar[bool] = False  # answer (reset / ICMP) instead of dropping
    host_kinds: ClassVar[tuple[str, ...]] = ("netns",)

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

    def host_refs(self) -> tuple[tuple[str, Target], ...]:
        return (("target", self.target), ("peer", self.peer))


class PartitionSpec(BetweenSpec):
    """Drop the traffic between ``target``'s host and ``peer``'s host (``direction`` both, or
    only ``in`` to / ``out`` of the target's host; only packets to or from ``ports`` when
    given): a blackhole, TCP retransmits into the void."""

    kind: Literal["partition"]


class RejectSpec(BetweenSpec):
    """Like ``partition``, but a packet is answered: TCP with a reset, anything else with ICMP
    port-unreachable, *to its sender*. A host that only receives (a reader during a READ)
    learns of it when it next sends: put the rules where that host's packets arrive (``target``
    its peer) to reset it at once."""

    reject: ClassVar[bool] = True
    kind: Literal["reject"]


def firewall_hooks(spec: BetweenSpec) -> list[tuple[str, str]]:
    """(iptables address flag, hook) per direction ``spec`` cuts."""
    return [(flag, hook) for flag, hook, which in (("-s", "INPUT", "in"), ("-d", "OUTPUT", "out"))
            if spec.direction in (which, "both")]


def _matches(spec: BetweenSpec) -> list[list[str]]:
    ports = ",".join(str(p) for p in spec.ports)
    if not ports:
        return [[]]
    return [["-p", proto, "-m", "multiport", "--ports", ports] for proto in ("tcp", "udp")]


def firewall_rules(spec: BetweenSpec, peer: str) -> list[list[str]]:
    """The rules of our chain for traffic with address ``peer``."""
    rules: list[list[str]] = []
    for flag, _hook in firewall_hooks(spec):
        for match in _matches(spec):
            base = [flag, peer, *match]
            if not spec.reject:
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


@dataclass(frozen=True)
class Chain:
    """The iptables chain a partition or reject added (and hooked) in a namespace (or on an ssh host)."""

    place: Place
    chain: str


class _Firewall(Fault[BetweenSpec, Chain]):
    healable = True
    requires = ("root", "netns", "iptables")
    ssh_needs = ("root", "iptables")

    def inject(self, ctx: FaultContext) -> Injected[Chain]:
        spec = self.spec
        if not commands.shell.have("iptables"):
            raise FaultError(f"{self.kind} needs iptables")
        (here, ns), (there, _) = _netns_host(ctx, spec.target, self.kind), _netns_host(ctx, spec.peer, self.kind)
        if here.name == there.name:
            raise FaultError(f"{self.kind}: {_describe(spec.target)} and {_describe(spec.peer)} are both on host {here.name}")
        chain = chain_name(ctx.run_id, self.name)
        rules = firewall_rules(spec, there.address)
        with undo_on_failure() as undo:
            _remove_chain(ns, chain)  # a leftover of an earlier attempt
            undo.callback(_remove_chain, ns, chain)
            _iptables(ns, "-N", chain)
            for rule in rules:
                _iptables(ns, "-A", chain, *rule)
            for _flag, hook in firewall_hooks(spec):
                _iptables(ns, "-I", hook, "1", "-j", chain)
        return Injected(Chain(ns, chain), {
            "host": here.name, "peer_host": there.name, "between": [here.address, there.address],
            "netns": ns.name, "chain": chain, "direction": spec.direction,
            "rules": [" ".join(r) for r in rules], "ports": list(spec.ports)})

    def heal(self, ctx: FaultContext, token: Chain) -> dict[str, Any] | None:
        witness = chain_witness(token.place, token.chain)  # the counters, before the chain goes
        return {"chain": token.chain, "removed": _remove_chain(token.place, token.chain), "witness": witness.to_json()}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        if not (commands.shell.have("iptables") and commands.shell.have("ip")):
            return []
        prefix = _chain_prefix(run_id)
        removed = []
        for name in commands.shell.namespaces():
            if not name.startswith(netns.names_for(run_id).ns_prefix):
                continue
            ns = Place(name)
            _rc, out = _iptables(ns, "-S", check=False)
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

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        return []  # the same chains as partition: swept there


# ---------------------------------------------------------------------------- link_down


class LinkDownSpec(FaultSpec):
    """The host's veth goes down at the bridge (a pulled cable): nothing in or out."""

    host_kinds: ClassVar[tuple[str, ...]] = ("netns",)

    kind: Literal["link_down"]
    target: Target

    def host_refs(self) -> tuple[tuple[str, Target], ...]:
        return (("target", self.target),)


def link_witness(ns: Place | None, link: str) -> Witness:
    """Whether ``link`` is down now (no UP among its flags, ``ip -o link show``)."""
    if ns is not None and not _ns_exists(ns):
        return Witness.unwitnessed(f"{ns} is gone: {link} cannot be read")
    rc, out = commands.shell.run(ns, ["ip", "-o", "link", "show", "dev", link])
    match = re.search(r"<([^>]*)>", out)
    if rc != 0 or match is None:
        return Witness.unwitnessed(f"ip link show dev {link} failed (rc {rc}): {out[:200]}")
    flags = match[1].split(",")
    if "UP" in flags:
        return Witness.none(f"{link} is up ({match[1]})", link=link, flags=match[1])
    return Witness.seen(f"{link} is down ({match[1]})", link=link, flags=match[1])


def _link_up(link: str) -> bool:
    """Set ``link`` up; False when it is gone (its network was deleted)."""
    rc, out = commands.shell.run(None, ["ip", "link", "set", "dev", link, "up"])
    if rc != 0 and "Cannot find device" not in out:
        raise FaultError(f"ip link set dev {link} up failed (rc {rc}): {out}")
    return rc == 0


def _ns_link_up(ns: Place, dev: str) -> bool:
    """Set ``dev`` up inside ``ns`` (an ssh host's data device); False when that host is gone."""
    if not _ns_exists(ns):
        return False
    rc, out = commands.shell.run(ns, ["ip", "link", "set", "dev", dev, "up"])
    if rc != 0:
        raise FaultError(f"ip link set dev {dev} up on {ns} failed (rc {rc}): {out}")
    return True


@register
class LinkDown(Fault[LinkDownSpec, str | tuple[Place, str]]):
    """Token: the bridge-side veth it set down (netns hosts), or (its place, data device) of an
    ssh host, set down on that host (its ssh connection is on another interface)."""

    kind = "link_down"
    ssh_needs = ("root", "ip", "data-device")
    Spec = LinkDownSpec
    healable = True
    requires = ("root", "netns")

    def inject(self, ctx: FaultContext) -> Injected[str | tuple[Place, str]]:
        host, ns = _netns_host(ctx, self.spec.target, self.kind)
        if host.kind == "ssh":
            return self._inject_on_host(host, ns)
        link = host.link
        if link is None:
            raise FaultError(f"{self.kind}: host {host.name} has no veth on the run's bridge")
        with undo_on_failure() as undo:
            undo.callback(_link_up, link)
            rc, out = commands.shell.run(None, ["ip", "link", "set", "dev", link, "down"])
            if rc != 0:
                raise FaultError(f"ip link set dev {link} down failed (rc {rc}): {out}")
        return Injected(link, {"host": host.name, "link": link, "witness": link_witness(None, link).to_json()})

    def _inject_on_host(self, host: HostView, ns: Place) -> Injected[str | tuple[Place, str]]:
        dev = host.inner_link
        if dev is None:
            raise FaultError(f"{self.kind}: ssh host {host.name} has no data device (data.device in the inventory)")
        with undo_on_failure() as undo:
            undo.callback(_ns_link_up, ns, dev)
            rc, out = commands.shell.run(ns, ["ip", "link", "set", "dev", dev, "down"])
            if rc != 0:
                raise FaultError(f"ip link set dev {dev} down on {host.name} failed (rc {rc}): {out}")
        return Injected((ns, dev), {"host": host.name, "link": dev, "on_host": True,
                                    "witness": link_witness(ns, dev).to_json()})

    def heal(self, ctx: FaultContext, token: str | tuple[Place, str]) -> dict[str, Any] | None:
        # measured before it goes up again: was it still down (nothing set it up meanwhile)?
        if isinstance(token, tuple):
            witness = link_witness(*token)
            return {"link": token[1], "up": _ns_link_up(*token), "witness": witness.to_json()}
        witness = link_witness(None, token)
        return {"link": token, "up": _link_up(token), "witness": witness.to_json()}

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

    host_kinds: ClassVar[tuple[str, ...]] = ("netns",)

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

    def host_refs(self) -> tuple[tuple[str, Target], ...]:
        return (("target", self.target),)


def _tc(ns: Place | None, *args: str) -> tuple[int, str]:
    """``tc ARGS`` in namespace ``ns`` (None: the root namespace, for the bridge end of a veth)."""
    return commands.shell.run(ns, ["tc", *args])


def _ours(ns: Place | None, dev: str) -> bool:
    rc, out = _tc(ns, "qdisc", "show", "dev", dev)
    return rc == 0 and f"qdisc tbf {QDISC_HANDLE}" in out


def _remove_qdisc(ns: Place | None, dev: str) -> bool:
    """Delete our qdisc on ``dev``; False when it is not there (or its namespace is gone)."""
    if ns is not None and not _ns_exists(ns):
        return False
    if not _ours(ns, dev):
        return False
    rc, out = _tc(ns, "qdisc", "del", "dev", dev, "root", "handle", QDISC_HANDLE)
    if rc != 0 and _ours(ns, dev):
        raise FaultError(f"tc qdisc del dev {dev} ({ns or 'bridge side'}) failed (rc {rc}): {out}")
    return True


_TBF_STATS = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


def qdisc_witness(devices: tuple[tuple[Place | None, str], ...]) -> Witness:
    """What our tbf qdiscs held back (``tc -s qdisc show``): the bytes they sent, and the packets
    they made wait (overlimits) or dropped. A limit no packet ever exceeded had no effect."""
    sent = held = dropped = 0
    read: list[str] = []
    for ns, dev in devices:
        if ns is not None and not _ns_exists(ns):
            continue
        rc, out = _tc(ns, "-s", "qdisc", "show", "dev", dev)
        ours = out[out.find(f"qdisc tbf {QDISC_HANDLE}"):] if f"qdisc tbf {QDISC_HANDLE}" in out else ""
        match = _TBF_STATS.search(ours)
        if rc != 0 or match is None:
            continue
        sent, dropped, held = sent + int(match[1]), dropped + int(match[3]), held + int(match[4])
        read.append(_where(ns, dev))
    if not read:
        return Witness.unwitnessed("no qdisc of ours could be read (its namespace is gone?)")
    figures = {"sent_bytes": sent, "overlimits": held, "dropped": dropped, "devices": read}
    if held or dropped:
        return Witness.seen(f"{held} packets over the limit, {dropped} dropped ({sent} bytes sent)", **figures)
    return Witness.none(f"no packet over the limit ({sent} bytes sent under it)", **figures)


def _where(ns: Place | None, dev: str) -> str:
    return f"{ns.name if ns is not None else 'root'}:{dev}"


@dataclass(frozen=True)
class Qdiscs:
    """The devices a rate fault put our tbf qdisc on: (namespace or None for the root one, device)."""

    devices: tuple[tuple[Place | None, str], ...]


@register
class RateLimit(Fault[RateSpec, Qdiscs]):
    kind = "rate"
    ssh_needs = ("root", "tc", "data-device")
    Spec = RateSpec
    healable = True
    requires = ("root", "netns", "tc")

    def inject(self, ctx: FaultContext) -> Injected[Qdiscs]:
        spec = self.spec
        host, ns = _netns_host(ctx, spec.target, self.kind)
        bits = parse_rate(spec.rate)
        burst = spec.burst or max(16384, int(bits / 8 * 0.02))
        devices: list[tuple[Place | None, str]] = []
        if spec.direction in ("egress", "both"):
            if host.inner_link is None:
                raise FaultError(f"{self.kind}: host {host.name} has no veth in its namespace")
            devices.append((ns, host.inner_link))
        if spec.direction in ("ingress", "both"):
            if host.link is None:
                raise FaultError(f"{self.kind}: host {host.name} has no veth on the run's bridge")
            devices.append((None, host.link))
        with undo_on_failure() as undo:
            for dev_ns, dev in devices:
                undo.callback(_remove_qdisc, dev_ns, dev)
                rc, out = _tc(dev_ns, "qdisc", "replace", "dev", dev, "root", "handle", QDISC_HANDLE, "tbf",
                              "rate", spec.rate, "burst", str(burst), "latency", f"{int(spec.latency * 1000)}ms")
                if rc != 0:
                    raise FaultError(f"tc qdisc replace dev {dev} ({dev_ns or 'bridge side'}) failed (rc {rc}): {out}")
        return Injected(Qdiscs(tuple(devices)), {
            "host": host.name, "rate": spec.rate, "bits_per_s": bits, "burst": burst,
            "devices": [_where(dev_ns, dev) for dev_ns, dev in devices]})

    def heal(self, ctx: FaultContext, token: Qdiscs) -> dict[str, Any] | None:
        witness = qdisc_witness(token.devices)  # the counters, before the qdiscs go
        return {"removed": [_where(ns, dev) for ns, dev in token.devices if _remove_qdisc(ns, dev)],
                "witness": witness.to_json()}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        return []  # our qdiscs live on the run's veths, which the network sweep deletes
