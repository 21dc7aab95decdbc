"""The whole load flow as real processes over real NIXL (UCX over TCP on loopback).

A metadata server, one or two sources and readers run as ``python -m mxref``
children (see ``procs.Cluster``); the CLI applies the ``ucx-tcp`` profile, so a
frozen source really wedges a READ, as it would across nodes. Timers are
compressed (heartbeats every 0.5 s, a 2 s heartbeat timeout, 2-3 s READ budgets)
and models are small (8 x 4 MiB).

Faults are aimed at whichever source the reader tries *first*: the test waits
for the reader's ``attempt_start`` event and signals that source. Freezing is
done in centralized mode, where the reader's next contact with the source is the
READ itself (in P2P mode a frozen source would already stall the manifest RPC).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import Cluster, Proc

from mxref.metrics import ReaderMetrics, SourceMetrics
from mxref.model import ModelSpec, generate, save_checkpoint
from mxref.roles.client import MxClient
from mxref.transfer.chunked import ChunkPolicy
from mxref.v1 import p2p_pb2

pytestmark = pytest.mark.integration

TENSORS, TENSOR_MIB = 8, 4
MODEL = ("--tensors", str(TENSORS), "--tensor-mib", str(TENSOR_MIB))
MODEL_BYTES = TENSORS * TENSOR_MIB << 20
BUDGET_S = 2.0
READER_TIMEOUT_S = 45.0
TEARDOWN_ORDER = ["stop_heartbeat", "mark_stale", "stop_worker_server", "disconnect_peers", "deregister", "drop_agent"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster") as c:
        c.start_server()
        yield c


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """The checkpoint of the model the CLI synthesizes from MODEL (same name, dtype, seed)."""
    spec = ModelSpec(name="mxref/synthetic", tensors=TENSORS, tensor_bytes=TENSOR_MIB << 20, dtype="float16", seed=0)
    path = tmp_path / "ck.safetensors"
    save_checkpoint(generate(spec), path, spec)
    return path


def reader_args(*extra: str) -> tuple[str, ...]:
    return ("--transfer-timeout", str(BUDGET_S), "--handshake-timeout", "5", *extra)


def start_sources(cluster: Cluster, *names: str, mode: str = "p2p") -> list[Proc]:
    procs = [cluster.start_source(n, "--mode", mode, model=MODEL, wait_ready=False) for n in names]
    for p in procs:
        cluster.wait_ready(p)
    return procs


def outcomes(reader: Proc) -> list[tuple[int, str, str]]:
    return [(e["index"], e["worker_id"], e["outcome"]) for e in reader.events("attempt_outcome")]


def first_tried(cluster: Cluster, reader: Proc, sources: list[Proc]) -> tuple[Proc, Proc]:
    """Wait for the reader's first attempt; (the source it tries, the other one)."""
    start = cluster.wait_event(reader, "attempt_start", where=lambda e: e["index"] == 0, timeout=20)
    victim = next(s for s in sources if s.info["worker_id"] == start["worker_id"])
    other = next(s for s in sources if s is not victim)
    return victim, other


def assert_loaded_from(cluster: Cluster, reader: Proc, source: Proc) -> dict[str, Any]:
    rc = cluster.wait_exit(reader, READER_TIMEOUT_S)
    assert rc == 0, cluster.report()
    result = reader.result()
    assert (result["ok"], result["path"], result["integrity"]) == (True, "rdma", "verified"), result
    assert result["worker_id"] == source.info["worker_id"], result
    assert result["bytes"] == MODEL_BYTES
    return result


def ready_worker_ids(cluster: Cluster) -> set[str]:
    assert cluster.server_address
    with MxClient(cluster.server_address, timeout_s=5) as client:
        return {r.worker_id for r in client.list_sources(status_filter=p2p_pb2.SOURCE_STATUS_READY)}


# ----------------------------------------------------------------------------- (a)


