"""The ``toxic`` fault's witness of effect, measured by the harness, never by the subject.

Two measurements, taken at the inject once the toxic is in:

- **read back**: the proxy's toxics as toxiproxy lists them (``GET /proxies/NAME/toxics``). A toxic
  it does not list, or lists with toxicity 0, applies to no connection: no effect.
- **a probe**: on a fresh connection of the harness's own, an HTTP/2 client preface with an
  empty SETTINGS frame, and the wait for the server's acknowledgement (what every gRPC server
  answers at once), timed straight to the proxy's upstream and then through the proxy. Its round trip crosses both streams, so a ``latency``
  toxic shows as added delay (seen when at least half its ``latency - jitter``), and a
  ``timeout`` toxic as a probe held (no answer within ``HELD_S``) or cut (its connection closed) while the
  upstream answered it directly. Where the toxic is listed with toxicity 1 and the probe shows
  nothing, the toxic did nothing: no effect. Below toxicity 1 the probe's connection may be one
  toxiproxy spared, so a probe showing nothing says nothing (not witnessed).

Other toxic types (bandwidth, slicer, slow_close, reset_peer, limit_data) are not probed: a
small call's round trip does not show them; their witness is the read back and the traffic
through the proxy while the toxic held (``harness.faults.toxiproxy.toxic_witness``). An upstream
that does not answer the probe directly (not a gRPC server: a redis) is not probed through the
proxy, and leaves the probe unwitnessed (its read back still counts).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.record.witness import Witness

__all__ = ["HELD_S", "PROBED", "Probe", "probe", "probe_bound", "toxic_effect"]

# an HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server answers the
# SETTINGS with a SETTINGS frame flagged ACK, a round trip through both streams
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
_SETTINGS, _ACK, _LAST_TYPE = 4, 1, 9
PROBED = ("latency", "timeout")
HELD_S = 1.0  # a timeout toxic's probe: no answer within this long is a held connection


@dataclass(frozen=True)
class Probe:
    """One timed round trip to ``address``: how long it took and how it ended: ``ACK`` (the
    server acknowledged the probe's SETTINGS), ``TIMEOUT`` (no acknowledgement within the
    bound), ``CLOSED`` / ``RESET`` (the connection ended first), ``REFUSED`` (no connection),
    ``NOT_HTTP2`` (what came back is no HTTP/2 frame: not a gRPC server)."""

    address: str
    seconds: float
    code: str

    @property
    def answered(self) -> bool:
        return self.code == "ACK"


def _acknowledged(buf: bytes) -> tuple[str | None, bytes]:
    """Read the complete HTTP/2 frames at the start of ``buf``: ``ACK`` once a SETTINGS
    acknowledgement is among them, ``NOT_HTTP2`` at a frame type HTTP/2 does not have, else
    None and what is left to read."""
    while len(buf) >= 9:
        length, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
        if kind > _LAST_TYPE:
            return "NOT_HTTP2", b""
        if len(buf) < 9 + length:
            break
        if kind == _SETTINGS and flags & _ACK:
            return "ACK", b""
        buf = buf[9 + length:]
    return None, buf


def probe(address: str, bound: float) -> Probe:
    """Open a connection to ``address`` (``HOST:PORT``), send ``PREFACE`` and wait at most
    ``bound`` seconds for its acknowledgement; the connection is closed before this returns
    (a socket of the harness's own, so nothing of it lingers in the proxy's counts)."""
    host, _, port = address.rpartition(":")
    start = time.monotonic()
    deadline = start + bound

    def ended(code: str) -> Probe:
        return Probe(address, round(time.monotonic() - start, 4), code)

    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=bound)
    except (OSError, ValueError):
        return ended("REFUSED")
    with sock:
        buf = b""
        try:
            sock.sendall(PREFACE)
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    return ended("CLOSED")
                code, buf = _acknowledged(buf + chunk)
                if code is not None:
                    return ended(code)
        except TimeoutError:
            pass
        except OSError:
            return ended("RESET")
        return ended("TIMEOUT")


def probe_bound(kind: str, attributes: Mapping[str, int]) -> float:
    """How long the probe through the proxy may wait: a held call's ``HELD_S``, or three times
    the toxic's latency (the connection's setup and the call each cross it) and 2 s."""
    if kind == "timeout":
        return HELD_S
    return 3 * (attributes.get("latency", 0) + attributes.get("jitter", 0)) / 1000.0 + 2.0


def _listed(toxics: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    return next((t for t in toxics or [] if isinstance(t, dict) and t.get("name") == name), None)


def toxic_effect(proxy: str, name: str, kind: str, attributes: Mapping[str, int], toxics: list[dict[str, Any]] | None,
                 direct: Probe | None, through: Probe | None) -> Witness:
    """What toxic ``name`` of type ``kind`` does on ``proxy``: ``toxics`` as toxiproxy lists them
    (None: unread), and the probe ``direct`` to its upstream and ``through`` it (None: not probed)."""
    if toxics is None:
        return Witness.unwitnessed(f"proxy {proxy}'s toxics could not be read back from toxiproxy")
    listed = _listed(toxics, name)
    if listed is None:
        return Witness.none(f"toxiproxy lists no toxic {name} on proxy {proxy}", listed=False)
    toxicity = listed.get("toxicity")
    figures: dict[str, Any] = {"listed_toxicity": toxicity, "listed_attributes": listed.get("attributes")}
    if not isinstance(toxicity, (int, float)) or toxicity <= 0:
        return Witness.none(f"toxiproxy lists toxic {name} on proxy {proxy} with toxicity {toxicity}: "
                            "it applies to no connection", **figures)
    if kind not in PROBED or direct is None:
        return Witness.unwitnessed(f"a {kind} toxic is not probed (listed on proxy {proxy} with toxicity {toxicity})",
                                   **figures)
    figures.update(direct_s=direct.seconds, direct_code=direct.code)
    if not direct.answered or through is None:  # not a gRPC server (a redis): nothing to compare with
        return Witness.unwitnessed(f"proxy {proxy}'s upstream did not answer the probe directly ({direct.code}): "
                                   f"listed with toxicity {toxicity}, not probed through it", **figures)
    added_ms = round((through.seconds - direct.seconds) * 1000.0, 1)
    figures.update(through_s=through.seconds, through_code=through.code, added_ms=added_ms)
    said = (f"a probe through proxy {proxy} took {through.seconds * 1000:.0f} ms ({through.code}), "
            f"{direct.seconds * 1000:.0f} ms straight to its upstream")
    if kind == "latency":
        expected = attributes.get("latency", 0) - attributes.get("jitter", 0)
        figures["expected_ms"] = expected
        if expected <= 0:
            return Witness.unwitnessed(f"{said}: a latency of {expected} ms at least cannot be told apart", **figures)
        shown = not through.answered or added_ms >= expected / 2
        what = f"{said}: {added_ms:+.0f} ms for a latency of {expected} ms"
    else:
        shown = not through.answered
        what = said + (": held or cut" if shown else ": answered as directly")
    if shown:
        return Witness.seen(what, **figures)
    if toxicity >= 1:
        return Witness.none(what, **figures)
    return Witness.unwitnessed(f"{what} (toxicity {toxicity}: the probe's connection may have been spared)", **figures)
