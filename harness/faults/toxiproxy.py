"""Control-plane faults through the run's toxiproxy server: ``toxic`` and ``proxy_down``.

A scenario's ``proxies`` put a toxiproxy proxy in front of a server's gRPC endpoint, and a
source or reader with ``server_via: PROXY`` reaches its server through it (the runner starts
one toxiproxy server per run and creates the proxies; see ``harness/README.md``, Proxies).
These faults change one proxy through toxiproxy's HTTP API, reached with
``ctx.proxy(name)``; the data plane (NIXL/UCX) never goes through a proxy.

- ``toxic`` adds one toxic (``type``, ``stream``, ``toxicity``, ``attributes``) to the proxy;
  heal removes it (a toxic already gone is fine). ``toxicity`` is the share of connections
  it affects (toxiproxy picks per connection).
- ``proxy_down`` disables the proxy: its listener closes, so new connections are refused
  and open ones are cut; heal enables it again (same port).

Attributes per toxic type (toxiproxy 2.5; units in brackets; times in milliseconds also
take a duration such as ``500ms`` or ``2s``). The server silently ignores an attribute it
does not know, so a typo would be a toxic that does nothing: here it is a validation error.

    latency     latency [ms] (required), jitter [ms]
    bandwidth   rate [KB/s] (required)
    slow_close  delay [ms] (required)
    timeout     timeout [ms] (required; 0: hold the connection and drop its data until healed,
                else close it after that long)
    reset_peer  timeout [ms] (reset the connection after that long; 0: at once)
    slicer      average_size [bytes] (required), size_variation [bytes], delay [us]
    limit_data  bytes [bytes] (required; close the connection after that many bytes)

``sweep(run_id)`` deletes the proxies named after a crashed run from its toxiproxy server
when that server still answers (``mxchaos cleanup`` kills the server itself anyway).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, register
from harness.ledger import recorded_toxiproxy_api
from harness.spec import Name, custom_error, parse_duration
from harness.toxiproxy import ToxiproxyAPI, ToxiproxyError, proxy_prefix

__all__ = ["TOXIC_ATTRIBUTES", "ProxyDown", "Toxic", "ToxicType"]

ToxicType = Literal["latency", "bandwidth", "slow_close", "timeout", "slicer", "limit_data", "reset_peer"]


@dataclass(frozen=True)
class Attribute:
    unit: Literal["ms", "KB/s", "bytes", "us"]
    required: bool = False


TOXIC_ATTRIBUTES: dict[str, dict[str, Attribute]] = {
    "latency": {"latency": Attribute("ms", True), "jitter": Attribute("ms")},
    "bandwidth": {"rate": Attribute("KB/s", True)},
    "slow_close": {"delay": Attribute("ms", True)},
    "timeout": {"timeout": Attribute("ms", True)},
    "reset_peer": {"timeout": Attribute("ms")},
    "slicer": {"average_size": Attribute("bytes", True), "size_variation": Attribute("bytes"), "delay": Attribute("us")},
    "limit_data": {"bytes": Attribute("bytes", True)},
}


def _describe(kind: str) -> str:
    return ", ".join(
        f"{name} [{a.unit}{', required' if a.required else ''}]" for name, a in TOXIC_ATTRIBUTES[kind].items()
    )


def _attribute_value(kind: str, name: str, attr: Attribute, value: Any) -> int:
    """A whole number >= 0 in the attribute's unit; a duration string for milliseconds."""
    if isinstance(value, bool):
        value = None  # not a number: falls through to the error
    elif attr.unit == "ms" and isinstance(value, str):
        try:
            ms = parse_duration(value) * 1000.0
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and abs(ms - round(ms)) < 1e-6:
            return int(round(ms))
    elif isinstance(value, int) and value >= 0:
        return value
    elif isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    rule = "a whole number of milliseconds >= 0, or a duration like 500ms, 2s" if attr.unit == "ms" else (
        f"a whole number >= 0 ({attr.unit})"
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


class ProxyDownSpec(FaultSpec):
    """Disable ``proxy``: connections through it are refused (open ones cut); heal enables it."""

    kind: Literal["proxy_down"]
    proxy: Name


class _ProxyFault(Fault):
    """A fault on one proxy of the run's toxiproxy server."""

    healable: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ("toxiproxy",)

    def __init__(self, spec: FaultSpec, name: str) -> None:
        super().__init__(spec, name)
        self._api: ToxiproxyAPI | None = None
        self._proxy: str | None = None  # its toxiproxy-side name

    def _connect(self, ctx: FaultContext) -> tuple[ToxiproxyAPI, str]:
        view = ctx.proxy(self.spec.proxy)  # type: ignore[attr-defined]
        self._api, self._proxy = ToxiproxyAPI(view.api), view.proxy
        return self._api, self._proxy

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
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
class Toxic(_ProxyFault):
    kind = "toxic"
    Spec = ToxicSpec

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: ToxicSpec = self.spec  # type: ignore[assignment]
        api, proxy = self._connect(ctx)
        body = {
            "name": self.name,
            "type": spec.type,
            "stream": spec.stream,
            "toxicity": spec.toxicity,
            "attributes": dict(spec.attributes),
        }
        try:
            created = api.add_toxic(proxy, body)
        except ToxiproxyError as exc:
            raise FaultError(f"toxic {self.name} on proxy {spec.proxy}: {exc}") from None
        return {
            "proxy": spec.proxy,
            "toxiproxy_name": proxy,
            "toxic": self.name,
            "type": spec.type,
            "stream": spec.stream,
            "toxicity": spec.toxicity,
            "attributes": created.get("attributes", body["attributes"]),
        }

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        if self._api is None or self._proxy is None:
            return None
        removed = self._api.remove_toxic(self._proxy, self.name)
        return {"proxy": self.spec.proxy, "toxic": self.name, "removed": removed}  # type: ignore[attr-defined]


@register
class ProxyDown(_ProxyFault):
    kind = "proxy_down"
    Spec = ProxyDownSpec

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: ProxyDownSpec = self.spec  # type: ignore[assignment]
        api, proxy = self._connect(ctx)
        try:
            api.update_proxy(proxy, enabled=False)
        except ToxiproxyError as exc:
            raise FaultError(f"proxy_down {spec.proxy}: {exc}") from None
        return {"proxy": spec.proxy, "toxiproxy_name": proxy, "enabled": False}

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        if self._api is None or self._proxy is None:
            return None
        try:
            info = self._api.update_proxy(self._proxy, enabled=True)
        except ToxiproxyError as exc:
            if exc.status == 404:
                return {"proxy": self.spec.proxy, "gone": True}  # type: ignore[attr-defined]
            raise
        return {"proxy": self.spec.proxy, "enabled": info.get("enabled"), "listen": info.get("listen")}  # type: ignore[attr-defined]
