"""The modelexpress adapter's reading of the client (``mxref.modelexpress.adapter.ClientObserver``).

The lines below are the real client's, as ModelExpress 0.7.0 logged them in a run here; the
observer must turn them into the harness's events (and nothing else into anything). Where the
client's wheel is at hand, each phrase the observer keys on is also found in the client's
source, so a release that rewords a line fails here rather than silently losing events.
"""

from __future__ import annotations

import logging
import zipfile
from typing import Any

import pytest

from harness.subjects import wire
from mxref.events import EVENTS
from mxref.modelexpress.adapter import ClientObserver, CpuBackend, build_parser

READER_LINES = [
    ("modelexpress.load_strategy", "[Worker 0] Trying strategy: rdma"),
    ("modelexpress.strategy_rdma", "[Worker 0] Source selection: source_selector=random source_candidates_total=2 "
                                   "source_candidates_rank_matched=1 source_candidates_accelerator_matched=1"),
    ("modelexpress.strategy_rdma", "[Worker 0] Source attempt: source_attempt_index=0 source_worker_id=9015621c "
                                   "mx_source_id=74f69a2b630a6e02"),
    ("modelexpress.strategy_rdma", "[Worker 0] Receiving 8 tensors from source (P2P)"),
    ("modelexpress.strategy_rdma", "[Worker 0] [TIMING] RDMA transfer complete: 8 tensors, 0.01 GB, 0.094s, 0.7 Gbps"),
    ("modelexpress.metadata.publish", "[Worker 0] Published P2P metadata to MX server (mx_source_id=74f69a2b630a6e02, "
                                      "worker_grpc=127.0.0.1:36325)"),
    ("modelexpress.metadata.publisher", "[Worker 0] Status -> READY"),
    ("modelexpress.metadata.publisher", "[Worker 0] Marked STALE on shutdown"),
    ("modelexpress.nixl_transfer", "Registered 8 regions from 8 tensors (0.0% reduction), 0.01 GB total"),
]


