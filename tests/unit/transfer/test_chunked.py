"""Chunked READs: a stalled source is detected by a per-window deadline, not the whole budget.

A wedged data plane gives neither a completion nor an error, so with one handle only the
budget ends the wait. With a window of chunk handles, a window that completes nothing within
``ChunkPolicy.stall_s`` is a stall: health goes down with a "stalled" error, every in-flight
handle is released, and ``TransferStalled`` (a ``TransferTimeout``) is raised.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pytest
from fixtures.chunk_agent import MIB, ChunkAgent, manager
from hypothesis import given, settings
from hypothesis import strategies as st

from mxref.errors import ReadFailure, TransferFailed, TransferStalled, TransferTimeout
from mxref.transfer.chunked import ChunkPolicy, split_ranges


def test_split_ranges_covers_every_byte_once_in_bounded_chunks() -> None:
    pairs = [((0, 10, 0), (100, 10, 0)), ((50, 25, 0), (200, 25, 0))]
    chunks = split_ranges(pairs, 16)
    assert all(sum(r[0][1] for r in c) <= 16 for c in chunks)
    covered = [(lo[0] + k, ro[0] + k) for c in chunks for lo, ro in c for k in range(lo[1])]
    expected = [(0 + k, 100 + k) for k in range(10)] + [(50 + k, 200 + k) for k in range(25)]
    assert covered == expected


def test_the_first_window_ramps_up_so_chunks_finish_one_at_a_time() -> None:
    pairs = [((0, 100, 0), (1000, 100, 0))]
    sizes = [sum(r[0][1] for r in c) for c in split_ranges(pairs, 16, ramp=4)]
    assert sizes == [4, 8, 12, 16, 16, 16, 16, 12]
    assert [sum(r[0][1] for r in c) for c in split_ranges(pairs, 16)] == [16] * 6 + [4]
    assert [sum(r[0][1] for r in c) for c in ChunkPolicy(chunk_bytes=16, window=2, ramp=False).split(pairs)] == [16] * 6 + [4]
    assert [sum(r[0][1] for r in c) for c in ChunkPolicy(chunk_bytes=16, window=2).split(pairs)] == [16] * 6 + [4]  # the probe: at most a chunk
    assert [sum(r[0][1] for r in c) for c in split_ranges(pairs, 16, ramp=4, probe=2)] == [2, 8, 12, 16, 16, 16, 16, 14]
    assert [sum(r[0][1] for r in c) for c in split_ranges(pairs, 1, ramp=4)] == [1] * 100  # nothing below a byte


def test_the_deadline_is_the_bytes_in_flight_at_the_floor_plus_the_slack() -> None:
    p = ChunkPolicy()  # 16 MiB x 2, 100 MB/s (25 MB/s at least after a completion), 0.5 s
    assert p.stall_s == pytest.approx(32 * MIB / 25e6 + 0.5)  # a full window at the least rate: 1.842 s
    assert p.first_deadline(64 * MIB) == pytest.approx(1 * MIB / 100e6 + 0.5)  # the 1 MiB probe alone: 0.510 s
    assert p.first_deadline(MIB // 2) == pytest.approx(MIB / 2 / 100e6 + 0.5)
    assert ChunkPolicy(chunk_bytes=MIB // 4).first_deadline(4 * MIB) == pytest.approx(MIB / 4 / 100e6 + 0.5)
    assert ChunkPolicy(ramp=False).first_deadline(64 * MIB) == pytest.approx(32 * MIB / 100e6 + 0.5)
    assert p.deadline(32 * MIB) == pytest.approx(32 * MIB / 100e6 + 0.5)  # nothing landed yet: the floor


def test_after_a_completion_a_window_is_timed_at_half_the_observed_rate_within_the_floors() -> None:
    p = ChunkPolicy()
    assert p.bps_after(None) == p.bps_after(1e9) == p.bps_after(200e6) == 100e6  # a fast READ: as before
    assert p.bps_after(90e6) == pytest.approx(45e6)  # a reader with a share of a shared source
    assert p.bps_after(10e6) == p.bps_after(0.0) == 25e6  # never slower than least_bps: D stays bounded
    assert p.deadline(32 * MIB, 90e6) == pytest.approx(32 * MIB / 45e6 + 0.5)
    assert max(p.deadline(32 * MIB, r) for r in (0.0, 1e3, 1e6, 49e6, 51e6, 1e9)) == pytest.approx(p.stall_s)


class SharedSource(ChunkAgent):
    """A source shared with other readers: handle i completes ``delays[i]`` (the last one for
    the rest) seconds after its post; ``complete`` handles at most, then it freezes."""

    def __init__(self, delays: list[float], complete: int = 10**9) -> None:
        super().__init__(complete)
        self.delays = delays
        self.posted_at: dict[int, float] = {}

    def transfer(self, handle):  # type: ignore[no-untyped-def]
        self.posted_at[handle] = time.monotonic()
        return super().transfer(handle)  # type: ignore[no-untyped-call]

    def check_xfer_state(self, handle):  # type: ignore[no-untyped-def]
        delay = self.delays[min(handle, len(self.delays) - 1)]
        if handle < self.complete and time.monotonic() - self.posted_at[handle] >= delay:
            self.seen_done.add(handle)
            return "DONE"
        return "PROC"


def test_a_read_moving_slower_than_the_floor_is_not_a_stall_once_its_rate_is_seen() -> None:
    # 1 MiB (the probe, alone) lands in 0.1 s: ~10 MB/s, so later windows are timed at ~5 MB/s.
    # Each later chunk takes 0.6 s: at the floor (100 MB/s) its 7 MiB window's deadline is 0.37 s.
    policy = ChunkPolicy(chunk_bytes=4 * MIB, window=2, slack_s=0.3, least_bps=1e6)
    agent = SharedSource([0.1, 0.6])
    mgr, remote = manager(agent, tensors=2, size=4 * MIB)  # 1 + 4 + 3 MiB
    assert mgr.receive_from_source(b"", remote, 30.0, "src", chunks=policy)[2] == "complete"
    assert agent.max_inflight <= 2 and agent.posted == [0, 1, 2]
    # the same READ timed at the floor throughout (the rule before the observed rate): a false stall
    fixed = ChunkPolicy(chunk_bytes=4 * MIB, window=2, slack_s=0.3, least_bps=100e6)
    mgr, remote = manager(SharedSource([0.1, 0.6]), tensors=2, size=4 * MIB)
    with pytest.raises(TransferStalled, match="timed at 100 MB/s"):
        mgr.receive_from_source(b"", remote, 30.0, "src", chunks=fixed)


def test_a_source_frozen_after_slow_progress_is_still_a_stall_within_stall_s() -> None:
    policy = ChunkPolicy(chunk_bytes=4 * MIB, window=2, slack_s=0.3, least_bps=20e6)  # stall_s 0.72 s
    agent = SharedSource([0.2], complete=1)  # the first chunk lands slowly (~10 MB/s), then it freezes
    mgr, remote = manager(agent, tensors=2, size=4 * MIB)
    t0 = time.monotonic()
    with pytest.raises(TransferStalled) as err:
        mgr.receive_from_source(b"", remote, 30.0, "src", chunks=policy)
    elapsed = time.monotonic() - t0
    after_first = elapsed - 0.2
    assert policy.deadline(7 * MIB) <= after_first and elapsed < 0.2 + policy.stall_s + 0.5, elapsed
    assert err.value.chunks_done == 1 and "timed at 20 MB/s" in str(err.value)


def test_a_source_frozen_from_the_start_is_called_stalled_at_the_first_windows_deadline() -> None:
    agent = ChunkAgent(complete=0)
    mgr, remote = manager(agent)  # 4 x 8 MiB
    policy = ChunkPolicy(chunk_bytes=8 * MIB, window=4, floor_bps=25e6, slack_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(TransferStalled):
        mgr.receive_from_source(b"", remote, 30.0, "src", chunks=policy)
    stalled = time.monotonic() - t0
    first = policy.first_deadline(32 * MIB)  # the 1 MiB probe alone: 0.09 s; a full window 1.39 s
    assert first <= stalled < (first + policy.stall_s) / 2
    assert agent.posted == [0], "the first window is one chunk: nothing has told the reader its share yet"


def test_a_chunked_read_completes_with_a_bounded_window() -> None:
    agent = ChunkAgent()
    mgr, remote = manager(agent)
    nbytes, count, result = mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB))
    assert (nbytes, count, result) == (32 * MIB, 4, "complete")
    assert len(agent.posted) == 9 and sorted(agent.released) == list(range(9))  # 1 MiB (the probe), then 4 MiB each
    assert agent.max_inflight <= 2
    assert mgr.is_healthy()


def test_descriptor_lists_are_prepared_once_and_each_chunk_is_made_from_them_by_index() -> None:
    agent = ChunkAgent()
    mgr, remote = manager(agent)
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=3 * MIB))
    assert [name for name, _ in agent.prepped.values()] == ["NIXL_INIT_AGENT", "src"]
    (_, local), (_, far) = agent.prepped.values()
    read: list[tuple[int, int]] = []  # (local addr, remote addr) of every byte's first address, in chunk order
    for lidx, ridx in agent.chunk_indices:
        assert lidx == ridx and sum(int(local[i][1]) for i in lidx) <= 3 * MIB
        read += [(int(local[i][0]), int(far[i][0])) for i in lidx]
        assert all(local[i][1] == far[i][1] for i in lidx)
    assert sum(int(local[i][1]) for lidx, _ in agent.chunk_indices for i in lidx) == 32 * MIB
    assert len(set(read)) == len(read), "no piece is read twice"
    assert sorted(agent.dlists_released) == sorted(agent.prepped), "both prepared lists are released"


def test_a_stall_still_releases_the_prepared_lists() -> None:
    agent = ChunkAgent(complete=1)
    mgr, remote = manager(agent)
    with pytest.raises(TransferStalled):
        mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB, slack_s=0.05,
                                                                          floor_bps=1e9))
    assert sorted(agent.dlists_released) == sorted(agent.prepped)
    assert sorted(agent.released) == sorted(agent.posted)


def test_a_list_nixl_cannot_prepare_fails_the_read_and_releases_the_other() -> None:
    class NoRemote(ChunkAgent):
        def prep_xfer_dlist(self, name: str, descs: Any, mem: str) -> Any:
            if name != "NIXL_INIT_AGENT":
                raise RuntimeError("NIXL_ERR_NOT_FOUND")
            return super().prep_xfer_dlist(name, descs, mem)

    agent = NoRemote()
    mgr, remote = manager(agent)
    with pytest.raises(TransferFailed):
        mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB))
    assert "could not be prepared" in (mgr.data_plane_error or "")
    assert agent.dlists_released == [1000] and agent.posted == []


def test_a_frozen_source_is_a_stall_after_stall_s_not_the_budget() -> None:
    agent = ChunkAgent(complete=3)  # three chunks land, then the source freezes
    mgr, remote = manager(agent)
    policy = ChunkPolicy(chunk_bytes=4 * MIB, window=2, floor_bps=200e6, slack_s=0.1)  # stall_s ~0.14 s
    t0 = time.monotonic()
    with pytest.raises(TransferStalled) as err:
        mgr.receive_from_source(b"", remote, 30.0, "src", chunks=policy)
    elapsed = time.monotonic() - t0
    # chunks landed at once (a fast READ): its window is timed at the floor, within stall_s at most
    assert policy.deadline(8 * MIB) <= elapsed < policy.stall_s + 1.0, elapsed
    assert isinstance(err.value, TransferTimeout) and err.value.failure is ReadFailure.STALLED
    assert err.value.chunks_done == 3 < err.value.chunks, "the stall says how far the READ got"
    assert not mgr.is_healthy() and "stalled" in (mgr.data_plane_error or "")
    assert sorted(agent.released) == sorted(agent.posted), "every in-flight handle is released"


def test_the_budget_still_bounds_a_slow_but_moving_read() -> None:
    class Slow(ChunkAgent):
        def check_xfer_state(self, handle):  # type: ignore[no-untyped-def]
            time.sleep(0.05)  # each chunk takes 50 ms: progress, but 8 chunks exceed 0.2 s
            return "DONE"

    agent = Slow()
    mgr, remote = manager(agent)
    with pytest.raises(TransferTimeout) as err:
        mgr.receive_from_source(b"", remote, 0.2, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB, window=1))
    assert not isinstance(err.value, TransferStalled) and err.value.failure is ReadFailure.TIMED_OUT
    assert "timed out" in (mgr.data_plane_error or "")


def test_a_raised_nixl_error_fails_the_read_and_releases_what_is_in_flight() -> None:
    agent = ChunkAgent(complete=1, fail_at=1)
    mgr, remote = manager(agent)
    with pytest.raises(TransferFailed):
        mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB))
    assert sorted(agent.released) == sorted(agent.posted)
    assert "REMOTE_DISCONNECT" in (mgr.data_plane_error or "")


def test_a_later_success_clears_a_stall() -> None:
    agent = ChunkAgent(complete=0)
    mgr, remote = manager(agent)
    policy = ChunkPolicy(chunk_bytes=4 * MIB, floor_bps=1e9, slack_s=0.05)
    with pytest.raises(TransferStalled):
        mgr.receive_from_source(b"", remote, 5.0, "src", chunks=policy)
    agent.complete = 10**9
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=policy)
    assert mgr.is_healthy()


@pytest.mark.parametrize("bad", [dict(chunk_bytes=0), dict(window=0), dict(floor_bps=0), dict(slack_s=-1),
                                 dict(least_bps=0), dict(least_bps=200e6)])
def test_a_nonsensical_policy_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ChunkPolicy(**bad)


def test_a_quiet_window_calls_on_suspect_once_before_the_stall() -> None:
    agent = ChunkAgent(complete=3)  # three chunks land, then the source freezes
    mgr, remote = manager(agent)
    policy = ChunkPolicy(chunk_bytes=4 * MIB, window=2, floor_bps=200e6, slack_s=0.1)
    calls: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(TransferStalled):
        mgr.receive_from_source(b"", remote, 30.0, "src", chunks=policy,
                                on_suspect=lambda: calls.append(time.monotonic() - t0))
    stalled = time.monotonic() - t0
    assert len(calls) == 1, calls
    # three chunks done (2, 4, 4 MiB), then 4 + 4 MiB in flight: a full window's deadline
    assert policy.deadline(8 * MIB) / 2 <= calls[0] < stalled


def test_a_read_that_keeps_completing_never_calls_on_suspect() -> None:
    agent = ChunkAgent()
    mgr, remote = manager(agent)
    calls: list[int] = []
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB),
                            on_suspect=lambda: calls.append(1))
    assert calls == []


# ------------------------------------------------------------------ checksums as the chunks land


def _arena(sizes: list[int]) -> Any:
    from mxref.model import Arena, TensorSpec

    arena = Arena([TensorSpec(f"t{i}", (n,), "uint8") for i, n in enumerate(sizes)])
    arena.buffer[:] = np.random.default_rng(5).integers(0, 256, arena.nbytes, dtype=np.uint8)
    return arena


def test_checksums_taken_as_chunks_land_equal_the_whole_arena_hashed_after() -> None:
    from mxref.model import LandingChecksums

    arena = _arena([3000, 0, 10_000, 5000])
    land = LandingChecksums(arena, slice_bytes=1024)
    regions = arena.regions()
    pairs = [((addr, n, 0), (0x9000 + addr, n, 0)) for addr, n in regions if n]
    chunks = split_ranges(pairs, 4096, ramp=2)
    for chunk in reversed(chunks[:3]):  # out of order: a later chunk may complete first
        land.landed([local for local, _ in chunk])
        land.work()
    early = land.during_read
    for chunk in chunks[3:]:
        land.landed([local for local, _ in chunk])
    while land.work():
        pass
    assert land.during_read == 4 > early  # every tensor (the empty one too) hashed before finish
    assert land.finish() == arena.checksums()
    with pytest.raises(ValueError, match="not unlanded bytes"):
        land.landed([(regions[0][0], 1, 0)])  # the same bytes twice
    with pytest.raises(ValueError, match="not unlanded bytes"):
        LandingChecksums(arena).landed([(regions[0][0] + regions[0][1] - 1, 2, 0)])  # across a tensor's end


def test_finish_hashes_what_never_landed_as_the_memory_holds_it() -> None:
    from mxref.model import LandingChecksums

    arena = _arena([4096, 4096])
    land = LandingChecksums(arena)
    addr, n = arena.regions()[0]
    land.landed([(addr + n // 2, n // 2, 0)])  # the later half of one tensor: nothing can be hashed yet
    assert not land.work() and land.during_read == 0
    assert land.finish() == arena.checksums() and land.during_read == 0
    begun = LandingChecksums(arena, slice_bytes=1000)
    begun.landed([(addr, n // 2, 0)])
    assert begun.work() and begun.during_read == 0  # a slice of the first half: that tensor's hash goes on in finish
    assert begun.finish() == arena.checksums() == begun.finish()  # and only once


def test_a_tensors_landed_prefix_is_hashed_before_the_rest_of_it_lands() -> None:
    from mxref.model import LandingChecksums

    arena = _arena([10_000, 6000])
    land = LandingChecksums(arena, slice_bytes=1000)
    (a0, n0), (a1, n1) = arena.regions()
    land.landed([(a0 + 4000, 3000, 0)])  # ahead of the prefix: waits
    assert not land.work()
    land.landed([(a0, 4000, 0)])  # the prefix now runs to 7000: 7 slices, then nothing
    assert [land.work() for _ in range(8)] == [True] * 7 + [False]
    assert land.during_read == 0 and land.hashing_s > 0
    land.landed([(a1, n1, 0), (a0 + 7000, n0 - 7000, 0)])  # the second tensor, then the rest of the first
    while land.work():
        pass
    assert land.during_read == 2
    assert land.finish() == arena.checksums()
    with pytest.raises(ValueError, match="not unlanded bytes"):
        land.landed([(a0 + 4000, 10, 0)])  # inside what landed already


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, 20_999), max_size=12, unique=True), order=st.randoms(use_true_random=False),
       works=st.lists(st.integers(0, 4), min_size=13, max_size=13))
def test_in_any_landing_order_the_checksums_are_the_arenas(cuts: list[int], order: Any, works: list[int]) -> None:
    from mxref.model import LandingChecksums

    arena = _arena([9000, 0, 12_000])
    land = LandingChecksums(arena, slice_bytes=700)
    pieces: list[tuple[int, int, int]] = []
    for addr, n in arena.regions():  # each tensor cut where ``cuts`` fall inside it
        bounds = sorted({0, n, *(c % n for c in cuts if n)})
        pieces += [(addr + lo, hi - lo, 0) for lo, hi in itertools.pairwise(bounds)]
    order.shuffle(pieces)
    for piece, n in zip(pieces, works):
        land.landed([piece])
        for _ in range(n):
            land.work()
    assert land.finish() == arena.checksums()


def test_a_chunked_read_tells_its_landing_every_chunk_and_gives_it_work() -> None:
    agent = ChunkAgent()
    mgr, remote = manager(agent)

    class Recorder:
        def __init__(self) -> None:
            self.ranges: list[tuple[int, int, int]] = []
            self.calls = 0

        def landed(self, ranges: Any) -> None:
            self.ranges += list(ranges)

        def work(self) -> bool:
            self.calls += 1
            return False

    rec = Recorder()
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=3 * MIB), landing=rec)
    assert sum(size for _a, size, _d in rec.ranges) == 32 * MIB and rec.calls > 0
    starts = sorted(a for a, _s, _d in rec.ranges)
    assert len(starts) == len(set(starts))  # no range twice


# ------------------------------------------------------------------ where the window idles


def test_a_freed_slot_is_posted_before_the_done_chunk_is_released() -> None:
    class Ordered(ChunkAgent):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, int]] = []

        def transfer(self, handle: int) -> str:
            self.calls.append(("post", handle))
            return str(super().transfer(handle))  # type: ignore[no-untyped-call]

        def release_xfer_handle(self, handle: int) -> None:
            self.calls.append(("release", handle))
            super().release_xfer_handle(handle)  # type: ignore[no-untyped-call]

    agent = Ordered()
    mgr, remote = manager(agent)
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB, window=1))
    assert agent.calls[:4] == [("post", 0), ("post", 1), ("release", 0), ("post", 2)]
    assert sorted(agent.released) == list(range(len(agent.posted)))


def test_a_failed_refill_still_releases_the_chunks_that_completed() -> None:
    class PostFails(ChunkAgent):
        def transfer(self, handle: int) -> str:
            if handle == 2:
                raise RuntimeError("NIXL_ERR_BACKEND")
            return str(super().transfer(handle))  # type: ignore[no-untyped-call]

    agent = PostFails()
    mgr, remote = manager(agent)
    with pytest.raises(TransferFailed):
        mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB))
    assert sorted(agent.released) == [0, 1, 2]


def test_the_trace_holds_every_chunk_posted_before_it_completed() -> None:
    from mxref.transfer.chunked import ChunkTime

    agent = ChunkAgent()
    mgr, remote = manager(agent)
    trace: list[ChunkTime] = []
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB), trace=trace)
    assert len(trace) == len(agent.posted) and sum(t.nbytes for t in trace) == 32 * MIB
    assert all(0 <= t.posted_s <= t.done_s for t in trace)


def test_window_idle_sums_the_lag_to_each_refill_and_the_time_the_window_was_not_full() -> None:
    from mxref.transfer.chunked import ChunkTime, window_idle

    # W=2: two chunks posted at 0, both done at 10; the next two posted at 11 and 12, done at 20
    trace = [ChunkTime(1, 0.0, 10.0), ChunkTime(1, 0.0, 10.0), ChunkTime(1, 11.0, 20.0), ChunkTime(1, 12.0, 20.0)]
    idle = window_idle(trace, 2)
    assert idle["chunks"] == 4 and idle["first_post_s"] == 0.0
    assert idle["post_lag_s"] == pytest.approx(1.0 + 2.0)  # each refill after the completion that freed its slot
    assert idle["underfull_s"] == pytest.approx(2.0)  # 10..11 empty, 11..12 one in flight; the tail does not count
    assert window_idle([], 2)["chunks"] == 0
    assert idle["chunk_wait_s"] == pytest.approx(10.0)  # the median chunk's post to done (8, 9, 10, 10)


def test_the_read_clock_says_where_a_chunked_reads_time_went() -> None:
    from mxref.transfer.chunked import ReadClock

    class SlowPoll(ChunkAgent):
        def check_xfer_state(self, handle):  # type: ignore[no-untyped-def]
            time.sleep(0.002)  # the poll is where the bytes move: it must hold most of the READ
            return super().check_xfer_state(handle)  # type: ignore[no-untyped-call]

    agent = SlowPoll()
    mgr, remote = manager(agent)
    clock = ReadClock()
    mgr.receive_from_source(b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB), clock=clock)
    fields = clock.fields()
    assert fields["posts"] == len(agent.posted) == 9 and fields["polls"] >= fields["posts"]
    assert fields["poll_s"] >= 0.002 * fields["polls"] and fields["poll_s"] > 0.5 * fields["total_s"]
    parts = sum(fields[k] for k in ("prep_s", "post_s", "poll_s", "landing_s", "release_s", "other_s"))
    assert parts == pytest.approx(fields["total_s"], abs=1e-5)
    stalled = ReadClock()
    with pytest.raises(TransferStalled):  # a stalled READ still says where its time went (its first window: one chunk)
        manager(ChunkAgent(complete=0))[0].receive_from_source(
            b"", remote, 5.0, "src", chunks=ChunkPolicy(chunk_bytes=4 * MIB, floor_bps=1e9, slack_s=0.05), clock=stalled)
    assert stalled.posts == 1 and stalled.total_s >= 0.05 and stalled.release_s > 0


# ------------------------------------------------------------------ the poll loop's naps


class VirtualTime:
    """``mxref.transfer.chunked``'s clock, made deterministic: each reading advances it 1 us, a
    ``sleep`` by what it asked (recorded: when it began, how long it asked)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.naps: list[tuple[float, float]] = []

    def monotonic(self) -> float:
        self.now += 1e-6
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.naps.append((self.now, seconds))
        self.now += seconds


