"""Every Prometheus family mxref exports, and which role exports which, defined here only.

Families come in groups, one class each, that register on the registry they are given:

=================  =====================================================================
group              families
=================  =====================================================================
``ServerFamilies``  the metadata server's records, RPCs and reaper (``mxref_server_*``)
``SourceFamilies``  a source's status, heartbeats and manifest requests (``mxref_source_*``)
``NixlFamilies``    a NIXL manager's data plane, in any process that holds one
``ReaderFamilies``  the reader funnel, whole-load results and content-reference mismatches
=================  =====================================================================

A process owns one ``CollectorRegistry`` holding ``mx_build_info`` and only the groups of
its role, so a server never exports, say, a data-plane health gauge stuck at 0 that would
page someone in a real fleet:

- ``ServerMetrics``: server.
- ``SourceMetrics``: source + nixl.
- ``ReaderMetrics``: reader + nixl, plus source with ``serve_after_load`` (a reader that
  stays on as a source; the families exist from the start, so a scrape never sees the set
  change).

Names follow Prometheus: the unit last, then ``_total`` on counters (``_bytes_total``,
``_seconds``). The ``mx_p2p_*`` / ``mx_nixl_*`` / ``mx_build_info`` families keep
ModelExpress's client names and labels (``MODELEXPRESS_FAMILIES``) so its dashboards carry
over; mxref's own are ``mxref_*``. No family exports a ``*_created`` series.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from mxref import __version__

# ``*_created`` series are one more series per counter/histogram child that nobody queries;
# prometheus_client's switch is process-wide, and every mxref process imports this module.
disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus_client 0.26

TRANSFER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
PHASE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
CANDIDATE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)

# The families whose names (and labels) come from ModelExpress's client (``mx/metrics.py``)
# or server (``mx_build_info``); every other family is mxref's own and starts with ``mxref_``.
MODELEXPRESS_FAMILIES = frozenset({
    "mx_build_info",
    "mx_nixl_data_plane_errors",
    "mx_nixl_receive",
    "mx_p2p_list_sources",
    "mx_p2p_candidates",
    "mx_p2p_source_selection_seconds",
    "mx_p2p_source_selections",
    "mx_p2p_source_attempts",
    "mx_p2p_metadata_lookup_failures",
    "mx_p2p_transfer_seconds",
    "mx_p2p_source_attempt_phase_seconds",
})  # family names as exposed, i.e. counters without their ``_total`` sample suffix


class ServerFamilies:
    """The metadata server: its records by status, RPCs served, requests refused and reaper transitions."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sources = Gauge("mxref_server_sources", "Worker records by status", ["status"], registry=r)
        self.rpcs = Counter("mxref_server_rpcs_total", "RPCs served", ["method", "result"], registry=r)
        self.rpc_seconds = Histogram(
            "mxref_server_rpc_seconds", "RPC latency", ["method"], buckets=RPC_BUCKETS, registry=r
        )
        self.reaper_actions = Counter(
            "mxref_server_reaper_actions_total", "Reaper transitions", ["action"], registry=r
        )
        self.store_errors = Counter(
            "mxref_server_store_errors_total", "Store operations that failed (a Redis store down or stalled)",
            ["op"], registry=r,
        )
        self.store_up = Gauge(
            "mxref_server_store_up", "1 while the store's last operation succeeded, 0 after a failure", registry=r
        )
        self.store_up.set(1)
        self.rejected_requests = Counter(
            "mxref_server_rejected_requests_total",
            "Requests refused for breaking a limit or a rule (reason: mxref.metadata.limits.RejectReason)",
            ["method", "reason"], registry=r,
        )
        self.listing_skipped = Counter(
            "mxref_server_listing_skipped_total",
            "Records left out of a ListSources answer because they do not encode (package: the gRPC service)",
            ["package"], registry=r,
        )


class SourceFamilies:
    """A source (or a reader serving after its load): what it reports and serves."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.source_status = Gauge(
            "mxref_source_status", "1 for the status this source last reported", ["status"], registry=r
        )
        self.heartbeats = Counter(
            "mxref_source_heartbeats_total", "Status updates sent", ["status", "result"], registry=r
        )
        self.manifest_requests = Counter(
            "mxref_source_manifest_requests_total", "GetTensorManifest calls", ["result"], registry=r
        )


class NixlFamilies:
    """A NIXL transfer manager: registered memory, peers, receives and data-plane health."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.registered_bytes = Gauge("mxref_registered_bytes", "Bytes registered with NIXL", registry=r)
        self.peers = Gauge("mxref_nixl_remote_agents", "Remote agents currently loaded", registry=r)
        self.data_plane_healthy = Gauge(
            "mxref_data_plane_healthy", "1 while the NIXL manager reports healthy", registry=r
        )
        # ModelExpress's names:
        self.data_plane_errors = Counter(
            "mx_nixl_data_plane_errors_total", "Transfers that timed out or failed", ["kind"], registry=r
        )
        self.receives = Counter("mx_nixl_receive_total", "Receives by result", ["result"], registry=r)
        # the resource audit (mxref.audit): op made | released; resource handles | dlists | registrations |
        # remote_agents
        self.resources = Counter("mxref_nixl_resources_total", "NIXL resources made and released",
                                 ["resource", "op"], registry=r)
        self.resources_open = Gauge("mxref_nixl_resources_open", "NIXL resources made and not released",
                                    ["resource"], registry=r)


