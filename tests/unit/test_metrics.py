"""Each role's registry: exactly its own families, Prometheus names, no ``*_created`` series.

Every labelled family gets one child first (a family without children exports no
sample, which would let a ``_created`` series or a misnamed sample go unseen); then the
registry's exposition text is parsed back with prometheus_client, as a scraper would.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from mxref.metrics import (
    MODELEXPRESS_FAMILIES,
    NixlFamilies,
    ProcessMetrics,
    ReaderFamilies,
    ReaderMetrics,
    ServerFamilies,
    ServerMetrics,
    SourceFamilies,
    SourceMetrics,
)

SERVER = {"mx_build_info", "mxref_server_sources", "mxref_server_rpcs", "mxref_server_rpc_seconds",
          "mxref_server_reaper_actions", "mxref_server_rejected_requests", "mxref_server_store_errors",
          "mxref_server_store_up", "mxref_server_listing_skipped"}
NIXL = {"mxref_registered_bytes", "mxref_nixl_remote_agents", "mxref_data_plane_healthy",
        "mx_nixl_data_plane_errors", "mx_nixl_receive", "mxref_nixl_resources", "mxref_nixl_resources_open"}
SOURCE = {"mxref_source_status", "mxref_source_heartbeats", "mxref_source_manifest_requests"}
READER = {"mx_p2p_list_sources", "mx_p2p_candidates", "mx_p2p_source_selection_seconds",
          "mx_p2p_source_selections", "mx_p2p_source_attempts", "mx_p2p_metadata_lookup_failures",
          "mx_p2p_transfer_seconds", "mx_p2p_source_attempt_phase_seconds", "mxref_loads", "mxref_load_seconds",
          "mxref_loaded_bytes", "mxref_fallbacks", "mxref_reference_mismatches"}

UNITS = {"seconds", "bytes"}
NON_BASE_UNITS = {"ms", "milliseconds", "minutes", "hours", "kb", "mb", "mib", "gb", "gib", "gbps"}


def touch(metrics: ProcessMetrics) -> None:
    """Give every family of ``metrics`` one child with a value."""
    groups = [g for g in vars(metrics).values()
              if isinstance(g, ServerFamilies | SourceFamilies | NixlFamilies | ReaderFamilies)]
    assert groups, "no family group found"
    for group in groups:
        for family in vars(group).values():
            assert isinstance(family, MetricWrapperBase)
            child = family.labels(*["x"] * len(family._labelnames)) if family._labelnames else family
            if isinstance(child, Counter):
                child.inc()
            elif isinstance(child, Gauge):
                child.set(1)
            elif isinstance(child, Histogram):
                child.observe(0.5)
            else:  # pragma: no cover - a new metric type needs a branch here
                raise AssertionError(f"no way to touch {family!r}")


def scrape(metrics: ProcessMetrics) -> dict[str, Metric]:
    touch(metrics)
    text = generate_latest(metrics.registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def name_problems(family: Metric) -> list[str]:
    """Where ``family`` breaks the naming rule (see ``mxref.metrics``'s docstring)."""
    name, problems = family.name, []
    if not name.startswith("mxref_") and name not in MODELEXPRESS_FAMILIES:
        problems.append(f"{name}: neither mxref_* nor a ModelExpress family")
    words = name.split("_")
    for unit in UNITS & set(words):
        if words[-1] != unit:
            problems.append(f"{name}: the unit {unit!r} must come last (then _total on a counter)")
    if NON_BASE_UNITS & set(words):
        problems.append(f"{name}: use base units (seconds, bytes)")
    if family.type != "counter" and name.endswith("_total"):
        problems.append(f"{name}: only counters end in _total")
    for sample in family.samples:
        if sample.name.endswith("_created"):
            problems.append(f"{sample.name}: a _created series")
        elif family.type == "counter" and sample.name != f"{name}_total":
            problems.append(f"{sample.name}: a counter's sample must be {name}_total")
    return problems


@pytest.mark.parametrize(("make", "expected"), [
    pytest.param(ServerMetrics, SERVER, id="server"),
    pytest.param(SourceMetrics, {"mx_build_info"} | SOURCE | NIXL, id="source"),
    pytest.param(ReaderMetrics, {"mx_build_info"} | READER | NIXL, id="reader"),
    pytest.param(lambda: ReaderMetrics(serve_after_load=True), {"mx_build_info"} | READER | NIXL | SOURCE,
                 id="reader-serve-after-load"),
])
def test_each_role_exports_exactly_its_families_with_prometheus_names(
    make: Callable[[], ProcessMetrics], expected: set[str]
) -> None:
    families = scrape(make())
    assert set(families) == expected
    assert [p for f in families.values() for p in name_problems(f)] == []
    assert all(f.samples for f in families.values()), "touch() missed a family"


def test_build_info_names_the_component() -> None:
    families = scrape(SourceMetrics())
    (sample,) = families["mx_build_info"].samples
    assert sample.labels["component"] == "source" and sample.value == 1


def test_the_naming_rule_rejects_what_it_should() -> None:
    bad = Metric("mxref_bytes_loaded", "", "counter")
    bad.add_sample("mxref_bytes_loaded_total", {}, 1)
    bad.add_sample("mxref_bytes_loaded_created", {}, 1)
    assert len(name_problems(bad)) == 2
    assert name_problems(Metric("foo_latency_ms", "", "gauge")) != []
    assert name_problems(Metric("mxref_things_total", "", "gauge")) != []


def test_roles_do_not_share_a_registry() -> None:
    one, two = ReaderMetrics(), ReaderMetrics()
    one.reader.loads.labels("rdma", "verified").inc()
    assert two.registry.get_sample_value("mxref_loads_total", {"path": "rdma", "integrity": "verified"}) is None
