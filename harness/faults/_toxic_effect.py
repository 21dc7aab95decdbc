"""The ``toxic`` fault's witness of effect, measured by the harness, never by the subject.

Two measurements, taken at the inject once the toxic is in:

- **read back**: the proxy's toxics as toxiproxy lists them (``GET /proxies/NAME/toxics``). A toxic
  it does not list, or lists with toxicity 0, applies to no connection: no effect.
- **a probe**: on a fresh connection of the harness's own, an HTTP/2 client preface with an
  empty SETTINGS frame, and the wait for the server's acknowledgement (what every gRPC server
  answers at once), timed straight to the proxy's upstream and then through the proxy. Its
  round trip crosses both streams. Where a toxic acts on volume, the probe carries a load on the
  toxic's stream (``Load``): upstream, frames of a type HTTP/2 has not defined (a server must
  ignore them) and then a second SETTINGS; downstream, many empty SETTINGS frames, each of which
  the server acknowledges (nine bytes back apiece). The probe ends once every SETTINGS is
  acknowledged, so the load has crossed the toxic's stream by then.

What each toxic type is expected to show (``plan``):

- ``latency``: added delay, seen when at least half its ``latency - jitter``.
- ``timeout``: the probe held (no answer within ``HELD_S``) or cut, while the upstream answered it.
- ``bandwidth``: a load of ``rate`` x ``TARGET_MS`` bytes (at most ``MAX_LOAD`` on its stream)
  takes ``load / rate`` ms longer (toxiproxy's own arithmetic); seen when at least half that was
  added. At a rate of 0 toxiproxy passes nothing on at all: the probe is held, as a ``timeout``'s.
- ``slicer``: toxiproxy waits ``delay`` us after each slice of at most ``average_size +
  size_variation`` bytes, so a load of ``n`` such slices takes ``n x delay`` longer; seen when at
  least half that was added. A slicer without delay only cuts its bytes smaller, which a round
  trip does not show: not witnessed.
- ``limit_data``: a load of ``bytes`` + ``CUT_MARGIN`` bytes on its stream, so the probe's
  connection is cut before its last acknowledgement (seen), while the upstream answered it.

A delay is told apart only where the probe straight to the upstream (with a load, the faster of
two: ``baseline``) took under a quarter of it.

Where the expected delay is under ``MIN_MS`` (a rate, or a slicer's delay, too small for a
bounded load to show) or the limit is more than ``MAX_LOAD``, the toxic is not probed (not
witnessed, saying why). Where the toxic is listed with toxicity 1 and the probe shows nothing,
the toxic did nothing: no effect. Below toxicity 1 the probe's connection may be one toxiproxy
spared, so a probe showing nothing says nothing (not witnessed).

``slow_close`` and ``reset_peer`` act as a connection ends or after a while, which a probe's round
trip does not show: their witness is the read back and the traffic through the proxy while the
toxic held (``harness.faults.toxiproxy.toxic_witness``). An upstream that does not answer the
probe directly (not a gRPC server: a redis) is not probed through the proxy, and leaves the probe
unwitnessed (its read back still counts).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.record.witness import Witness

__all__ = ["HELD_S", "Load", "Plan", "Probe", "baseline", "plan", "probe", "toxic_effect"]

# an HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server answers the
# SETTINGS with a SETTINGS frame flagged ACK, a round trip through both streams
SETTINGS_FRAME = bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SETTINGS_FRAME
_SETTINGS, _ACK, _LAST_TYPE = 4, 1, 9
_FILLER_TYPE = 0xFA  # a frame type HTTP/2 does not define: its receiver discards it (RFC 9113, 4.1)
_FILLER_PAYLOAD = 16384  # the largest frame every HTTP/2 receiver accepts
HELD_S = 1.0  # a timeout toxic's probe: no answer within this long is a held connection
TARGET_MS = 300  # the delay a bandwidth or slicer probe's load is sized to show
MIN_MS = 100  # below this expected delay, a probe's load cannot tell the toxic apart
MAX_LOAD = {"upstream": 4 << 20, "downstream": 512 << 10}  # bytes a probe moves at most on a stream
CUT_MARGIN = 4096  # a limit_data probe's load: this much past the limit


@dataclass(frozen=True)
class Load:
    """What a probe moves on ``stream`` past its preface: ``volume`` bytes at least."""

    stream: str
    volume: int

    def frames(self) -> tuple[bytes, int]:
        """The bytes sent after the preface, and how many SETTINGS the server acknowledges in all."""
        if self.stream == "upstream":
            whole, rest = divmod(self.volume, 9 + _FILLER_PAYLOAD)
            sizes = [_FILLER_PAYLOAD] * whole + ([max(0, rest - 9)] if rest else [])
            filler = b"".join(n.to_bytes(3, "big") + bytes((_FILLER_TYPE, 0, 0, 0, 0, 0)) + bytes(n) for n in sizes)
            return filler + SETTINGS_FRAME, 2
        count = math.ceil(self.volume / len(SETTINGS_FRAME))
        return SETTINGS_FRAME * count, 1 + count


@dataclass(frozen=True)
class Plan:
    """How toxic type ``kind`` is probed: with ``load`` (None: the preface alone), expecting
    ``expected_ms`` of added delay, or (``cuts``) the probe held or cut; ``skip``: why it is not probed."""

    kind: str
    load: Load | None = None
    expected_ms: float = 0.0
    cuts: bool = False
    skip: str = ""

    @property
    def bound(self) -> float:
        """How long a probe may wait: a held call's ``HELD_S``, else three times the delay expected and 2 s."""
        return HELD_S if self.cuts and self.load is None else 3 * self.expected_ms / 1000.0 + 2.0


