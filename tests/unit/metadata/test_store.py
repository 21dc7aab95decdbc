"""The in-memory store: its indexes answer every query as a scan over all records would, the
reaper's rules applied in batches, and the workers of one source share one identity."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fixtures.metadata_stack import (
    INITIALIZING,
    READY,
    STALE,
    T0,
    TIMERS,
    ManualClock,
    identity,
    worker,
)

from mxref.config import ServerTimers
from mxref.identity import mx_source_id
from mxref.metadata.query import SourceQuery, is_fresh, reap_action
from mxref.metadata.records import ReapAction, SourceRecord, UpdateRejected
from mxref.metadata.store import Store

# --- the indexed store answers as a scan would ------------------------------------------
from mxref.v1 import p2p_pb2


class ScanModel:
    """The store's rules applied by brute force: every query and every sweep reads every record."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.records: dict[tuple[str, str], SourceRecord] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def publish(self, ident: p2p_pb2.SourceIdentity, work: p2p_pb2.WorkerMetadata, wid: str,
                status: p2p_pb2.SourceStatus) -> None:
        record = SourceRecord(mx_source_id(ident), wid, ident, work, status, self.now_ms())
        self.records[record.key] = record

    def update(self, sid: str, wid: str, rank: int, status: p2p_pb2.SourceStatus) -> bool:
        record = self.records.get((sid, wid))
        if record is None or record.worker.worker_rank != rank:
            return False
        self.records[record.key] = SourceRecord(sid, wid, record.identity, record.worker, status, self.now_ms())
        return True

    def reap(self, timers: ServerTimers) -> set[tuple[str, tuple[str, str]]]:
        done = set()
        now_ms = self.now_ms()
        for key, record in list(self.records.items()):
            action = reap_action(record, now_ms, timers)
            if action is ReapAction.MARK_STALE:
                self.records[key] = SourceRecord(*key, record.identity, record.worker, STALE, record.updated_at_ms)
            elif action is ReapAction.DELETE:
                del self.records[key]
            if action is not None:
                done.add((action.value, key))
        return done

    def query(self, query: SourceQuery, timers: ServerTimers) -> list[tuple[str, str]]:
        now_ms = self.now_ms()
        chosen = [r for r in self.records.values() if query.matches(r)
                  and (query.status != READY or is_fresh(r, now_ms, timers.heartbeat_timeout_s))]
        chosen.sort(key=lambda r: (-r.updated_at_ms, r.mx_source_id, r.worker_id))
        return [r.key for r in (chosen[: query.limit] if query.limit > 0 else chosen)]


STATUSES = (INITIALIZING, READY, STALE, p2p_pb2.SOURCE_STATUS_UNKNOWN)


def random_query(rng: random.Random, sids: list[str]) -> SourceQuery:
    return SourceQuery(
        mx_source_id=rng.choice([None, rng.choice(sids), "no-such-source"]),
        status=rng.choice([None, *STATUSES]),
        model_name=rng.choice([None, "m0", "m1"]),
        worker_rank=rng.choice([None, 0, 1, 2]),
        min_updated_at_ms=rng.choice([0, 0, int(T0 * 1000) + rng.randrange(0, 400_000)]),
        limit=rng.choice([0, 0, 1, 3]),
    )


@pytest.mark.parametrize("seed", range(12))
def test_indexed_store_answers_as_a_scan_over_random_operations(seed: int) -> None:
    """Publishes, heartbeats, status reports, clock steps (some backwards), reaper passes in
    small batches: after each, the store holds what the scan model holds, and every query,
    count and reap gives the scan's answer."""
    rng = random.Random(seed)
    timers = ServerTimers(heartbeat_timeout_s=rng.choice([0.3, 30.0, 90.0]), reaper_scan_interval_s=1,
                          gc_timeout_s=rng.choice([60.0, 200.0]))
    clock = ManualClock()
    store, model = Store(clock), ScanModel(clock)
    idents = [identity(f"m{i % 2}", tp=1 + i // 2) for i in range(4)]
    sids = [mx_source_id(i) for i in idents]
    wids = [f"w{i}" for i in range(12)]
    reaped = 0
    for step in range(400):
        op = rng.random()
        if op < 0.25:
            ident, wid, rank = rng.choice(idents), rng.choice(wids), rng.randrange(3)
            status = rng.choice(STATUSES)
            store.publish(ident, worker(rank, status), wid, status)
            model.publish(ident, worker(rank, status), wid, status)
        elif op < 0.6:
            sid, wid, rank = rng.choice(sids), rng.choice(wids), rng.randrange(3)
            status = rng.choice(STATUSES)
            expected = model.update(sid, wid, rank, status)
            try:
                store.update_status(sid, wid, rank, status)
                assert expected
            except UpdateRejected:
                assert not expected
        elif op < 0.8:
            clock.advance(rng.choice([0.0, 0.0005, 0.2, 5.0, 40.0, 100.0, -3.0]))
        else:
            batch = rng.choice([1, 2, 1024])
            done = {(d.action.value, d.record.key) for d in store.reap(timers, batch=batch)}
            assert done == model.reap(timers), f"step {step}"
            reaped += len(done)
        assert {r.key: r for r in store.snapshot()} == model.records, f"step {step}"
        for status in STATUSES:
            assert store.count(status) == sum(1 for r in model.records.values() if r.status == status)
        for _ in range(3):
            query = random_query(rng, sids)
            answer = model.query(query, timers)
            got = [r.key for r in query.select(store.candidates(query), store.now_ms(), timers.heartbeat_timeout_s)]
            assert got == answer, f"step {step}: {query}"
            listed = [r.key for r in store.listing(query, timers.heartbeat_timeout_s)]
            assert listed == answer, f"step {step}: listing {query}"
    assert reaped > 0  # the reaper had something to do (else the comparison proved little)


def test_reap_applies_the_reapers_rules_in_batches(tmp_path: Path) -> None:
    """A mass expiry is applied in batches (the lock is let go between them) and gives what one
    pass gives; a record demoted now is not deleted in the same pass."""
    clock = ManualClock()
    store = Store(clock)
    for i in range(10):
        store.publish(identity(), worker(), f"w{i}", READY)
    clock.advance(TIMERS.gc_timeout_s + 1)  # older than both timeouts
    done = store.reap(TIMERS, batch=3)
    assert sorted(d.record.worker_id for d in done) == sorted(f"w{i}" for i in range(10))
    assert {d.action for d in done} == {ReapAction.MARK_STALE}
    assert store.count(STALE) == 10
    done = store.reap(TIMERS, batch=3)
    assert [d.action for d in done] == [ReapAction.DELETE] * 10
    assert len(store) == 0
    assert store.candidates(SourceQuery()) == []


def test_the_workers_of_one_source_share_its_identity_message() -> None:
    """Fewer objects for a fleet: records of one source hold one identity message (an equal one
    is not copied again); a heartbeat keeps it, and another source has its own."""
    store = Store(ManualClock())
    first = store.publish(identity(), worker(0), "w0", READY)
    second = store.publish(identity(), worker(1), "w1", READY)
    other = store.publish(identity("acme/model-b"), worker(0), "w0", READY)
    assert second.identity is first.identity
    assert other.identity is not first.identity and other.identity.model_name == "acme/model-b"
    beat = store.update_status(second.mx_source_id, "w1", 1, READY).record
    assert beat.identity is first.identity
