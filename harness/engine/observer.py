"""The client's view of the control plane: ask each metadata server what a reader is offered.

A server's own ``source_status`` events say what it stored; a reader is offered what its
``ListSources`` returns (READY and, by the contract, fresh at query time) and can read only what
``GetMetadata`` then finds. ``ListingObserver`` asks both itself, every ``interval`` during the
run, of every live server process, and records each answer as an ``observed`` entry::

    {"ok": true, "wire": "mxref.v1", "offered": [{"worker_id", "mx_source_id", "metadata": bool}],
     "seconds": 0.004}

It speaks ``mxref.v1`` and, when a server answers that UNIMPLEMENTED (ModelExpress's own),
``model_express.p2p``, through the generated stubs and messages only (no code of the subject's
client). The ``listed`` check's ``view: client`` judges these entries. The runner starts it only
when a check asks for that view (each call is an RPC the server counts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

import grpc

from harness.engine.processes import ProcessTable, ProcState
from harness.record.timeline import Timeline
from harness.scenario import Scenario
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.pki import RunCredentials
from mxref.v1 import p2p_pb2, p2p_pb2_grpc

__all__ = ["ListingObserver", "start_observer", "stop_observer"]

WIRES = ("mxref.v1", "model_express.p2p")
MX_SERVICE = "/model_express.p2p.P2pService/"


class ListingObserver:
    """Periodic ListSources (READY) + GetMetadata per listed source, as a reader asks them."""

    def __init__(self, table: ProcessTable, timeline: Timeline, credentials: RunCredentials | None = None,
                 interval: float = 0.2, timeout: float = 1.0) -> None:
        self.table = table
        self.timeline = timeline
        self.credentials = credentials
        self.interval = interval
        self.timeout = timeout
        self._channels: dict[str, tuple[grpc.Channel, str]] = {}  # address -> (channel, wire)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mxchaos-observer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout * 3 + 1)
        for channel, _ in self._channels.values():
            channel.close()
        self._channels.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.observe_all()

    def observe_all(self) -> None:
        for st in self.table.live():
            port = st.ports.get("grpc")
            if st.role == "server" and port:
                self.observe_one(st, port)

    def observe_one(self, st: ProcState, port: int) -> None:
        address = f"{st.host.address}:{port}"
        started = time.monotonic()
        value: dict[str, Any]
        try:
            wire, offered = self._ask(address)
            value = {"ok": True, "wire": wire, "offered": offered}
        except grpc.RpcError as exc:  # a grpc.Call too: its code and details say why
            call = cast(grpc.Call, exc)
            value = {"ok": False, "error": f"{call.code().name}: {call.details()}"}
        except Exception as exc:  # noqa: BLE001 - an observation that failed is recorded, never fatal to the run
            value = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        value["seconds"] = round(time.monotonic() - started, 4)
        self.timeline.append("info", st.name, "observed", value)

    def _ask(self, address: str) -> tuple[str, list[dict[str, Any]]]:
        channel, wire = self._channels.get(address) or (self._channel(address), WIRES[0])
        self._channels[address] = (channel, wire)
        try:
            refs = self._list(channel, wire)
        except grpc.RpcError as exc:
            if wire != WIRES[0] or exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            wire = WIRES[1]  # ModelExpress's own server: its package from now on
            self._channels[address] = (channel, wire)
            refs = self._list(channel, wire)
        get = self._rpc(channel, wire, "GetMetadata", p2p_pb2.GetMetadataRequest, p2p_pb2.GetMetadataResponse)
        offered = []
        for mx_source_id, worker_id in refs:
            answer = get(p2p_pb2.GetMetadataRequest(mx_source_id=mx_source_id, worker_id=worker_id), timeout=self.timeout)
            offered.append({"worker_id": worker_id, "mx_source_id": mx_source_id,
                            "metadata": bool(answer.found and answer.HasField("worker"))})
        return wire, offered

    def _list(self, channel: grpc.Channel, wire: str) -> list[tuple[str, str]]:
        if wire == WIRES[0]:
            ask = self._rpc(channel, wire, "ListSources", p2p_pb2.ListSourcesRequest, p2p_pb2.ListSourcesResponse)
            answer = ask(p2p_pb2.ListSourcesRequest(status_filter=p2p_pb2.SOURCE_STATUS_READY), timeout=self.timeout)
        else:
            ask = self._rpc(channel, wire, "ListSources", mx_pb2.ListSourcesRequest, mx_pb2.ListSourcesResponse)
            answer = ask(mx_pb2.ListSourcesRequest(status_filter=mx_pb2.SourceStatus.Value("SOURCE_STATUS_READY")),
                         timeout=self.timeout)
        return [(ref.mx_source_id, ref.worker_id) for ref in answer.instances]

    @staticmethod
    def _rpc(channel: grpc.Channel, wire: str, method: str, request: Any, response: Any) -> Callable[..., Any]:
        """One unary method of either package (GetMetadata's messages are numbered alike in both)."""
        if wire == WIRES[0]:
            stub: Any = p2p_pb2_grpc.P2pServiceStub(channel)  # type: ignore[no-untyped-call]
            return getattr(stub, method)  # type: ignore[no-any-return]
        call: Callable[..., Any] = channel.unary_unary(MX_SERVICE + method, request_serializer=request.SerializeToString,
                                                      response_deserializer=response.FromString)
        return call

    def _channel(self, address: str) -> grpc.Channel:
        """Plaintext, or TLS against the run's CA with the run's token (as the run's readers dial)."""
        creds = self.credentials
        if creds is None or not creds.tls or creds.ca_cert is None:
            return grpc.insecure_channel(address)
        channel_creds = grpc.ssl_channel_credentials(creds.ca_cert.read_bytes())
        if creds.token is not None:
            token = creds.token.read_text().strip()
            channel_creds = grpc.composite_channel_credentials(
                channel_creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(address, channel_creds)


def start_observer(sc: Scenario, table: ProcessTable, timeline: Timeline,
                   credentials: RunCredentials | None) -> ListingObserver | None:
    """A started observer when one of the scenario's checks judges the client's view, else None."""
    if not any(getattr(params, "view", None) == "client" for _, params in sc.check_entries()):
        return None
    observer = ListingObserver(table, timeline, credentials)
    observer.start()
    return observer


def stop_observer(observer: ListingObserver | None) -> None:
    if observer is not None:
        observer.stop()
