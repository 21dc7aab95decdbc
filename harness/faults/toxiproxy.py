"""Control-plane faults through the run's toxiproxy server: ``toxic`` and ``proxy_down``.

A scenario's ``proxies`` put a toxiproxy proxy in front of a server's gRPC endpoint, and a
source or reader with ``server_via: PROXY`` reaches its server through it (the runner starts
one toxiproxy server per run and creates the proxies; see ``harness/README.md``, Proxies).
These faults change one proxy through toxiproxy's HTTP API, reached with
``ctx.proxy(name)``; the data plane (NIXL/UCX) never goes through a proxy.

- ``toxic`` adds one toxic (``type``, ``stream``, ``toxicity``, ``attributes``) to the proxy;
  heal removes it (a toxic already gone is fine). ``toxicity`` is the share of connections
  it affects (toxiproxy picks per connection). Its witness is two: at inject its effect, read
  back from toxiproxy and probed through the proxy (``harness.faults._toxic_effect``), and at
  heal its clients' traffic through the proxy while it held (``toxic_witness``).
- ``proxy_down`` disables the proxy: its listener closes, so new connections are refused
  and open ones are cut; heal enables it again (same port). Its witness counts both: the
  connections open through the proxy as it went down (``ss``) and the SYNs that met its
  closed listener while down, counted by a chain of ours in this machine's INPUT
  (``mxc-<token>-<hash>``, one rule that only counts and lets every packet on; removed at
  heal, swept by ``mxchaos cleanup``). Without root or iptables the refusals go uncounted: a
  proxy no connection was open through is then "not witnessed", saying why.

Attributes per toxic type (toxiproxy 2.5; units in brackets; times in milliseconds also
take a duration such as ``500ms`` or ``2s``). The server silently ignores an attribute it
does not know, so a typo would be a toxic that does nothing: here it is a validation error.

    latency     latency [ms] (required), jitter [ms]
    bandwidth   rate [KB/s] (required; 0: toxiproxy passes nothing on until healed)
    slow_close  delay [ms] (required)
    timeout     timeout [ms] (required; 0: hold the connection and drop its data until healed,
                else close it after that long)
    reset_peer  timeout [ms] (reset the connection after that long; 0: at once)
    slicer      average_size [bytes] (required, >= 1: toxiproxy 2.5 recurses without end on 0),
                size_variation [bytes], delay [us]
    limit_data  bytes [bytes] (required; close the connection after that many bytes)

``sweep(run_id)`` deletes the proxies named after a crashed run from its toxiproxy server
when that server still answers (``mxchaos cleanup`` kills the server itself anyway).
"""

from __future__ import annotations

import difflib
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, ProxyView, commands, register, undo_on_failure
from harness.faults._toxic_effect import baseline, plan, probe, toxic_effect
from harness.faults.netns import chain_name
from harness.hosts import netns as netns_hosts
from harness.machine.ledger import recorded_toxiproxy_api
from harness.record.witness import Witness
from harness.scrape import sample_value, scrape
from harness.spec import Name, custom_error, parse_duration
from harness.toxiproxy import API_TIMEOUT_S, ToxiproxyAPI, ToxiproxyError, proxy_prefix

__all__ = ["TOXIC_ATTRIBUTES", "AddedToxic", "DisabledProxy", "ProxyDown", "ProxyDownSpec", "Toxic", "ToxicSpec", "ToxicType"]

ToxicType = Literal["latency", "bandwidth", "slow_close", "timeout", "slicer", "limit_data", "reset_peer"]


@dataclass(frozen=True)
class Attribute:
    unit: Literal["ms", "KB/s", "bytes", "us"]
    required: bool = False
    least: int = 0  # the smallest value toxiproxy handles


TOXIC_ATTRIBUTES: dict[str, dict[str, Attribute]] = {
    "latency": {"latency": Attribute("ms", True), "jitter": Attribute("ms")},
    "bandwidth": {"rate": Attribute("KB/s", True)},
    "slow_close": {"delay": Attribute("ms", True)},
    "timeout": {"timeout": Attribute("ms", True)},
    "reset_peer": {"timeout": Attribute("ms")},
    "slicer": {"average_size": Attribute("bytes", True, least=1), "size_variation": Attribute("bytes"), "delay": Attribute("us")},
    "limit_data": {"bytes": Attribute("bytes", True)},
}


def _describe(kind: str) -> str:
    return ", ".join(
        f"{name} [{a.unit}{', required' if a.required else ''}]" for name, a in TOXIC_ATTRIBUTES[kind].items()
    )