class ReaderFamilies:
    """The reader: ModelExpress's source-selection funnel, then mxref's whole-load results."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        # ModelExpress's names:
        self.list_sources = Counter(
            "mx_p2p_list_sources_total", "ListSources calls", ["policy", "result"], registry=r
        )
        self.candidates = Histogram(
            "mx_p2p_candidates", "Candidates per stage", ["policy", "stage"], buckets=CANDIDATE_BUCKETS,
            registry=r,
        )
        self.selection_seconds = Histogram(
            "mx_p2p_source_selection_seconds", "Selector time", ["policy"], registry=r
        )
        self.selections = Counter(
            "mx_p2p_source_selections_total", "Sources selected for a transfer", ["policy"], registry=r
        )
        self.attempts = Counter(
            "mx_p2p_source_attempts_total", "Source attempts by result", ["policy", "result"], registry=r
        )
        self.metadata_failures = Counter(
            "mx_p2p_metadata_lookup_failures_total", "GetMetadata / manifest failures", ["policy"], registry=r
        )
        self.transfer_seconds = Histogram(
            "mx_p2p_transfer_seconds", "Per-candidate transfer time", ["policy", "outcome"],
            buckets=TRANSFER_BUCKETS, registry=r,
        )
        self.phase_seconds = Histogram(
            "mx_p2p_source_attempt_phase_seconds", "Attempt phase time", ["policy", "phase", "outcome"],
            buckets=PHASE_BUCKETS, registry=r,
        )
        # mxref's own:
        self.loads = Counter("mxref_loads_total", "Completed loads by path", ["path", "integrity"], registry=r)
        self.load_seconds = Histogram(
            "mxref_load_seconds", "Whole load time", ["path"], buckets=TRANSFER_BUCKETS, registry=r
        )
        self.loaded_bytes = Counter("mxref_loaded_bytes_total", "Bytes loaded", ["path"], registry=r)
        self.fallbacks = Counter("mxref_fallbacks_total", "Disk fallbacks", ["reason"], registry=r)
        self.reference_mismatches = Counter(
            "mxref_reference_mismatches_total",
            "Content that disagreed with the reader's reference, by where it was caught: manifest (a "
            "source skipped before any READ), read (bytes READ), disk (the fallback checkpoint)",
            ["stage"], registry=r,
        )


class ProcessMetrics:
    """One process's registry: ``mx_build_info`` for ``component``, served by ``serve()``.

    Subclasses add their role's family groups; a process without a role (``prepare``)
    uses this class as is.
    """

    def __init__(self, component: str) -> None:
        self.registry = CollectorRegistry()
        self._http: WSGIServer | None = None
        build_info = Gauge("mx_build_info", "mxref build", ["component", "version"], registry=self.registry)
        build_info.labels(component, __version__).set(1)

    def family_names(self) -> frozenset[str]:
        """The families this registry exposes, named as a scraper parses them (a counter
        without its ``_total``), whether or not they have samples yet."""
        return frozenset(family.name for family in self.registry.collect())

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics HTTP endpoint; returns the bound port (``port=0`` picks one)."""
        http, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._http = http
        return int(http.server_port)

    def close(self) -> None:
        """Stop the /metrics endpoint, if one was started: its port is closed now.

        ``shutdown()`` blocks until the serving loop's next poll, up to half a second, which
        every exiting process paid (a source's stop took ~0.55 s after its ``exit`` event).
        The loop runs on a daemon thread and its socket is closed here, so the shutdown is
        asked for on a thread of its own and not waited on."""
        http, self._http = self._http, None
        if http is not None:
            threading.Thread(target=http.shutdown, name="metrics-shutdown", daemon=True).start()
            http.server_close()


class ServerMetrics(ProcessMetrics):
    """The metadata server's registry."""

    def __init__(self) -> None:
        super().__init__("server")
        self.server = ServerFamilies(self.registry)


class SourceMetrics(ProcessMetrics):
    """A source's registry."""

    def __init__(self) -> None:
        super().__init__("source")
        self.source = SourceFamilies(self.registry)
        self.nixl = NixlFamilies(self.registry)


class ReaderMetrics(ProcessMetrics):
    """A reader's registry; ``serve_after_load`` adds the source families (``source``)."""

    def __init__(self, *, serve_after_load: bool = False) -> None:
        super().__init__("reader")
        self.reader = ReaderFamilies(self.registry)
        self.nixl = NixlFamilies(self.registry)
        self.source = SourceFamilies(self.registry) if serve_after_load else None