def _sized(kind: str, stream: str, per_ms: float, unit: int, said: str) -> Plan:
    """A load of whole ``unit``s on ``stream`` sized so that ``per_ms`` units a millisecond take
    ``TARGET_MS``, at most ``MAX_LOAD``; not probed where what it shows is under ``MIN_MS``."""
    units = min(math.ceil(TARGET_MS * per_ms), MAX_LOAD[stream] // unit)
    expected = units / per_ms
    if expected < MIN_MS:
        return Plan(kind, skip=f"{said} adds {expected:.0f} ms to a probe of {units * unit} bytes {stream}, "
                               f"under the {MIN_MS} ms a probe can tell apart")
    return Plan(kind, Load(stream, units * unit), round(expected, 1))


def plan(kind: str, stream: str, attributes: Mapping[str, int]) -> Plan:
    """How a toxic of type ``kind`` on ``stream`` with ``attributes`` is probed (the module's doc)."""
    if kind == "latency":
        expected = attributes.get("latency", 0) - attributes.get("jitter", 0)
        if expected <= 0:
            return Plan(kind, skip=f"a latency of {expected} ms at least cannot be told apart")
        return Plan(kind, None, float(expected))
    if kind == "timeout":
        return Plan(kind, cuts=True)
    if kind == "bandwidth":
        rate = attributes.get("rate", 0)  # KB/s: toxiproxy delays len / rate ms
        if rate <= 0:  # toxiproxy sends nothing on: empty slices every 100 ms
            return Plan(kind, cuts=True)
        return _sized(kind, stream, float(rate), 1, f"a rate of {rate} KB/s")
    if kind == "slicer":
        delay, size = attributes.get("delay", 0), attributes.get("average_size", 0) + attributes.get("size_variation", 0)
        if delay <= 0:
            return Plan(kind, skip="a slicer without delay only cuts its bytes smaller, which a round trip does not show")
        return _sized(kind, stream, 1000.0 / delay, max(1, size), f"a delay of {delay} us per slice of {size} bytes")
    if kind == "limit_data":
        volume = attributes.get("bytes", 0) + CUT_MARGIN
        if volume > MAX_LOAD[stream]:
            return Plan(kind, skip=f"a limit of {volume - CUT_MARGIN} bytes is more than a probe moves {stream} "
                                   f"({MAX_LOAD[stream]} bytes)")
        return Plan(kind, Load(stream, volume), cuts=True)
    return Plan(kind, skip=f"a {kind} toxic is not probed: it acts as a connection ends, or after a while")


@dataclass(frozen=True)
class Probe:
    """One timed round trip to ``address``: how long it took and how it ended: ``ACK`` (the
    server acknowledged every SETTINGS of the probe), ``TIMEOUT`` (not within the bound),
    ``CLOSED`` / ``RESET`` (the connection ended first), ``REFUSED`` (no connection),
    ``NOT_HTTP2`` (what came back is no HTTP/2 frame: not a gRPC server)."""

    address: str
    seconds: float
    code: str

    @property
    def answered(self) -> bool:
        return self.code == "ACK"


def _acknowledged(buf: bytes) -> tuple[int, bool, bytes]:
    """Read the complete HTTP/2 frames at the start of ``buf``: the SETTINGS acknowledgements
    among them, whether a frame type HTTP/2 does not have came (not a gRPC server), and what is
    left to read."""
    acks = 0
    while len(buf) >= 9:
        length, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
        if kind > _LAST_TYPE:
            return acks, True, b""
        if len(buf) < 9 + length:
            break
        acks += kind == _SETTINGS and bool(flags & _ACK)
        buf = buf[9 + length:]
    return acks, False, buf


def _send(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` (on a thread of its own, so that the acknowledgements are read meanwhile:
    a server that stops reading until its answers are read cannot stall it); a connection cut
    under it is the reader's to see."""
    try:
        sock.sendall(data)
    except OSError:
        pass


def probe(address: str, bound: float, load: Load | None = None) -> Probe:
    """Open a connection to ``address`` (``HOST:PORT``), send ``PREFACE`` (and ``load``) and
    wait at most ``bound`` seconds for every acknowledgement; the connection is closed before
    this returns (a socket of the harness's own, so nothing of it lingers in the proxy's counts)."""
    host, _, port = address.rpartition(":")
    extra, wanted = load.frames() if load is not None else (b"", 1)
    start = time.monotonic()
    deadline = start + bound

    def ended(code: str) -> Probe:
        return Probe(address, round(time.monotonic() - start, 4), code)

    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=bound)
    except (OSError, ValueError):
        return ended("REFUSED")
    sender = threading.Thread(target=_send, args=(sock, PREFACE + extra), daemon=True)
    with sock:
        buf, acks = b"", 0
        try:
            sender.start()
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    return ended("CLOSED")
                got, foreign, buf = _acknowledged(buf + chunk)
                if foreign:
                    return ended("NOT_HTTP2")
                acks += got
                if acks >= wanted:
                    return ended("ACK")
        except TimeoutError:
            pass
        except OSError:
            return ended("RESET")
        finally:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # a sender still in sendall returns at once
            except OSError:
                pass
            sender.join(timeout=5.0)
        return ended("TIMEOUT")


def baseline(address: str, how: Plan) -> Probe:
    """The probe straight to the upstream that one through the proxy is compared with: with a
    load, the faster answered of two (a server's first connection can be slow to set up)."""
    first = probe(address, how.bound, how.load)
    if how.load is None:
        return first
    second = probe(address, how.bound, how.load)
    answered = [p for p in (first, second) if p.answered]
    return min(answered, key=lambda p: p.seconds) if answered else second


def _listed(toxics: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    return next((t for t in toxics or [] if isinstance(t, dict) and t.get("name") == name), None)


def toxic_effect(proxy: str, name: str, how: Plan, toxics: list[dict[str, Any]] | None,
                 direct: Probe | None, through: Probe | None) -> Witness:
    """What toxic ``name`` (probed as ``how``) does on ``proxy``: ``toxics`` as toxiproxy lists
    them (None: unread), and the probe ``direct`` to its upstream and ``through`` it (None: not probed)."""
    kind = how.kind
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
    if how.skip or direct is None:
        why = how.skip or f"a {kind} toxic is not probed"
        return Witness.unwitnessed(f"{why} (listed on proxy {proxy} with toxicity {toxicity})", **figures)
    figures.update(direct_s=direct.seconds, direct_code=direct.code)
    if how.load is not None:
        figures.update(load_bytes=how.load.volume, load_stream=how.load.stream)
    if not direct.answered or through is None:  # not a gRPC server (a redis): nothing to compare with
        return Witness.unwitnessed(f"proxy {proxy}'s upstream did not answer the probe directly ({direct.code}): "
                                   f"listed with toxicity {toxicity}, not probed through it", **figures)
    added_ms = round((through.seconds - direct.seconds) * 1000.0, 1)
    figures.update(through_s=through.seconds, through_code=through.code, added_ms=added_ms)
    carried = f" carrying {how.load.volume} bytes {how.load.stream}" if how.load is not None else ""
    said = (f"a probe{carried} through proxy {proxy} took {through.seconds * 1000:.0f} ms ({through.code}), "
            f"{direct.seconds * 1000:.0f} ms straight to its upstream")
    if how.cuts:
        shown = not through.answered
        what = said + (": held or cut" if shown else ": answered as directly")
    else:
        figures["expected_ms"] = how.expected_ms
        if direct.seconds * 1000.0 > how.expected_ms / 4:  # the upstream's own time would hide the toxic's
            return Witness.unwitnessed(f"{said}: the upstream alone took more than a quarter of the "
                                       f"{how.expected_ms:.0f} ms a {kind} toxic adds; cannot be told apart", **figures)
        shown = not through.answered or added_ms >= how.expected_ms / 2
        what = f"{said}: {added_ms:+.0f} ms for the {how.expected_ms:.0f} ms a {kind} toxic adds"
    if shown:
        return Witness.seen(what, **figures)
    if toxicity >= 1:
        return Witness.none(what, **figures)
    return Witness.unwitnessed(f"{what} (toxicity {toxicity}: the probe's connection may have been spared)", **figures)