def _attribute_value(kind: str, name: str, attr: Attribute, value: Any) -> int:
    """A whole number >= the attribute's ``least`` in its unit; a duration string for milliseconds."""
    if isinstance(value, bool):
        value = None  # not a number: falls through to the error
    elif attr.unit == "ms" and isinstance(value, str):
        try:
            ms = parse_duration(value) * 1000.0
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and abs(ms - round(ms)) < 1e-6:
            return round(ms)
    elif isinstance(value, int) and value >= attr.least:
        return value
    elif isinstance(value, float) and value >= attr.least and value.is_integer():
        return int(value)
    rule = "a whole number of milliseconds >= 0, or a duration like 500ms, 2s" if attr.unit == "ms" else (
        f"a whole number >= {attr.least} ({attr.unit})"
    )
    raise custom_error("toxic_attribute", f"{kind} toxic: {name!r} must be {rule} (got {value!r})")


class ToxicSpec(FaultSpec):
    """Add a toxic to ``proxy`` (a scenario proxy); heal removes it."""

    kind: Literal["toxic"]
    proxy: Name
    type: ToxicType
    stream: Literal["upstream", "downstream"] = "downstream"  # downstream: server -> client
    toxicity: float = Field(1.0, ge=0.0, le=1.0)
    attributes: dict[str, int] = Field(default_factory=dict)

    @field_validator("attributes", mode="before")
    @classmethod
    def _attributes_of_the_type(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("type")
        if kind not in TOXIC_ATTRIBUTES or not isinstance(value, dict):
            return value  # the type's own error is reported; or not a mapping: pydantic says so
        known = TOXIC_ATTRIBUTES[kind]
        out: dict[str, int] = {}
        for name, raw in value.items():
            if name not in known:
                close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise custom_error(
                    "toxic_attribute", f"{name!r} is not an attribute of a {kind} toxic{hint} (attributes: {_describe(kind)})"
                )
            out[str(name)] = _attribute_value(kind, str(name), known[name], raw)
        missing = [name for name, attr in known.items() if attr.required and name not in out]
        if missing:
            raise custom_error(
                "toxic_attribute", f"a {kind} toxic needs {', '.join(map(repr, missing))} (attributes: {_describe(kind)})"
            )
        return out

    def proxy_refs(self) -> tuple[str, ...]:
        return (self.proxy,)


class ProxyDownSpec(FaultSpec):
    """Disable ``proxy``: connections through it are refused (open ones cut); heal enables it."""

    kind: Literal["proxy_down"]
    proxy: Name

    def proxy_refs(self) -> tuple[str, ...]:
        return (self.proxy,)


@dataclass(frozen=True)
class Traffic:
    """What went through a proxy by a moment: bytes of closed connections, open connections."""

    closed_bytes: int | None
    open: int | None

    @classmethod
    def now(cls, api: str, toxiproxy_name: str, stream: str, listen: str) -> Traffic:
        return cls(stream_bytes(api, toxiproxy_name, stream), connections(listen))


@dataclass(frozen=True)
class AddedToxic:
    """A toxic a ``toxic`` fault added: heal removes it from that proxy of that server."""

    api: str  # the toxiproxy API, http://127.0.0.1:PORT
    proxy: str  # the scenario's name for the proxy
    toxiproxy_name: str  # its name in toxiproxy
    toxic: str
    stream: str = "downstream"
    listen: str = ""  # where its clients connect
    traffic: Traffic = Traffic(None, None)  # what had gone through the proxy when the toxic went in


@dataclass(frozen=True)
class DisabledProxy:
    """A proxy a ``proxy_down`` fault disabled: heal enables it again. ``cut``: the connections
    open through it when it went down (None: not counted); ``counter``: the chain counting the
    SYNs its closed listener refused meanwhile (None: none could be added here); ``listening``:
    whether its listener still accepted connections once it was down (None: not read)."""

    api: str
    proxy: str
    toxiproxy_name: str
    listen: str = ""
    cut: int | None = None
    counter: str | None = None
    listening: bool | None = None


SETTLE_S = 2.0  # how long a toxic's inject waits for toxiproxy to count its probe's connection
RECEIVED = "toxiproxy_proxy_received_bytes_total"  # toxiproxy-server -proxy-metrics, per proxy and direction


def stream_bytes(api: str, toxiproxy_name: str, stream: str) -> int | None:
    """The bytes proxy ``toxiproxy_name`` has received on ``stream`` (upstream: client -> server,
    downstream: server -> client) over the connections that have *closed* so far (toxiproxy adds
    a connection's bytes when it ends), from its server's ``/metrics``; None when they cannot be
    read (its server is gone). The run's server runs with ``-proxy-metrics``: a proxy without a
    sample has carried no byte that way yet."""
    try:
        samples = scrape(f"{api}/metrics", API_TIMEOUT_S)
    except (OSError, ValueError):
        return None
    value = sample_value(samples, RECEIVED, {"proxy": toxiproxy_name, "direction": stream})
    return 0 if value is None else int(value)


def connections(listen: str) -> int | None:
    """Established TCP connections to the proxy's listener (``ss``, this machine: the run's
    toxiproxy server is local); None when they cannot be counted."""
    port = listen.rpartition(":")[2]
    if not port.isdigit() or not commands.shell.have("ss"):
        return None
    rc, out = commands.shell.run(None, ["ss", "-tnH", "state", "established", f"( sport = :{port} )"])
    return len([line for line in out.splitlines() if line.strip()]) if rc == 0 else None


def listening(listen: str, within: float = 1.0) -> bool | None:
    """Whether something still listens on the proxy's port (``ss -ltnH``), asked until it closes
    or ``within`` seconds pass (the disable returns as the listener closes); None when it cannot
    be read."""
    port = listen.rpartition(":")[2]
    if not port.isdigit() or not commands.shell.have("ss"):
        return None
    deadline = time.monotonic() + within
    while True:
        rc, out = commands.shell.run(None, ["ss", "-ltnH", f"( sport = :{port} )"])
        if rc != 0:
            return None
        if not out.strip() or time.monotonic() >= deadline:
            return bool(out.strip())
        time.sleep(0.05)


def toxic_witness(token: AddedToxic, at_heal: Traffic) -> Witness:
    """Whether anything went through the toxic's proxy while it was in place: a connection open
    at its inject or its heal (a gRPC channel stays open), or bytes of one that closed meanwhile."""
    before = token.traffic
    moved = (None if before.closed_bytes is None or at_heal.closed_bytes is None
             else at_heal.closed_bytes - before.closed_bytes)
    opened = [n for n in (before.open, at_heal.open) if n is not None]
    if moved is None and not opened:
        return Witness.unwitnessed(f"proxy {token.proxy}'s traffic could not be read (toxiproxy /metrics, ss)")
    figures = {"stream": token.stream, "closed_bytes": moved, "open_at_inject": before.open, "open_at_heal": at_heal.open}
    if moved or any(opened):
        return Witness.seen(f"proxy {token.proxy}: {before.open} connections open at inject, {at_heal.open} at heal, "
                            f"{moved} bytes {token.stream} on connections closed meanwhile", **figures)
    return Witness.none(f"no connection through proxy {token.proxy} while it held", **figures)


# ---------------------------------------------------------------- proxy_down's witness: SYNs refused

def _refusal_rule(listen: str) -> list[str] | None:
    """The rule matching a connection's first packet (a SYN) to ``listen`` (``ADDR:PORT``)."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not host:
        return None
    return ["-d", host.strip("[]"), "-p", "tcp", "--dport", port, "--tcp-flags", "SYN,ACK,RST", "SYN", "-j", "RETURN"]


def add_refusal_counter(chain: str, listen: str) -> str | None:
    """A chain of ours in this machine's INPUT (where a SYN to the proxy's listener arrives,
    from this machine over lo or from a run's namespace over its bridge) holding one rule that
    only counts the SYNs to ``listen`` and lets every packet on; None when it cannot be added
    (no root or no iptables: the refusals go uncounted)."""
    rule = _refusal_rule(listen)
    if rule is None or not commands.shell.have("iptables"):
        return None
    remove_refusal_counter(chain)  # a leftover of an earlier attempt
    for argv in (["-N", chain], ["-A", chain, *rule], ["-I", "INPUT", "1", "-j", chain]):
        rc, _out = commands.shell.run(None, ["iptables", "-w", "5", *argv])
        if rc != 0:
            remove_refusal_counter(chain)
            return None
    return chain


def refused_syns(chain: str) -> int | None:
    """The SYNs ``chain``'s rule counted; None when it cannot be read."""
    rc, out = commands.shell.run(None, ["iptables", "-w", "5", "-L", chain, "-v", "-x", "-n"])
    if rc != 0:
        return None
    counts = [int(f[0]) for f in (line.split() for line in out.splitlines()) if len(f) > 2 and f[0].isdigit()
              and f[2] == "RETURN"]
    return sum(counts) if counts else None


def remove_refusal_counter(chain: str) -> bool:
    """Unhook ``chain`` from INPUT and delete it; False when it did not exist."""
    if commands.shell.run(None, ["iptables", "-w", "5", "-S", chain])[0] != 0:
        return False
    for _ in range(16):  # bounded: each pass removes one jump
        if commands.shell.run(None, ["iptables", "-w", "5", "-D", "INPUT", "-j", chain])[0] != 0:
            break
    commands.shell.run(None, ["iptables", "-w", "5", "-F", chain])
    commands.shell.run(None, ["iptables", "-w", "5", "-X", chain])
    return True


def down_witness(token: DisabledProxy, refused: int | None) -> Witness:
    """What a disabled proxy did: the connections open through it that its going down cut, and
    the connection attempts (SYNs) its closed listener refused while it was down."""
    figures = {"cut": token.cut, "refused_syns": refused}
    said = f"proxy {token.proxy}: {token.cut} connections cut as it went down, {refused} SYNs refused while down"
    if token.listening:  # nothing was cut or refused: the proxy did not go down
        return Witness.none(f"proxy {token.proxy}: its listener {token.listen} still accepted connections "
                            "once it was down", **figures, listening=True)
    if token.cut or refused:
        return Witness.seen(said, **figures)
    if refused is None:
        why = "no root or no iptables here" if token.counter is None else "its counting chain could not be read"
        return Witness.unwitnessed(f"{said} (the refusals could not be counted: {why})", **figures)
    return Witness.none(f"{said}: nothing tried it while it was down", **figures)


def _sweep(run_id: str) -> list[str]:
    """Delete the proxies named after ``run_id`` from its recorded toxiproxy server."""
    url = recorded_toxiproxy_api(run_id)
    if url is None:
        return []
    api = ToxiproxyAPI(url, timeout=2.0)
    try:
        names = [n for n in api.proxies() if n.startswith(proxy_prefix(run_id))]
    except ToxiproxyError:
        return []  # its server is gone, and its proxies with it
    removed = []
    for name in names:
        try:
            if api.delete_proxy(name):
                removed.append(f"toxiproxy proxy {name} at {url}")
        except ToxiproxyError:
            continue
    return removed


@register
class Toxic(Fault[ToxicSpec, AddedToxic]):
    kind = "toxic"
    Spec = ToxicSpec
    healable = True
    requires = ("toxiproxy",)
    no_ssh_lever = "toxiproxy runs on the harness, not reachable from ssh hosts yet"

    def inject(self, ctx: FaultContext) -> Injected[AddedToxic]:
        spec = self.spec
        view = ctx.proxy(spec.proxy)
        api = ToxiproxyAPI(view.api)
        before = Traffic.now(view.api, view.proxy, spec.stream, view.listen)
        body = {
            "name": self.name,
            "type": spec.type,
            "stream": spec.stream,
            "toxicity": spec.toxicity,
            "attributes": dict(spec.attributes),
        }
        with undo_on_failure() as undo:
            undo.callback(api.remove_toxic, view.proxy, self.name)  # 404-tolerant
            try:
                created = api.add_toxic(view.proxy, body)
            except ToxiproxyError as exc:
                if exc.status is not None:
                    undo.pop_all()  # the server answered no: nothing was added (the name may be another's)
                raise FaultError(f"toxic {self.name} on proxy {spec.proxy}: {exc}") from None
            witness, before = self._effect(api, view, before)
        token = AddedToxic(view.api, spec.proxy, view.proxy, self.name, spec.stream, view.listen, before)
        return Injected(token, {
            "proxy": spec.proxy,
            "toxiproxy_name": view.proxy,
            "toxic": self.name,
            "type": spec.type,
            "stream": spec.stream,
            "toxicity": spec.toxicity,
            "attributes": created.get("attributes", body["attributes"]),
            "witness": witness.to_json(),
        })

    def _effect(self, api: ToxiproxyAPI, view: ProxyView, before: Traffic) -> tuple[Witness, Traffic]:
        """The toxic's effect (``harness.faults._toxic_effect``): read back from toxiproxy, and
        probed straight to the upstream and through the proxy. The probe's own connection is
        no client's traffic: the traffic the heal compares with is read once it has closed and
        toxiproxy has counted its bytes (bounded), the open connections as they were before it."""
        spec = self.spec
        try:
            toxics: list[dict[str, Any]] | None = api.toxics(view.proxy)
        except ToxiproxyError:
            toxics = None
        how = plan(spec.type, spec.stream, spec.attributes)
        if how.skip:
            return toxic_effect(spec.proxy, self.name, how, toxics, None, None), before
        counted = stream_bytes(view.api, view.proxy, spec.stream)
        direct = baseline(view.upstream, how)
        if not direct.answered:  # not a gRPC server: nothing to compare a probe through the proxy with
            return toxic_effect(spec.proxy, self.name, how, toxics, direct, None), before
        through = probe(view.listen, direct.seconds + how.bound, how.load)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            now = stream_bytes(view.api, view.proxy, spec.stream)
            open_now = connections(view.listen)
            if now != counted and (open_now is None or before.open is None or open_now <= before.open):
                break
            time.sleep(0.05)
        after = Traffic(stream_bytes(view.api, view.proxy, spec.stream), before.open)
        return toxic_effect(spec.proxy, self.name, how, toxics, direct, through), after

    def heal(self, ctx: FaultContext, token: AddedToxic) -> dict[str, Any] | None:
        witness = toxic_witness(token, Traffic.now(token.api, token.toxiproxy_name, token.stream, token.listen))
        removed = ToxiproxyAPI(token.api).remove_toxic(token.toxiproxy_name, token.toxic)
        return {"proxy": token.proxy, "toxic": token.toxic, "removed": removed, "witness": witness.to_json()}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        return _sweep(run_id)


def _enable(api: str, proxy: str, toxiproxy_name: str) -> dict[str, Any]:
    try:
        info = ToxiproxyAPI(api).update_proxy(toxiproxy_name, enabled=True)
    except ToxiproxyError as exc:
        if exc.status == 404:
            return {"proxy": proxy, "gone": True}
        raise
    return {"proxy": proxy, "enabled": info.get("enabled"), "listen": info.get("listen")}


@register
class ProxyDown(Fault[ProxyDownSpec, DisabledProxy]):
    kind = "proxy_down"
    Spec = ProxyDownSpec
    healable = True
    requires = ("toxiproxy",)
    no_ssh_lever = "toxiproxy runs on the harness, not reachable from ssh hosts yet"

    def inject(self, ctx: FaultContext) -> Injected[DisabledProxy]:
        spec = self.spec
        view = ctx.proxy(spec.proxy)
        cut = connections(view.listen)  # open now: going down cuts them
        chain = chain_name(ctx.run_id, self.name)
        with undo_on_failure() as undo:
            undo.callback(remove_refusal_counter, chain)
            counter = add_refusal_counter(chain, view.listen)
            undo.callback(_enable, view.api, spec.proxy, view.proxy)
            try:
                ToxiproxyAPI(view.api).update_proxy(view.proxy, enabled=False)
            except ToxiproxyError as exc:
                if exc.status is not None:  # the server answered no: nothing was changed
                    undo.pop_all()
                    remove_refusal_counter(chain)
                raise FaultError(f"proxy_down {spec.proxy}: {exc}") from None
        token = DisabledProxy(view.api, spec.proxy, view.proxy, view.listen, cut, counter, listening(view.listen))
        return Injected(token, {"proxy": spec.proxy, "toxiproxy_name": view.proxy, "enabled": False, "cut": cut,
                                "counter": counter})

    def heal(self, ctx: FaultContext, token: DisabledProxy) -> dict[str, Any] | None:
        # counted before the listener opens again: every SYN until now met a closed port
        refused = refused_syns(token.counter) if token.counter else None
        witness = down_witness(token, refused)
        if token.counter:
            remove_refusal_counter(token.counter)
        return {**_enable(token.api, token.proxy, token.toxiproxy_name), "witness": witness.to_json()}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        # the proxies are toxic's to sweep; the chains counting refusals are this kind's
        if not commands.shell.have("iptables"):
            return []
        prefix = f"mxc-{netns_hosts.token(run_id)}-"  # chain_name's, without its fault's hash
        rc, out = commands.shell.run(None, ["iptables", "-w", "5", "-S"])
        chains = sorted({line.split()[1] for line in out.splitlines()
                         if rc == 0 and line.startswith("-N ") and line.split()[1].startswith(prefix)})
        return [f"iptables chain {chain}" for chain in chains if remove_refusal_counter(chain)]