def test_a_verified_load_over_rdma(cluster: Cluster) -> None:
    (src,) = start_sources(cluster, "src-a")
    rd = cluster.run_reader("rd1", *reader_args(), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 0, cluster.report()
    result = assert_loaded_from(cluster, rd, src)
    assert result["source"] == src.info["agent_name"] and result["tensors"] == TENSORS
    assert outcomes(rd) == [(0, src.info["worker_id"], "success")]
    integrity = rd.events("integrity")[0]
    assert integrity["ok"] is True
    # checksums taken as the chunked READ landed them: how many depends on how the chunks came in (a
    # READ whose chunks all complete in one poll leaves every tensor to verify); unit tests pin the counting
    assert 0 <= integrity["hashed_during_read"] <= TENSORS
    assert rd.events("handshake")[0]["mode"] == "p2p"
    done = rd.events("transfer_done")[0]
    assert done["bytes"] == MODEL_BYTES and done["seconds"] < BUDGET_S
    assert 0 <= done["hashing_s"] < done["seconds"]  # the READ loop's share of the checksums (null: not hashing)
    clock = done["read_phases"]  # where the READ's time went, by phase (the bench sets it beside a raw READ's)
    assert clock["posts"] == len(done["chunk_ms"]) and clock["polls"] >= clock["posts"]
    assert 0 < clock["poll_s"] <= clock["total_s"] <= done["seconds"]
    # released in finally: removed, and the source told to drop our record (INVL)
    released = rd.events("peer_disconnected", where=lambda e: e["agent_name"] == src.info["agent_name"])
    assert released and released[0]["ok"] is True and released[0]["invalidated"] is True
    assert rd.events("exit")[-1]["code"] == 0
    assert "UCX_TLS" in rd.events("started")[0]["env"] and rd.events("started")[0]["env"]["UCX_TLS"] == "tcp"
    assert src.returncode is None, "the source outlives its reader"
    # where the load's time went: the READ's phase is the READ; fixed costs ran beside the load's path
    phases = {e["phase"]: e for e in rd.events("load_phase")}
    assert phases["read"]["seconds"] == pytest.approx(done["seconds"], abs=1e-3) and not phases["read"]["overlapped"]
    assert all(phases[p]["overlapped"] for p in ("warmup", "allocate", "agent", "register")), phases
    on_path = rd.events("load_done")[0]["phases"]
    assert {"list", "metadata", "wait_target", "handshake", "read", "verify"} <= set(on_path) and "agent" not in on_path
    assert sum(on_path.values()) <= result["seconds"] + 1e-3, (on_path, result["seconds"])


# ----------------------------------------------------------------------------- (b)


def test_a_reader_that_hashes_after_its_read_verifies_the_same(cluster: Cluster) -> None:
    """``--no-hash-while-reading`` (the bench's control): every checksum after the READ."""
    (src,) = start_sources(cluster, "src-a")
    rd = cluster.run_reader("rd1", *reader_args(), "--no-hash-while-reading", model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 0, cluster.report()
    assert_loaded_from(cluster, rd, src)
    integrity = rd.events("integrity")[0]
    assert integrity["ok"] is True and integrity["hashed_during_read"] == 0
    assert rd.events("transfer_done")[0]["hashing_s"] is None


def test_b_first_source_sigkilled_the_next_candidate_loads(cluster: Cluster) -> None:
    sources = start_sources(cluster, "src-a", "src-b")
    rd = cluster.start_reader("rd1", *reader_args("--selector", "rendezvous_hash"), model=MODEL)
    victim, other = first_tried(cluster, rd, sources)
    cluster.kill(victim)
    assert_loaded_from(cluster, rd, other)
    got = outcomes(rd)
    # killed before its manifest was served (a metadata miss) or mid-handshake/READ (a transfer retry)
    assert got[0][:2] == (0, victim.info["worker_id"]) and got[0][2] in ("metadata_miss", "transfer_retry"), got
    assert got[1] == (1, other.info["worker_id"], "success")


def test_b_source_sigkilled_mid_read_the_next_candidate_loads(cluster: Cluster) -> None:
    sources = start_sources(cluster, "src-a", "src-b", mode="central")
    rd = cluster.start_reader("rd1", *reader_args("--transfer-timeout", "10"), model=MODEL)
    victim, other = first_tried(cluster, rd, sources)
    cluster.freeze(victim)  # holds the READ in flight until the kill
    cluster.wait_event(rd, "transfer_start", where=lambda e: e["index"] == 0, timeout=10)
    cluster.kill(victim)
    assert_loaded_from(cluster, rd, other)
    assert outcomes(rd) == [(0, victim.info["worker_id"], "transfer_retry"), (1, other.info["worker_id"], "success")]
    error = rd.events("transfer_error", where=lambda e: e["index"] == 0)
    assert error, f"the kill should end the READ with an error, not the 10 s budget: {rd.events('transfer_timeout')}"
    assert error[0]["seconds"] < 5.0
    assert rd.events("handshake", where=lambda e: e["index"] == 0)[0]["mode"] == "central"


# ----------------------------------------------------------------------------- (c)


@pytest.mark.parametrize("chunk_mib", [0, None], ids=["single_handle", "default_chunked"])
def test_c_frozen_source_stalls_then_the_next_loads(cluster: Cluster, chunk_mib: int | None) -> None:
    """Seed behaviour (``--read-chunk-mib 0``, one handle): the READ ends at the budget. mxref's
    default (chunked): a stall one window deadline into the READ, well inside a 30 s budget."""
    budget = BUDGET_S if chunk_mib == 0 else 30.0
    flags = ("--read-chunk-mib", str(chunk_mib)) if chunk_mib is not None else ()
    sources = start_sources(cluster, "src-a", "src-b", mode="central")
    rd = cluster.start_reader("rd1", *reader_args("--transfer-timeout", str(budget), *flags), model=MODEL)
    victim, other = first_tried(cluster, rd, sources)
    try:
        cluster.freeze(victim)
        assert_loaded_from(cluster, rd, other)
    finally:
        cluster.thaw(victim)
    assert outcomes(rd) == [(0, victim.info["worker_id"], "transfer_retry"), (1, other.info["worker_id"], "success")]
    timeout = rd.events("transfer_timeout", where=lambda e: e["index"] == 0)
    assert timeout, rd.events("transfer_error")
    assert timeout[0]["budget_s"] == budget
    if chunk_mib == 0:
        assert not timeout[0]["stalled"] and budget <= timeout[0]["seconds"] < budget + 2.0, timeout[0]
    else:
        deadline = ChunkPolicy().first_deadline(MODEL_BYTES)  # frozen before its READ: the first window's
        assert timeout[0]["stalled"] and deadline <= timeout[0]["seconds"] < ChunkPolicy().stall_s + 2.0, timeout[0]
    # the resumed source is alive and serving again
    cluster.wait_event(victim, "heartbeat", where=lambda e: e["mono"] > timeout[0]["mono"] and e["ok"], timeout=10)
    assert victim.returncode is None


# ----------------------------------------------------------------------------- (d)


def test_d_no_source_falls_back_to_disk(cluster: Cluster, checkpoint: Path) -> None:
    rd = cluster.run_reader("rd1", *reader_args("--checkpoint", str(checkpoint)), model=MODEL,
                            timeout=READER_TIMEOUT_S)
    assert rd.returncode == 0, cluster.report()
    result = rd.result()
    assert (result["ok"], result["path"], result["integrity"]) == (True, "disk", "verified")
    assert result["source"] == str(checkpoint) and result["attempts"] == []
    assert rd.events("fallback")[0]["reason"] == "no source available"
    assert rd.events("load_done")[0]["path"] == "disk"


def test_d_only_source_frozen_falls_back_to_disk(cluster: Cluster, checkpoint: Path) -> None:
    (src,) = start_sources(cluster, "src-a", mode="central")
    rd = cluster.start_reader("rd1", *reader_args("--checkpoint", str(checkpoint)), model=MODEL)
    cluster.wait_event(rd, "attempt_start", timeout=20)
    try:
        cluster.freeze(src)
        rc = cluster.wait_exit(rd, READER_TIMEOUT_S)
    finally:
        cluster.thaw(src)
    assert rc == 0, cluster.report()
    result = rd.result()
    assert (result["ok"], result["path"]) == (True, "disk")
    assert outcomes(rd) == [(0, src.info["worker_id"], "transfer_fallback")]
    assert rd.events("fallback")[0]["reason"] == "no source succeeded"


@pytest.mark.parametrize("checkpoint_arg", [None, "missing.safetensors"], ids=["no-checkpoint", "missing-file"])
def test_d_no_source_and_no_checkpoint_exits_1(cluster: Cluster, tmp_path: Path, checkpoint_arg: str | None) -> None:
    extra = () if checkpoint_arg is None else ("--checkpoint", str(tmp_path / checkpoint_arg))
    rd = cluster.run_reader("rd1", *reader_args(*extra), model=MODEL, timeout=READER_TIMEOUT_S)
    assert rd.returncode == 1, cluster.report()
    result = rd.result()
    assert result["ok"] is False and result["path"] == "none"
    message = [line for line in rd.log().splitlines() if line.startswith("mxref reader: no verified load")]
    assert message, rd.tail()
    assert "no source available" in message[0]
    if checkpoint_arg is None:
        assert "no checkpoint" in message[0]
    else:
        assert checkpoint_arg in message[0]
    assert rd.events("load_failed")[0]["error"] == result["error"]


# ----------------------------------------------------------------------------- (e) (f)


@pytest.mark.parametrize("how", ["skip-release", "skip-release-same-name", "sigkill-after-load"])
def test_e_a_reader_that_departs_without_disconnecting_does_not_wedge_the_source(cluster: Cluster, how: str) -> None:
    (src,) = start_sources(cluster, "src-a")
    name_args = ("--agent-name", "rd-fixed") if how == "skip-release-same-name" else ()
    if how == "sigkill-after-load":
        # killed while it still holds its agent (serving), so nothing of its own teardown runs
        rd1 = cluster.start_reader("rd1", *reader_args("--serve-after-load", "--heartbeat-interval", "0.5",
                                                       *name_args), model=MODEL)
        cluster.wait_event(rd1, "load_done", timeout=READER_TIMEOUT_S)
        cluster.wait_ready(rd1)  # the result line is printed before it starts serving
        cluster.kill(rd1)
        assert rd1.returncode == -signal.SIGKILL
    else:
        rd1 = cluster.run_reader("rd1", *reader_args("--skip-release", *name_args), model=MODEL,
                                 timeout=READER_TIMEOUT_S)
        assert rd1.returncode == 0, cluster.report()
        assert rd1.events("exit")[-1].get("simulated") == "skip_release"
        assert not rd1.events("peer_disconnected"), "the simulated bug must not disconnect"
        assert not rd1.events("shutdown_step"), "os._exit: no NIXL teardown"
    assert rd1.result()["path"] == "rdma"
    rd2 = cluster.start_reader("rd2", *reader_args(*name_args), model=MODEL)
    result = assert_loaded_from(cluster, rd2, src)
    *before, last = result["attempts"]
    assert last["outcome"] == "success" and last["worker_id"] == src.info["worker_id"]
    # A killed reader that had become a source stays listed READY until the server's heartbeat
    # timeout: rd2 may pick it first, and must then lose only that candidate (a metadata miss).
    assert all(a["outcome"] == "metadata_miss" for a in before), result["attempts"]
    assert len(before) <= (1 if how == "sigkill-after-load" else 0), result["attempts"]
    assert src.returncode is None


def test_f_a_reader_restarted_under_its_old_agent_name_still_loads(cluster: Cluster) -> None:
    (src,) = start_sources(cluster, "src-a")
    for name in ("rd-first", "rd-second"):
        rd = cluster.start_reader(name, *reader_args("--agent-name", "rd-fixed"), model=MODEL)
        assert_loaded_from(cluster, rd, src)
        assert "Initialized NIXL agent: rd-fixed" in rd.stdout() + rd.log()  # NIXL logs to stdout


# ----------------------------------------------------------------------------- (g)


def test_g_metrics_of_a_reader_that_became_a_source(cluster: Cluster) -> None:
    (src,) = start_sources(cluster, "src-a")
    rd1 = cluster.start_reader("rd1", *reader_args("--serve-after-load", "--serve-seconds", "20",
                                                   "--heartbeat-interval", "0.5"), model=MODEL)
    cluster.wait_event(rd1, "load_done", timeout=READER_TIMEOUT_S)
    cluster.wait_ready(rd1)
    families = cluster.scrape(rd1)
    assert set(families) == ReaderMetrics(serve_after_load=True).family_names()
    s = Cluster.sample
    assert s(families, "mx_p2p_source_attempts_total", result="success") == 1
    assert s(families, "mx_p2p_source_attempts_total", result="transfer_retry") in (None, 0)
    assert s(families, "mxref_loads_total", path="rdma", integrity="verified") == 1
    assert s(families, "mx_p2p_candidates_count", stage="listed") == 1
    assert s(families, "mxref_source_status", status="READY") == 1
    assert s(families, "mxref_data_plane_healthy") == 1
    assert rd1.info["worker_id"] in ready_worker_ids(cluster)

    src_families = cluster.scrape(src)
    assert set(src_families) == SourceMetrics().family_names()
    assert s(src_families, "mxref_source_manifest_requests_total", result="ok") == 1
    assert s(src_families, "mxref_registered_bytes") == MODEL_BYTES
    assert (s(src_families, "mxref_source_heartbeats_total", status="READY", result="ok") or 0) >= 1

    # the first source leaves; the reader-turned-source now feeds the next reader
    cluster.signal(src, signal.SIGTERM)
    assert cluster.wait_exit(src, 15) == 0
    rd2 = cluster.start_reader("rd2", *reader_args(), model=MODEL)
    result = assert_loaded_from(cluster, rd2, rd1)
    assert result["source"].startswith("rd1-")
    assert s(cluster.scrape(rd1), "mxref_source_manifest_requests_total", result="ok") == 1
    cluster.signal(rd1, signal.SIGTERM)
    assert cluster.wait_exit(rd1, 15) == 0


# ----------------------------------------------------------------------------- (h)


def test_h_sigterm_tears_a_source_down_in_order(cluster: Cluster) -> None:
    (src,) = start_sources(cluster, "src-a")
    assert src.info["worker_id"] in ready_worker_ids(cluster)
    cluster.signal(src, signal.SIGTERM)
    assert cluster.wait_exit(src, 15) == 0, cluster.report()
    assert src.info["worker_id"] not in ready_worker_ids(cluster), "still listed READY after a clean exit"
    steps = src.events("shutdown_step")
    assert [e["step"] for e in steps] == TEARDOWN_ORDER, steps
    assert all(e["ok"] for e in steps), steps
    assert steps[1]["detail"] is True, "mark_stale was accepted by the server"
    assert src.events("signal")[0]["name"] == "SIGTERM"
    assert src.events("exit")[-1]["code"] == 0
    assert cluster.server is not None
    stale = cluster.server.events("source_status", where=lambda e: e["worker_id"] == src.info["worker_id"])
    assert [(e["status"], e["by"]) for e in stale][-1:] == [("STALE", "rpc")], stale


def test_h2_sigterm_of_a_source_is_bounded_when_the_server_hangs(cluster: Cluster) -> None:
    """A frozen metadata server must not hold a terminating source past its grace period.

    Regression: a heartbeat stuck in flight held the publisher's lock for its 30 s
    deadline and the last STALE waited another 30 s, so teardown took a minute.
    """
    (src,) = start_sources(cluster, "src-a")
    assert cluster.server is not None
    cluster.freeze(cluster.server)
    time.sleep(1.0)  # let a heartbeat get stuck in flight
    t0 = time.monotonic()
    cluster.signal(src, signal.SIGTERM)
    assert cluster.wait_exit(src, 20) == 0, cluster.report()
    elapsed = time.monotonic() - t0
    cluster.thaw(cluster.server)
    assert elapsed < 10.0, f"teardown took {elapsed:.1f}s with the server frozen"
    steps = [e["step"] for e in src.events("shutdown_step")]
    assert steps == TEARDOWN_ORDER, steps