class VirtualSource(ChunkAgent):
    """Each poll costs ``poll_s`` of virtual time (a poll that drains a socket: tens of us); a chunk
    completes ``chunk_s`` after its post; ``complete`` chunks at most, then the source freezes."""

    def __init__(self, clock: VirtualTime, chunk_s: float, poll_s: float = 0.0, complete: int = 10**9) -> None:
        super().__init__(complete)
        self.clock, self.chunk_s, self.poll_s = clock, chunk_s, poll_s
        self.posted_at: dict[int, float] = {}

    def transfer(self, handle):  # type: ignore[no-untyped-def]
        self.posted_at[handle] = self.clock.now
        return super().transfer(handle)  # type: ignore[no-untyped-call]

    def check_xfer_state(self, handle):  # type: ignore[no-untyped-def]
        self.clock.now += self.poll_s
        if handle < self.complete and self.clock.now - self.posted_at[handle] >= self.chunk_s:
            self.seen_done.add(handle)
            return "DONE"
        return "PROC"


def virtual_read(monkeypatch: pytest.MonkeyPatch, agent_of: Any, policy: ChunkPolicy,
                 nap: Any = None) -> tuple[VirtualTime, Any, float]:
    """One READ of 4 x 8 MiB on a virtual clock: (the clock, the READ's ``ReadClock``, its virtual length)."""
    from mxref.transfer import chunked

    clock = VirtualTime()
    monkeypatch.setattr(chunked, "time", clock)
    if nap is not None:
        monkeypatch.setattr(chunked, "POLL_NAP", nap)
    mgr, remote = manager(agent_of(clock))
    read_clock = chunked.ReadClock()
    began = clock.now
    try:
        mgr.receive_from_source(b"", remote, 30.0, "src", chunks=policy, clock=read_clock)
    except TransferStalled:
        pass
    return clock, read_clock, clock.now - began