def observe(lines: list[tuple[str, str]], *, reader: bool = True) -> tuple[ClientObserver, list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    observer = ClientObserver(lambda event, **fields: seen.append((event, fields)), "w-self", reader=reader)
    for name, text in lines:
        observer.handle(logging.LogRecord(name, logging.INFO, __file__, 1, text, None, None))
    return observer, seen


def test_a_load_over_rdma_reads_as_the_harness_events() -> None:
    observer, seen = observe(READER_LINES)
    assert [event for event, _ in seen] == [
        "candidates", "attempt_start", "transfer_start", "transfer_done", "attempt_outcome", "published", "heartbeat",
        "status_change", "status_change",
    ]
    fields = dict(seen)
    assert fields["candidates"] == {"listed": 2, "rank_matched": 1, "accelerator_matched": 1}
    assert fields["attempt_start"] == {"index": 0, "mx_source_id": "74f69a2b630a6e02", "worker_id": "9015621c"}
    assert fields["transfer_done"]["seconds"] == pytest.approx(0.094)
    assert fields["published"] == {"mx_source_id": "74f69a2b630a6e02", "worker_id": "w-self", "mode": "p2p"}
    assert [f["status"] for e, f in seen if e == "status_change"] == ["READY", "STALE"]
    assert observer.strategy == "rdma" and observer.source_worker == "9015621c" and observer.status == "STALE"


def test_a_wedged_read_is_a_transfer_timeout_then_the_next_candidate() -> None:
    attempt = "[Worker 0] Source attempt: source_attempt_index={i} source_worker_id={w} mx_source_id=74f69a2b630a6e02"
    _, seen = observe([
        ("modelexpress.strategy_rdma", attempt.format(i=0, w="aaaa0000")),
        ("modelexpress.strategy_rdma", "[Worker 0] Receiving 8 tensors from source (P2P)"),
        ("modelexpress.strategy_rdma", "[Worker 0] RDMA source worker aaaa0000 failed: RDMA receive failed: RDMA transfer "
                                       "timed out. Trying next candidate."),
        ("modelexpress.strategy_rdma", attempt.format(i=1, w="bbbb1111")),
        ("modelexpress.strategy_rdma", "[Worker 0] Receiving 8 tensors from source (P2P)"),
        ("modelexpress.load_strategy", "[Worker 0] Strategy rdma failed, trying next: RDMA receive failed: "
                                       "NIXL_ERR_REMOTE_DISCONNECT"),
    ])
    events = [(e, f.get("index"), f.get("outcome")) for e, f in seen]
    assert events == [
        ("attempt_start", 0, None), ("transfer_start", 0, None), ("transfer_timeout", 0, None),
        ("attempt_outcome", 0, "transfer_retry"), ("attempt_start", 1, None), ("transfer_start", 1, None),
        ("transfer_error", 1, None), ("attempt_outcome", 1, "transfer_fallback"), ("fallback", None, None),
    ]


def test_a_failed_or_empty_listing_is_a_candidates_event() -> None:
    failed = [("modelexpress.strategy_rdma", "[Worker 0] Error listing sources, falling through: <_InactiveRpcError of RPC "
                                             "that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = "
                                             "\"failed to connect to all addresses; Connection refused\"\n>"),
              ("modelexpress.strategy_rdma", "[Worker 0] No RDMA source available, skipping")]
    _, seen = observe(failed)
    assert [e for e, _ in seen] == ["candidates"]  # one, carrying the error; the empty list that follows adds none
    assert seen[0][1]["listed"] == 0 and "Connection refused" in seen[0][1]["error"]  # the whole multi-line error
    _, empty = observe([("modelexpress.strategy_rdma", "[Worker 0] No RDMA source available, skipping")])
    assert empty == [("candidates", {"listed": 0, "rank_matched": 0, "accelerator_matched": 0})]


def test_every_event_it_writes_is_in_the_schema() -> None:
    _, seen = observe([*READER_LINES, ("modelexpress.load_strategy",
                                        "[Worker 0] Strategy rdma failed, trying next: RDMA receive failed: boom"),
                       ("modelexpress.strategy_rdma", "[Worker 0] RDMA source worker ab12 failed: timed out. Trying next candidate.")])
    for event, fields in seen:
        assert event in EVENTS, event
        assert set(fields) <= set(EVENTS[event].fields), (event, fields)


def test_a_fallback_is_a_reader_s_not_a_booting_source_s() -> None:
    line = [("modelexpress.load_strategy", "[Worker 0] Strategy rdma failed, trying next: No RDMA source available")]
    _, as_reader = observe(line)
    assert as_reader == [("fallback", {"reason": "No RDMA source available", "checkpoint": None})]
    _, as_source = observe(line, reader=False)
    assert as_source == []


def test_the_cpu_backend_keeps_the_protocol_the_client_calls() -> None:
    backend = CpuBackend()
    assert (backend.name, backend.nixl_mem_type, backend.supports_rdma_p2p()) == ("cpu", "DRAM", True)
    assert not (backend.supports_pool_reg() or backend.supports_vmm() or backend.supports_gds())


def test_options_it_does_not_take_are_tolerated() -> None:
    args, unknown = build_parser().parse_known_args(
        ["reader", "--server", "h:1", "--selector-seed", "3", "--transfer-timeout", "20s", "--result", "/x"])
    assert args.server == "h:1" and args.transfer_timeout == 20.0
    assert unknown == ["--selector-seed", "3", "--result", "/x"]


# The phrases the observer keys on, and the module of the client that logs each.
PHRASES = {
    "client.py": ["UpdateStatus failed: "],
    "metadata/publisher.py": ["Status -> READY", "Marked STALE on shutdown", "marked ", "STALE so targets stop selecting it"],
    "metadata/publish.py": ["Published P2P metadata to MX server ", "(mx_source_id="],
    "load_strategy/rdma_strategy.py": ["Error listing sources, falling through: ", "No RDMA source available, skipping",
                                       "Source selection: ", "source_candidates_total=", "Source attempt: ",
                                       "source_attempt_index=", "Receiving ", "tensors from source",
                                       "RDMA transfer complete: ", "failed: {e}. Trying next candidate.",
                                       "Failed to fetch metadata for worker "],
    "load_strategy/__init__.py": ["failed, ", "trying next: ", "Trying strategy: "],
}


def test_the_phrases_are_the_client_s() -> None:
    wheel, how = wire.client_wheel("0.7.0")
    if wheel is None:
        pytest.skip(f"the modelexpress==0.7.0 wheel is not available: {how}")
    with zipfile.ZipFile(wheel) as archive:
        for module, phrases in PHRASES.items():
            source = archive.read(f"modelexpress/{module}").decode()
            missing = [p for p in phrases if p not in source]
            assert missing == [], f"modelexpress/{module} no longer logs {missing}: update mxref.modelexpress.adapter._PATTERNS"


def test_each_refused_heartbeat_is_a_heartbeat_event_then_the_client_publishes_again() -> None:
    refused = "no worker 'w1' is published under source '74f69a2b630a6e02'"
    _, seen = observe([
        ("modelexpress.metadata.publisher", "[Worker 0] Status -> READY"),
        ("modelexpress.client", f"UpdateStatus failed: {refused}"),
        ("modelexpress.client", f"UpdateStatus failed: {refused}"),
        ("modelexpress.metadata.publisher", "[Worker 0] Server rejected 2 heartbeats in a row for mx_source_id="
                                            "74f69a2b630a6e02; re-registering the source"),
        ("modelexpress.metadata.publish", "[Worker 0] Published P2P metadata to MX server (mx_source_id=74f69a2b630a6e02, "
                                          "worker_grpc=127.0.0.1:36325)"),
    ], reader=False)
    beats = [f for e, f in seen if e == "heartbeat"]
    assert [(b["ok"], b["message"]) for b in beats] == [(True, ""), (False, refused), (False, refused)]
    assert [e for e, _ in seen][-1] == "published"


def test_a_dead_candidate_s_metadata_miss_is_an_attempt_outcome() -> None:
    _, seen = observe([
        ("modelexpress.strategy_rdma", "[Worker 0] Source selection: source_selector=random source_candidates_total=2 "
                                       "source_candidates_rank_matched=2 source_candidates_accelerator_matched=2"),
        ("modelexpress.strategy_rdma", "[Worker 0] Source attempt: source_attempt_index=0 source_worker_id=fc8d68ad "
                                       "mx_source_id=4c9b65bb6acd6d91"),
        ("modelexpress.strategy_rdma", "[Worker 0] Failed to fetch metadata for worker fc8d68ad: <_InactiveRpcError of RPC"
                                       " that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = \"failed to"
                                       " connect\"\n>. Trying next candidate."),
    ])
    outcome = [f for e, f in seen if e == "attempt_outcome"]
    assert len(outcome) == 1 and outcome[0]["outcome"] == "metadata_miss" and outcome[0]["worker_id"] == "fc8d68ad"
    assert "UNAVAILABLE" in outcome[0]["error"] and not [e for e, _ in seen if e.startswith("transfer_")]


# --- ModelExpress 0.8 (its pre-releases): the topology-domain policy and the source's manifest log ---

CLIENT_08 = "0.8.0.dev20261026"
PHRASES_08 = {
    "load_strategy/rdma_strategy.py": ["is required but unknown for this ", "node, skipping RDMA",
                                       " source_candidates_topology_matched="],
    "metadata/worker_server.py": ["GetTensorManifest served: ", "PrepareTensorRead served: "],
}


def test_the_topology_lines_and_the_sources_manifest_read_as_events() -> None:
    _, seen = observe([
        ("modelexpress.strategy_rdma", "[Worker 0] Topology domain 'rack' is required but unknown for this node, "
                                       "skipping RDMA"),
        ("modelexpress.strategy_rdma", "[Worker 0] Source selection: source_selector=random source_candidates_total=1 "
                                       "source_candidates_rank_matched=1 source_candidates_accelerator_matched=1 "
                                       "source_candidates_topology_matched=0"),
        ("modelexpress.metadata.worker_server", "GetTensorManifest served: 8 tensors, 1234 bytes (worker_rank=0)"),
        ("modelexpress.metadata.worker_server", "PrepareTensorRead served: 8 tensors, lease_id=ab (worker_rank=0)"),
    ])
    assert seen == [
        ("topology_blocked", {"domain": "rack"}),
        ("candidates", {"listed": 1, "rank_matched": 1, "accelerator_matched": 1, "topology_matched": 0}),
        ("manifest_served", {"method": "GetTensorManifest", "tensors": 8}),
        ("manifest_served", {"method": "PrepareTensorRead", "tensors": 8}),
    ]
    _, plain = observe(READER_LINES[1:2])  # 0.7.0's selection line: no topology field
    assert plain == [("candidates", {"listed": 2, "rank_matched": 1, "accelerator_matched": 1})]


def test_the_0_8_phrases_are_the_client_s() -> None:
    from harness.subjects.envs import subject_env_dir, subject_spec

    found = sorted((subject_env_dir(subject_spec("modelexpress", CLIENT_08)) / "lib").glob("python*/site-packages/modelexpress"))
    if not found:
        pytest.skip(f"the modelexpress=={CLIENT_08} environment is not built here")
    for module, phrases in PHRASES_08.items():
        source = (found[0] / module).read_text()
        missing = [p for p in phrases if p not in source]
        assert missing == [], f"modelexpress {CLIENT_08}: {module} no longer logs {missing}: update the adapter's _PATTERNS"
