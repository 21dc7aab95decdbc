"""Every Prometheus collector mxref exports, defined here and nowhere else.

Each process builds one ``Metrics`` on its own ``CollectorRegistry`` (so tests
can hold several in one interpreter) and serves it with ``serve()``. Reader
families use ModelExpress's ``mx_p2p_*`` / ``mx_nixl_*`` names and labels so
dashboards carry over; mxref-only families are ``mxref_*``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

TRANSFER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
PHASE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
CANDIDATE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class Metrics:
    def __init__(self, component: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.build_info = Gauge("mx_build_info", "mxref build", ["component", "version"], registry=r)
        from mxref import __version__

        self.build_info.labels(component, __version__).set(1)

        # --- metadata server ---
        self.sources = Gauge("mxref_server_sources", "Worker records by status", ["status"], registry=r)
        self.rpcs = Counter("mxref_server_rpcs_total", "RPCs served", ["method", "result"], registry=r)
        self.rpc_seconds = Histogram(
            "mxref_server_rpc_seconds", "RPC latency", ["method"], buckets=RPC_BUCKETS, registry=r
        )
        self.reaper_actions = Counter(
            "mxref_server_reaper_actions_total", "Reaper transitions", ["action"], registry=r
        )

        # --- source / publisher ---
        self.source_status = Gauge(
            "mxref_source_status", "1 for the status this source last reported", ["status"], registry=r
        )
        self.heartbeats = Counter("mxref_source_heartbeats_total", "Status updates sent", ["status", "result"], registry=r)
        self.manifest_requests = Counter(
            "mxref_source_manifest_requests_total", "GetTensorManifest calls", ["result"], registry=r
        )
        self.registered_bytes = Gauge("mxref_registered_bytes", "Bytes registered with NIXL", registry=r)

        # --- NIXL manager (any role) ---
        self.data_plane_errors = Counter(
            "mx_nixl_data_plane_errors_total", "Transfers that timed out or failed", ["kind"], registry=r
        )
        self.data_plane_healthy = Gauge(
            "mxref_data_plane_healthy", "1 while the NIXL manager reports healthy", registry=r
        )
        self.receives = Counter("mx_nixl_receive_total", "Receives by result", ["result"], registry=r)
        self.peers = Gauge("mxref_nixl_remote_agents", "Remote agents currently loaded", registry=r)

        # --- reader funnel (ModelExpress names) ---
        self.list_sources = Counter("mx_p2p_list_sources_total", "ListSources calls", ["policy", "result"], registry=r)
        self.candidates = Histogram(
            "mx_p2p_candidates", "Candidates per stage", ["policy", "stage"], buckets=CANDIDATE_BUCKETS, registry=r
        )
        self.selection_seconds = Histogram("mx_p2p_source_selection_seconds", "Selector time", ["policy"], registry=r)
        self.selections = Counter("mx_p2p_source_selections_total", "Sources selected for a transfer", ["policy"], registry=r)
        self.attempts = Counter("mx_p2p_source_attempts_total", "Source attempts by result", ["policy", "result"], registry=r)
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
        self.loads = Counter("mxref_loads_total", "Completed loads by path", ["path", "integrity"], registry=r)
        self.load_seconds = Histogram("mxref_load_seconds", "Whole load time", ["path"], buckets=TRANSFER_BUCKETS, registry=r)
        self.bytes_loaded = Counter("mxref_bytes_loaded_total", "Bytes loaded", ["path"], registry=r)
        self.fallbacks = Counter("mxref_fallbacks_total", "Disk fallbacks", ["reason"], registry=r)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics HTTP endpoint; returns the bound port (``port=0`` picks one)."""
        self._http, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(self._http.server_port)

    def close(self) -> None:
        """Stop the /metrics endpoint, if one was started."""
        http = getattr(self, "_http", None)
        if http is not None:
            http.shutdown()
            http.server_close()
            self._http = None