def test_a_quiet_window_naps_between_polls_and_the_stall_is_called_at_its_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mxref.transfer.chunked import PollNap

    # naps up to 40 ms against a first-window deadline of 0.09 s: a nap blind to the deadline overruns it
    nap = PollNap(spin_s=300e-6, first_s=1e-3, cap_s=0.04)
    policy = ChunkPolicy(chunk_bytes=8 * MIB, window=4, floor_bps=25e6, slack_s=0.05)
    clock, read_clock, elapsed = virtual_read(monkeypatch, lambda c: VirtualSource(c, 0.0, complete=0), policy, nap)
    first = policy.first_deadline(32 * MIB)
    assert read_clock.naps == len(clock.naps) > 0, "a window with nothing moving gives the CPU away"
    assert [s for _, s in clock.naps[:4]] == [1e-3, 2e-3, 4e-3, 8e-3], "each nap doubles the last"
    assert max(s for _, s in clock.naps) <= nap.cap_s
    assert clock.naps[-1][1] < nap.cap_s, "the last nap was cut short at the deadline"
    assert first < elapsed < first + 100e-6, "the stall is called at its deadline, as by a tight poll"
    assert read_clock.polls < 100, "polled between naps, not in a tight loop"


def test_a_read_whose_chunks_keep_completing_never_naps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, read_clock, _ = virtual_read(monkeypatch, lambda c: VirtualSource(c, 0.0), ChunkPolicy(chunk_bytes=4 * MIB))
    assert read_clock.posts == 9 and clock.naps == [] and read_clock.naps == 0 and read_clock.nap_s == 0.0


def test_polls_that_move_bytes_keep_the_loop_tight_until_the_chunk_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    from mxref.transfer.chunked import POLL_NAP

    # each poll drains a socket (a busy pass), a chunk takes 30 ms: no completion for 100 spin_s
    clock, read_clock, _ = virtual_read(monkeypatch, lambda c: VirtualSource(c, 0.03, poll_s=2 * POLL_NAP.busy_pass_s),
                                        ChunkPolicy(chunk_bytes=4 * MIB))
    assert read_clock.posts == 9 and clock.naps == [], "a poll that took a busy pass's time is progress"
    # the same READ whose polls are idle (the bytes arrive elsewhere): it naps while it waits
    clock, read_clock, _ = virtual_read(monkeypatch, lambda c: VirtualSource(c, 0.03), ChunkPolicy(chunk_bytes=4 * MIB))
    assert read_clock.posts == 9 and read_clock.naps > 0
