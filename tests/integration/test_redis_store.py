"""The store contract, on both stores: the in-memory ``Store`` and ``RedisStore`` on a real redis-server.

Every contract test runs twice (``store`` is parametrized), so the two implementations are held
to one behaviour; the Redis-only tests pin what only Redis has: ModelExpress's key layout, a
heartbeat that does not rewrite the record, the freshness compare-and-set, a wiped store
(FLUSHALL), a paused one (SIGSTOP: bounded failures, not hangs, and recovery), and the server
process over ``--store redis://``: negative answers while Redis is paused, the store metrics,
recovery after SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from harness.subjects.redisd import RedisServer, redis_available
from mxref import config
from mxref.identity import mx_source_id
from mxref.metadata.query import SourceQuery
from mxref.metadata.records import READY, STALE, ReapAction, StoreFull, StoreUnavailable, UpdateRejected
from mxref.metadata.redis_store import RedisStore
from mxref.metadata.store import SourceStore, Store
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(redis_available() is None, reason="redis-server is not installed (.ci/bootstrap installs it)"),
]

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_750_000_000.0
IDENTITY = p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/tiny", dtype="float16")
SID = mx_source_id(IDENTITY)
TIMERS = config.ServerTimers(heartbeat_timeout_s=10.0, reaper_scan_interval_s=1.0, gc_timeout_s=30.0)


class ManualClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def worker(rank: int = 0, blob: bytes = b"nixl-blob") -> p2p_pb2.WorkerMetadata:
    return p2p_pb2.WorkerMetadata(
        worker_rank=rank, nixl_metadata=blob, accelerator="cpu", agent_name=f"agent-{rank}",
        worker_grpc_endpoint="127.0.0.1:6555",
        tensors=[p2p_pb2.TensorDescriptor(name="w", addr=2**63 + 5, size=4096, device_id=0, dtype="torch.float16")],
    )


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def flushed(redis_server: RedisServer) -> Iterator[redis.Redis]:
    raw = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    raw.flushall()
    try:
        yield raw
    finally:
        raw.close()


StoreFactory = Callable[[ManualClock], SourceStore]


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    opened: list[RedisStore] = []
    if request.param == "memory":
        yield lambda clock: Store(clock)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    request.getfixturevalue("flushed")

    def make(clock: ManualClock) -> SourceStore:
        store = RedisStore(server.url, clock, timeout_s=2.0)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


# --- the contract, on both stores ----------------------------------------------------------


def test_publish_then_get_returns_the_whole_record(make_store: StoreFactory) -> None:
    clock = ManualClock()
    store = make_store(clock)
    published = store.publish(IDENTITY, worker(), "w1", READY)
    got = store.get(SID, "w1")
    assert got is not None
    assert (got.mx_source_id, got.worker_id, got.status, got.updated_at_ms) == (SID, "w1", READY, int(T0 * 1000))
    assert got.worker == worker() and got.identity == IDENTITY
    assert published.key == got.key
    assert store.get(SID, "nobody") is None


def test_heartbeat_restamps_and_changes_status_and_reports_the_previous(make_store: StoreFactory) -> None:
    clock = ManualClock()
    store = make_store(clock)
    store.publish(IDENTITY, worker(), "w1", READY)
    clock.now += 5
    change = store.update_status(SID, "w1", 0, STALE)
    assert change.previous == READY and change.record.status == STALE
    got = store.get(SID, "w1")
    assert got is not None and (got.status, got.updated_at_ms) == (STALE, int((T0 + 5) * 1000))
    assert got.worker == worker()  # the record itself is what was published


def test_update_of_an_unknown_worker_or_a_wrong_rank_is_rejected(make_store: StoreFactory) -> None:
    store = make_store(ManualClock())
    store.publish(IDENTITY, worker(rank=1), "w1", READY)
    with pytest.raises(UpdateRejected, match="no worker 'w2'"):
        store.update_status(SID, "w2", 1, READY)
    with pytest.raises(UpdateRejected, match="worker_rank 0 does not match the rank 1"):
        store.update_status(SID, "w1", 0, READY)


def test_listing_filters_and_keeps_ready_fresh_at_query_time(make_store: StoreFactory) -> None:
    clock = ManualClock()
    store = make_store(clock)
    other = p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/other", dtype="float16")
    store.publish(IDENTITY, worker(0), "old", READY)
    clock.now += 8
    store.publish(IDENTITY, worker(1), "new", READY)
    store.publish(other, worker(0), "x", READY)
    query = SourceQuery(mx_source_id=SID, status=READY)
    assert [r.worker_id for r in query.select(store.candidates(query), store.now_ms(), 10.0)] == ["new", "old"]
    clock.now += 4  # "old" is 12 s old now: past the 10 s heartbeat timeout, not yet reaped
    assert [r.worker_id for r in query.select(store.candidates(query), store.now_ms(), 10.0)] == ["new"]
    everything = SourceQuery()
    assert sorted(r.worker_id for r in everything.select(store.candidates(everything), store.now_ms(), 10.0)) == [
        "new", "old", "x"]
    ranked = SourceQuery(worker_rank=1)
    assert [r.worker_id for r in ranked.select(store.candidates(ranked), store.now_ms(), 10.0)] == ["new"]


def test_reaper_demotes_then_deletes_and_counts(make_store: StoreFactory) -> None:
    clock = ManualClock()
    store = make_store(clock)
    store.publish(IDENTITY, worker(0), "silent", READY)
    store.publish(IDENTITY, worker(1), "alive", READY)
    clock.now += 11
    store.update_status(SID, "alive", 1, READY)
    done = store.reap(TIMERS)
    assert [(d.action, d.record.worker_id) for d in done] == [(ReapAction.MARK_STALE, "silent")]
    assert (store.count(READY), store.count(STALE), len(store)) == (1, 1, 2)
    got = store.get(SID, "silent")
    assert got is not None and got.status == STALE and got.updated_at_ms == int(T0 * 1000)  # the clock not restarted
    clock.now += 30
    store.update_status(SID, "alive", 1, READY)
    assert [(d.action, d.record.worker_id) for d in store.reap(TIMERS)] == [(ReapAction.DELETE, "silent")]
    assert store.get(SID, "silent") is None
    store.snapshot()
    assert (store.count(READY), store.count(STALE), len(store)) == (1, 0, 1)


def test_a_republish_replaces_the_record(make_store: StoreFactory) -> None:
    clock = ManualClock()
    store = make_store(clock)
    store.publish(IDENTITY, worker(0, b"first"), "w1", INITIALIZING := p2p_pb2.SOURCE_STATUS_INITIALIZING)
    clock.now += 1
    store.publish(IDENTITY, worker(2, b"second"), "w1", READY)
    got = store.get(SID, "w1")
    assert got is not None and got.worker == worker(2, b"second") and got.status == READY
    assert got.status != INITIALIZING
    assert len(store.snapshot()) == 1


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_the_record_limit_is_exact_at_publish_and_the_owner_is_kept_with_the_record(
        request: pytest.FixtureRequest, backend: str) -> None:
    """Five records fill a store of five at once, with no reaper scan in between (before, on
    Redis, the count was the last scan's: a store that had never been scanned took any number),
    and a second server on the same Redis counts the same records; a replacement still fits; the
    owner is kept with its record and goes with it."""
    clock = ManualClock()
    opened: list[RedisStore] = []

    def make() -> SourceStore:
        if backend == "memory":
            return Store(clock, max_records=5)
        server: RedisServer = request.getfixturevalue("redis_server")
        request.getfixturevalue("flushed")
        opened.append(RedisStore(server.url, clock, max_records=5, timeout_s=2.0))
        return opened[-1]

    try:
        store = make()
        for i in range(5):
            store.publish(IDENTITY, worker(), f"w{i}", READY)
        with pytest.raises(StoreFull):
            store.publish(IDENTITY, worker(), "w5", READY)
        if opened:  # another server over the same store
            with pytest.raises(StoreFull):
                RedisStore(opened[0].url, clock, max_records=5).publish(IDENTITY, worker(), "w5", READY)
        store.publish(IDENTITY, worker(), "w0", READY, "cd" * 32)  # a replacement fits
        store.publish(IDENTITY, worker(), "w1", READY, "ab" * 32)
        assert len(store) == 5
        assert store.owner((SID, "w0")) == "cd" * 32 and store.owner((SID, "w1")) == "ab" * 32
        assert store.holds((SID, "w1")) and not store.holds((SID, "w9")) and store.owner((SID, "w9")) is None
        got = store.get(SID, "w0")
        assert got is not None and got.worker == worker()  # the owner field is not read as a rank
        timers = config.ServerTimers(heartbeat_timeout_s=1, reaper_scan_interval_s=1, gc_timeout_s=1)
        for _ in range(2):  # STALE, then deleted
            clock.now += 10
            store.reap(timers)
        assert not store.holds((SID, "w0")) and store.owner((SID, "w0")) is None and len(store) == 0
    finally:
        for opened_store in opened:
            opened_store.close()


# --- Redis only ------------------------------------------------------------------------------


def test_modelexpress_key_layout_and_a_heartbeat_does_not_rewrite_the_record(
    redis_server: RedisServer, flushed: redis.Redis,
) -> None:
    clock = ManualClock()
    store = RedisStore(redis_server.url, clock)
    store.publish(IDENTITY, worker(3), "w1", READY)
    source_key, worker_key = f"mx:source:{SID}", f"mx:source:{SID}:w1"
    # ModelExpress's two keys, plus mxref's age index (the reaper's; not part of ModelExpress's layout)
    assert sorted(flushed.keys("*")) == [source_key.encode(), worker_key.encode(), b"mxref:age:2"]
    assert flushed.zscore("mxref:age:2", f"{SID}:w1") == int(T0 * 1000)
    assert sorted(flushed.hkeys(source_key)) == [b"__attributes__", b"w1"]
    assert sorted(flushed.hkeys(worker_key)) == [b"3", b"status:3"]
    record_before = flushed.hget(worker_key, "3")
    clock.now += 2
    store.update_status(SID, "w1", 3, STALE)
    assert flushed.hget(worker_key, "3") == record_before  # #607: the heartbeat wrote only the summaries
    summary = json.loads(flushed.hget(worker_key, "status:3") or b"{}")
    assert summary == {"worker_rank": 3, "status": STALE, "updated_at": int((T0 + 2) * 1000), "accelerator": "cpu"}
    assert json.loads(flushed.hget(source_key, "w1") or b"{}") == summary
    assert flushed.zscore("mxref:age:2", f"{SID}:w1") is None  # the index moved with the status
    assert flushed.zscore("mxref:age:3", f"{SID}:w1") == int((T0 + 2) * 1000)
    store.close()


def test_an_update_older_than_the_stored_one_is_not_applied(redis_server: RedisServer, flushed: redis.Redis) -> None:
    ahead, behind = ManualClock(T0 + 60), ManualClock(T0)  # two servers, one clock a minute behind
    store_ahead, store_behind = RedisStore(redis_server.url, ahead), RedisStore(redis_server.url, behind)
    store_ahead.publish(IDENTITY, worker(), "w1", READY)
    change = store_behind.update_status(SID, "w1", 0, STALE)
    assert change.record.status == READY  # the compare-and-set kept the fresher summary
    got = store_ahead.get(SID, "w1")
    assert got is not None and (got.status, got.updated_at_ms) == (READY, int((T0 + 60) * 1000))
    store_ahead.close()
    store_behind.close()


def test_a_wiped_store_is_empty_and_refuses_heartbeats(redis_server: RedisServer, flushed: redis.Redis) -> None:
    store = RedisStore(redis_server.url, ManualClock())
    store.publish(IDENTITY, worker(), "w1", READY)
    assert flushed.flushall()
    assert store.get(SID, "w1") is None and store.snapshot() == []
    with pytest.raises(UpdateRejected, match="no worker 'w1'"):
        store.update_status(SID, "w1", 0, READY)
    store.publish(IDENTITY, worker(), "w1", READY)  # a source publishing again is whole again
    assert store.get(SID, "w1") is not None
    store.close()


def test_a_paused_redis_fails_each_call_within_its_bound_then_recovers(redis_server: RedisServer, flushed: redis.Redis) -> None:
    errors: list[str] = []
    store = RedisStore(redis_server.url, ManualClock(), timeout_s=0.3, on_error=lambda op, exc: errors.append(op))
    store.publish(IDENTITY, worker(), "w1", READY)
    os.kill(redis_server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="list failed: TimeoutError"):
            store.candidates(SourceQuery(mx_source_id=SID))
        with pytest.raises(StoreUnavailable, match="update_status failed"):
            store.update_status(SID, "w1", 0, READY)
        # two calls, each at most (1 + 1 retry) x 0.3 s (and a reconnect): far below 10 s, never a hang
        assert time.monotonic() - started < 10.0
    finally:
        os.kill(redis_server.pid, signal.SIGCONT)
    assert errors == ["list", "update_status"]
    assert [r.worker_id for r in store.candidates(SourceQuery(mx_source_id=SID))] == ["w1"]
    store.close()


def test_a_store_url_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ValueError, match="expected 'memory' or redis://HOST:PORT"):
        RedisStore("http://127.0.0.1:6379")
    with pytest.raises(ValueError, match="needs a host and a port"):
        RedisStore("redis://127.0.0.1")


# --- the server process over Redis ----------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _wait_listening(events: Path, what: str, proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if events.exists():
            for line in events.read_text().splitlines():
                e = json.loads(line)
                if e["event"] == "listening" and e["what"] == what:
                    return int(e["port"])
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.05)
    pytest.fail(f"no listening {what} in 20 s: {log.read_text()}")


def test_server_process_on_redis_answers_negatively_while_redis_is_paused_and_recovers(
    tmp_path: Path, redis_server: RedisServer, flushed: redis.Redis,
) -> None:
    events, log = tmp_path / "server.events.jsonl", tmp_path / "server.log"
    argv = [sys.executable, "-m", "mxref", "server", "--name", "server", "--events", str(events), "--port", "0",
            "--metrics-port", "0", "--store", redis_server.url, "--store-timeout", "0.3"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        grpc_port = _wait_listening(events, "grpc", proc, log)
        metrics_port = _wait_listening(events, "metrics", proc, log)
        with MxClient(f"127.0.0.1:{grpc_port}", timeout_s=10) as client:
            published = client.publish_metadata(IDENTITY, worker(), "w1")
            assert published.success, published.message
            assert client.update_status(SID, "w1", 0, READY).success
            assert [r.worker_id for r in client.list_sources(IDENTITY, status_filter=READY)] == ["w1"]
            assert flushed.exists(f"mx:source:{SID}:w1")  # it really is in Redis
            os.kill(redis_server.pid, signal.SIGSTOP)
            try:
                assert client.list_sources(IDENTITY, status_filter=READY) == []
                heartbeat = client.update_status(SID, "w1", 0, READY)
                assert not heartbeat.success and "TimeoutError" in heartbeat.message
                assert not client.publish_metadata(IDENTITY, worker(), "w2").success
                assert client.get_metadata(SID, "w1").found is False
                samples = _scrape(metrics_port)
                assert samples[("mxref_server_store_up", ())] == 0
                assert samples[("mxref_server_store_errors_total", (("op", "update_status"),))] >= 1
            finally:
                os.kill(redis_server.pid, signal.SIGCONT)
            assert client.update_status(SID, "w1", 0, READY).success
            assert [r.worker_id for r in client.list_sources(IDENTITY, status_filter=READY)] == ["w1"]
            assert _scrape(metrics_port)[("mxref_server_store_up", ())] == 1
        [store_event] = [json.loads(line) for line in events.read_text().splitlines() if '"store"' in line]
        assert store_event["url"] == redis_server.url and store_event["reachable"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


# --- the two stores side by side on random histories ------------------------------------------

WORKERS = ("w1", "w2", "w3")
STATUSES = (p2p_pb2.SOURCE_STATUS_INITIALIZING, READY, STALE)
OPS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.sampled_from(WORKERS), st.integers(0, 1), st.sampled_from(STATUSES)),
    st.tuples(st.just("update"), st.sampled_from(WORKERS), st.integers(0, 1), st.sampled_from(STATUSES)),
    st.tuples(st.just("advance"), st.integers(1, 40)),
    st.tuples(st.just("reap")),
), max_size=25)


def _view(store: SourceStore) -> list[tuple[str, int, int, int]]:
    """What a listing says of every record: (worker, rank, status, updated_at), in name order."""
    now = store.now_ms()
    return [(r.worker_id, r.worker.worker_rank, int(r.status), r.updated_at_ms)
            for r in SourceQuery().select(store.candidates(SourceQuery()), now, 1e9)]


def _apply(store: SourceStore, op: tuple[Any, ...]) -> str:
    """One operation; its outcome as text (a rejection's kind, what the reaper did)."""
    if op[0] == "publish":
        store.publish(IDENTITY, worker(op[2]), op[1], op[3])
        return "published"
    if op[0] == "update":
        try:
            return f"updated from {int(store.update_status(SID, op[1], op[2], op[3]).previous)}"
        except UpdateRejected as exc:
            return "rejected: " + str(exc).split(" ")[0]
    if op[0] == "reap":
        return repr(sorted((d.action.value, d.record.worker_id) for d in store.reap(TIMERS)))
    return "advanced"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_memory_and_redis_agree_on_every_history(ops: list[tuple[Any, ...]], redis_server: RedisServer) -> None:
    clock = ManualClock()
    memory = Store(clock)
    on_redis = RedisStore(redis_server.url, clock, timeout_s=5.0)
    try:
        on_redis.flushall()
        for op in ops:
            if op[0] == "advance":
                clock.now += op[1]
                continue
            assert _apply(memory, op) == _apply(on_redis, op), op
            assert _view(memory) == _view(on_redis), op
            if op[0] == "reap":  # Redis's counts are as of its last scan: this one
                assert [memory.count(s) for s in STATUSES] == [on_redis.count(s) for s in STATUSES], op
                assert len(memory) == len(on_redis), op
            for wid in WORKERS:
                m, r = memory.get(SID, wid), on_redis.get(SID, wid)
                assert (m is None) == (r is None), (op, wid)
                if m is not None and r is not None:
                    assert (m.worker, m.status, m.updated_at_ms) == (r.worker, r.status, r.updated_at_ms), (op, wid)
    finally:
        on_redis.close()
