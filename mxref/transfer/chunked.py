"""Chunked READs with one window deadline: a stalled source is seen in about a second.

A wedged data plane gives neither a completion nor an error (docs/contract.md#health-reflects-the-data-plane), so a single READ
handle can only time out at the whole budget. ``read_chunked`` splits the READ into chunks
of ``ChunkPolicy.chunk_bytes`` and keeps ``window`` of them in flight; a window that
completes nothing within ``ChunkPolicy.stall_s`` is a stall. The seed's whole-READ budget
stays the outer bound.

Descriptor lists are prepared once per READ (``prep_xfer_dlist`` for each side, one entry
per piece of every chunk) and each chunk's handle is made from them by index
(``make_prepped_xfer``), instead of validating and preparing both lists again per chunk
with ``initialize_xfer``. The manager (``mxref.transfer.manager``) owns health: this module
only raises the transfer error saying what happened (``TransferStalled``, ``TransferTimeout``,
``TransferFailed``, each with its ``ReadFailure``); the manager records it and lets it through.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from mxref import config
from mxref.errors import TransferFailed, TransferStalled, TransferTimeout

logger = logging.getLogger("mxref.transfer.chunked")

DONE_STATES = frozenset({"DONE", "SUCCESS"})
ERROR_STATES = frozenset({"ERR", "ERROR", "FAIL"})
LOCAL_SIDE = "NIXL_INIT_AGENT"  # prep_xfer_dlist's name for the initiator's own descriptors

Range = tuple[int, int, int]  # (addr, size, device_id)
Pair = tuple[Range, Range]  # (local, remote) of the same size


@dataclass(frozen=True)
class ChunkPolicy:
    """Split a READ into chunks so a stalled source is seen in about a second, not a budget.

    With chunks of ``chunk_bytes`` and ``window`` handles in flight, a window that
    completes nothing within its bytes in flight at ``floor_bps`` plus ``slack_s`` (counted
    from the later of its oldest post and the last completion; a full window: ``window *
    chunk_bytes / floor_bps + slack_s``) is a stall. The source serves
    the window's chunks round-robin, so they finish together: one deadline for the
    window, not one per chunk (docs/nixl-facts.md#false-stalls-under-cpu-load: per-chunk clocks gave false
    stalls under 8 CPU hogs on 2 cores, the window rule none in 27 runs). The defaults
    (16 MiB, W=2, 100 MB/s, 0.5 s) detect a frozen source in ~0.8 s at 0.92-0.98x
    single-handle throughput.

    Fan-out: a source shared by N readers gives each about 1/N of its rate (16 readers of one
    source on this 2-core host: ~45 MB/s each, under the floor). So the window's bytes are timed
    at the floor only until the READ has seen a completion; after that at half the READ's observed
    rate (bytes completed / time since its start), kept between ``least_bps`` and ``floor_bps``
    (``bps_after``). The first window, with no evidence yet, is one small chunk alone (with the
    ramp, ``probe_bytes``: 1 MiB, D1 = 0.51 s), small enough for a shared source to answer (the
    storm bench: 16 readers' first 8 MiB chunks came back 64-550 ms after the go, one after
    another, from one source; 1 MiB each is 1/8 of that queue). So a frozen source is called a
    stall within ``first_deadline`` of the READ's start before any chunk landed, and within ``stall_s`` (a full window at ``least_bps``: 16 MiB x 2 at 25 MB/s + 0.5 s
    = 1.84 s; 0.84 s while the READ runs at 200 MB/s or more) of its last completion after.

    Released chunks stay tainted: a resumed source's late replies can still land in them.
    The reader therefore rolls back (drops agent and memory) before its next candidate,
    and verifies every checksum after the load, never per chunk.
    """

    chunk_bytes: int = int(config.DEFAULT_READ_CHUNK_MIB * (1 << 20))
    window: int = config.DEFAULT_READ_WINDOW
    floor_bps: float = 100e6
    slack_s: float = 0.5
    least_bps: float = 25e6  # the lowest rate a window is timed at, whatever the READ has seen
    probe_bytes: int = 1 << 20  # with the ramp, the first chunk, posted alone
    ramp: bool = True  # the first window's chunks ramp up in size (``split_ranges``)

    def split(self, pairs: Sequence[Pair]) -> list[list[Pair]]:
        return split_ranges(pairs, self.chunk_bytes, self.window if self.ramp else 1,
                            probe=self.probe_bytes if self.ramp else None)

    def __post_init__(self) -> None:
        if (self.chunk_bytes <= 0 or self.window < 1 or self.floor_bps <= 0 or self.slack_s < 0
                or self.probe_bytes <= 0 or not 0 < self.least_bps <= self.floor_bps):
            raise ValueError(f"invalid chunk policy {self}: sizes, window and floors must be positive, "
                             "least_bps at most floor_bps")

    def bps_after(self, rate_bps: float | None) -> float:
        """The rate a window is timed at once the READ has run at ``rate_bps`` (None: no chunk
        completed yet, the floor): half of it, kept within [``least_bps``, ``floor_bps``]."""
        if rate_bps is None:
            return self.floor_bps
        return min(self.floor_bps, max(self.least_bps, rate_bps / 2))

    def deadline(self, inflight_bytes: int, rate_bps: float | None = None) -> float:
        """The stall deadline of a window holding ``inflight_bytes``: those bytes at
        ``bps_after(rate_bps)``, plus the slack."""
        return inflight_bytes / self.bps_after(rate_bps) + self.slack_s

    @property
    def first_window(self) -> int:
        """How many chunks the READ's first window holds: one with the ramp (no completion has
        told the reader its share of the source yet), else ``window``."""
        return 1 if self.ramp else self.window

    @property
    def stall_s(self) -> float:
        """The longest deadline of a full window (``window`` whole chunks in flight, timed at
        ``least_bps``): a frozen source is called a stall within this of the last completion."""
        return self.window * self.chunk_bytes / self.least_bps + self.slack_s

    def first_deadline(self, total_bytes: int) -> float:
        """The deadline of a READ's first window (of ``total_bytes`` in all): a source frozen
        before the READ is called stalled this long after the READ's start. With the ramp the
        first window is the probe chunk alone, at the floor (1 MiB: 0.51 s)."""
        sizes = [sum(local[1] for local, _ in chunk) for chunk in self.split([((0, total_bytes, 0), (0, total_bytes, 0))])]
        return self.deadline(sum(sizes[: self.first_window]))


@dataclass(frozen=True)
class PollNap:
    """When a chunked READ's poll loop gives the CPU away: tight while bytes move, short naps after.

    With no progress thread the reader's polls move the bytes, so while they do the loop polls
    at once. A pass counts as progress when a chunk completed, the landing had work, or the
    pass itself took ``busy_pass_s`` or more (a poll that drained a socket costs tens of us, an
    idle one a few). After ``spin_s`` without progress the loop sleeps between passes: ``first_s``,
    doubling up to ``cap_s``, back to tight polling at the next progress. A nap never asks to
    sleep past the window's nearest check (suspect, stall, budget): every deadline is computed
    and compared as without naps. With R readers sharing 2 cores, their idle polls were CPU the
    sources (and the other readers) needed
    (docs/mxref.md#the-readers-idle-polls-issue-38-2026-12-07)."""

    spin_s: float = 300e-6
    first_s: float = 50e-6
    cap_s: float = 1e-3
    busy_pass_s: float = 20e-6

    def next(self, nap_s: float) -> float:
        """The nap after one of ``nap_s`` (0: the first of a quiet stretch)."""
        return min(self.cap_s, max(self.first_s, nap_s * 2))


POLL_NAP = PollNap()


class Landing(Protocol):
    """Told what has landed while the READ goes on (``mxref.model.LandingChecksums``)."""

    def landed(self, ranges: Sequence[Range]) -> None:
        """A chunk completed: these local ranges hold their final bytes."""

    def work(self) -> bool:
        """A bounded slice of work between polls; False when there was none."""


class ChunkTime(NamedTuple):
    """One completed chunk of a READ: when it was posted and when the reader saw it done,
    in seconds from the READ's start (what the bench reads to find where the window idles)."""

    nbytes: int
    posted_s: float
    done_s: float


@dataclass
class ReadClock:
    """Where one chunked READ's time went, phase by phase (seconds, summed over its chunks): what
    the bench sets beside a raw READ's (``mxref.bench.raw``). ``prep_s``: both descriptor lists
    prepared; ``post_s``: each chunk's handle made and posted (``posts`` of them); ``poll_s``: inside
    ``check_xfer_state`` (``polls`` calls: with no progress thread, this is where the bytes move);
    ``landing_s``: the landing's work between polls (checksums); ``nap_s``: asleep between polls
    (``naps`` of them, ``PollNap``); ``release_s``: handles and lists released; ``total_s``: the
    whole call. What is left (``fields``' ``other_s``) is the loop's own
    bookkeeping."""

    prep_s: float = 0.0
    post_s: float = 0.0
    posts: int = 0
    poll_s: float = 0.0
    polls: int = 0
    landing_s: float = 0.0
    nap_s: float = 0.0
    naps: int = 0
    release_s: float = 0.0
    total_s: float = 0.0

    def fields(self) -> dict[str, float]:
        """The phases (seconds, rounded to the microsecond), the counts and ``other_s``."""
        timed = self.prep_s + self.post_s + self.poll_s + self.landing_s + self.nap_s + self.release_s
        return {"prep_s": round(self.prep_s, 6), "post_s": round(self.post_s, 6), "posts": self.posts,
                "poll_s": round(self.poll_s, 6), "polls": self.polls, "landing_s": round(self.landing_s, 6),
                "nap_s": round(self.nap_s, 6), "naps": self.naps, "release_s": round(self.release_s, 6), "other_s": round(max(0.0, self.total_s - timed), 6),
                "total_s": round(self.total_s, 6)}


def window_idle(trace: Sequence[ChunkTime], window: int) -> dict[str, float]:
    """Where a READ's window idled, from its ``trace``: ``post_lag_s``, the time from each
    completion to the post that refilled its slot (the reader's share, summed), and
    ``underfull_s``, the time before the last post with fewer than ``window`` chunks in flight
    (the window not kept full); ``first_post_s`` is the READ's start to its first post;
    ``chunk_wait_s`` a chunk's median wait, from its post to the poll that saw it done."""
    if not trace:
        return {"chunks": 0, "first_post_s": 0.0, "post_lag_s": 0.0, "underfull_s": 0.0, "chunk_wait_s": 0.0}
    posts = sorted(t.posted_s for t in trace)
    dones = sorted(t.done_s for t in trace)
    lag = 0.0
    for i, posted in enumerate(posts[window:]):
        lag += max(0.0, posted - dones[i])  # the i-th completion freed the slot of post window+i
    edges = sorted([(p, 1) for p in posts] + [(d, -1) for d in dones])
    inflight, last, underfull = 0, posts[0], 0.0
    for at, step in edges:
        if at > posts[-1]:
            break
        if inflight < window:
            underfull += at - last
        inflight, last = inflight + step, at
    waits = sorted(t.done_s - t.posted_s for t in trace)
    return {"chunks": len(trace), "first_post_s": round(posts[0], 6), "post_lag_s": round(lag, 6),
            "underfull_s": round(underfull, 6), "chunk_wait_s": round(waits[len(waits) // 2], 6)}


def split_ranges(pairs: Sequence[Pair], chunk_bytes: int, ramp: int = 1, probe: int | None = None) -> list[list[Pair]]:
    """Group (local, remote) ranges into chunks of at most ``chunk_bytes``, splitting big ranges.

    Each range is ``(addr, size, device_id)``; local and remote of a pair have the same size.
    With ``ramp`` = W > 1 the first W-1 chunks hold 1/W, 2/W, ... of ``chunk_bytes``, so the
    chunks that follow the first ramp up to a whole one. ``probe``, when given, is the first
    chunk's size (at most ``chunk_bytes``): the chunk ``ChunkPolicy`` posts alone, whose deadline
    a source frozen before the READ meets. The ramp was meant to keep chunks from finishing
    together; the bench showed no throughput change.
    """
    sizes = [chunk_bytes * i // ramp for i in range(1, ramp)]
    if probe is not None:
        sizes = [min(probe, chunk_bytes), *sizes[1:]]
    chunks: list[list[Pair]] = []
    current: list[Pair] = []

    def next_room() -> int:
        return sizes[len(chunks)] if len(chunks) < len(sizes) and sizes[len(chunks)] > 0 else chunk_bytes

    room = next_room()
    for (laddr, size, ldev), (raddr, _rsize, rdev) in pairs:
        offset = 0
        while offset < size:
            take = min(size - offset, room)
            current.append(((laddr + offset, take, ldev), (raddr + offset, take, rdev)))
            offset += take
            room -= take
            if room == 0:
                chunks.append(current)
                current = []
                room = next_room()
    if current:
        chunks.append(current)
    return chunks


def read_chunked(agent: Any, mem: str, chunks: list[list[Pair]], remote_agent_name: str, budget_s: float,
                 policy: ChunkPolicy, on_suspect: Callable[[], None] | None = None,
                 landing: Landing | None = None, trace: list[ChunkTime] | None = None,
                 clock: ReadClock | None = None) -> None:
    """Keep ``policy.window`` chunk READs in flight; raise ``TransferFailed`` on an error,
    ``TransferStalled`` on a stall (with the chunks done before it) or ``TransferTimeout`` at the budget. Every handle still in flight then is released (NIXL cancels it;
    the memory behind it stays tainted), and both prepared lists are released in any case.
    ``on_suspect`` is called once, when a window has gone half its deadline without a
    completion or half the budget has passed (it must return at once: the caller's chance to
    get its next attempt ready). ``landing`` is told each completed chunk's local ranges and
    given a slice of work between polls (the checksums of what has landed). ``trace``, when
    given, gets each completed chunk's ``ChunkTime`` in completion order; ``clock``, when given,
    where the READ's time went (``ReadClock``)."""
    clock = clock if clock is not None else ReadClock()
    began = time.perf_counter()
    pieces = [piece for chunk in chunks for piece in chunk]
    bounds: list[tuple[int, int, int]] = []  # (first piece, last piece + 1, bytes) of each chunk
    first = 0
    for chunk in chunks:
        bounds.append((first, first + len(chunk), sum(local[1] for local, _ in chunk)))
        first += len(chunk)
    prepped: list[Any] = []
    try:
        try:
            for side, column in ((LOCAL_SIDE, 0), (remote_agent_name, 1)):
                descs = np.array([p[column] for p in pieces], dtype=np.uint64)
                prepped.append(agent.prep_xfer_dlist(side, descs, mem))
        except Exception as exc:
            _release_dlists(agent, prepped)
            raise TransferFailed(f"chunked READ could not be prepared: {type(exc).__name__}: {exc}") from exc
        clock.prep_s += time.perf_counter() - began
        try:
            _pump(agent, prepped[0], prepped[1], bounds, budget_s, policy, on_suspect, landing,
                  [piece[0] for piece in pieces], trace, clock)
        finally:
            t0 = time.perf_counter()
            _release_dlists(agent, prepped)
            clock.release_s += time.perf_counter() - t0
    finally:
        clock.total_s += time.perf_counter() - began


class _InFlight(NamedTuple):
    handle: Any
    posted: float  # time.monotonic() of its post
    nbytes: int
    lo: int  # its pieces: [lo, hi)
    hi: int


def _pump(agent: Any, local_side: Any, remote_side: Any, bounds: list[tuple[int, int, int]], budget_s: float,
          policy: ChunkPolicy, on_suspect: Callable[[], None] | None = None, landing: Landing | None = None,
          local: Sequence[Range] = (), trace: list[ChunkTime] | None = None, clock: ReadClock | None = None,
          nap: PollNap | None = None) -> None:
    """``local``: every piece's local range, by piece index (what ``landing`` is told); ``nap``:
    when the loop sleeps between polls (``PollNap``).

    The loop between two polls is kept short (the poll is what moves the bytes; the loop's own
    work is time the reader's socket is not drained): the window's deadlines (suspect, stall,
    budget) are worked out when the window changes, a post or a completion, and each pass only
    compares the clock with the nearest of them."""
    clock = clock if clock is not None else ReadClock()
    nap = nap if nap is not None else POLL_NAP
    perf, monotonic = time.perf_counter, time.monotonic
    check = agent.check_xfer_state  # looked up once: the poll below is the READ's hottest line
    pending = list(reversed(bounds))
    inflight: list[_InFlight] = []
    start = monotonic()
    budget_at = start + budget_s
    last_done = start
    done_bytes = 0  # completed so far: the READ's observed rate times its later windows
    poll_s, polls = 0.0, 0
    moved_at, nap_s = perf(), 0.0  # the last pass that made progress; the last nap's length (0: none yet)

    def refill() -> None:
        while pending and len(inflight) < (policy.window if done_bytes else policy.first_window):
            t0 = perf()
            lo, hi, nbytes = pending.pop()
            indices = list(range(lo, hi))
            try:
                handle = agent.make_prepped_xfer("READ", local_side, indices, remote_side, indices)
            except Exception as exc:
                raise TransferFailed(f"chunked READ failed at post: {type(exc).__name__}: {exc}") from exc
            inflight.append(_InFlight(handle, monotonic(), nbytes, lo, hi))  # tracked before the post: released in any case
            try:
                state = agent.transfer(handle)
            except Exception as exc:
                raise TransferFailed(f"chunked READ failed at post: {type(exc).__name__}: {exc}") from exc
            finally:
                clock.post_s += perf() - t0
                clock.posts += 1
            if state in ERROR_STATES:
                raise TransferFailed(f"chunked READ failed at post: NIXL state {state}")

    def deadlines() -> tuple[float, float, float]:
        """(the window's stall deadline, its length, the clock time of the nearest check) for what is in flight now."""
        rate = done_bytes / max(last_done - start, 1e-6) if done_bytes else None
        deadline = policy.deadline(sum(item.nbytes for item in inflight), rate)
        stall_at = max(inflight[0].posted, last_done) + deadline if inflight else math.inf
        suspect_at = min(stall_at - deadline / 2, start + budget_s / 2) if on_suspect is not None else math.inf
        return stall_at, deadline, min(stall_at, suspect_at, budget_at)

    try:
        refill()
        stall_at, deadline, check_at = deadlines()
        while inflight:
            done: list[_InFlight] = []
            t0 = perf()
            for item in inflight:
                try:
                    state = check(item.handle)
                except Exception as exc:
                    raise TransferFailed(f"chunked READ failed: NIXL raised {type(exc).__name__}: {exc}") from exc
                if state in DONE_STATES:
                    done.append(item)
                elif state in ERROR_STATES:
                    raise TransferFailed(f"chunked READ failed: NIXL state {state}")
            t1 = perf()
            poll_s += t1 - t0
            polls += len(inflight)
            if done or t1 - t0 >= nap.busy_pass_s:
                moved_at, nap_s = t1, 0.0
            if done:
                for item in done:
                    inflight.remove(item)  # before the release: `finally` releases only what is left
                    done_bytes += item.nbytes
                last_done = monotonic()
                # The freed slots are posted first, the bookkeeping after: the window's chunks complete
                # together (the bench's chunk times), so until the next post nothing is on the wire.
                try:
                    refill()
                finally:
                    t0 = perf()
                    for item in done:
                        agent.release_xfer_handle(item.handle)
                    clock.release_s += perf() - t0
                t0 = perf()
                for item in done:
                    if trace is not None:
                        trace.append(ChunkTime(item.nbytes, item.posted - start, last_done - start))
                    if landing is not None:
                        landing.landed(local[item.lo:item.hi])
                clock.landing_s += perf() - t0
                stall_at, deadline, check_at = deadlines()
            now = monotonic()
            if now >= check_at:
                if on_suspect is not None and (now > stall_at - deadline / 2 or now - start > budget_s / 2):
                    suspect, on_suspect = on_suspect, None
                    suspect()
                if inflight and now > stall_at:
                    finished = len(bounds) - len(pending) - len(inflight)
                    raise TransferStalled(
                        f"READ stalled: no chunk completed for {deadline:.2f}s "
                        f"({finished} of {len(bounds)} chunks done, no error status from NIXL; the window timed at "
                        f"{policy.bps_after(done_bytes / max(last_done - start, 1e-6) if done_bytes else None) / 1e6:.0f} MB/s)",
                        finished, len(bounds))
                if (pending or inflight) and now > budget_at:
                    raise TransferTimeout(
                        f"READ timed out after {budget_s:.3f}s with no completion and no error status from NIXL "
                        f"(chunked, {len(pending) + len(inflight)} of {len(bounds)} chunks left)")
                stall_at, deadline, check_at = deadlines()
            if landing is not None:
                t0 = perf()
                if landing.work():  # a slice (~35 us) at most: the poll below comes soon enough
                    moved_at, nap_s = t0, 0.0
                clock.landing_s += perf() - t0
            # Tight poll while bytes move (with the progress thread off, this loop moves them); after
            # a quiet stretch, a nap that ends before the nearest check (``PollNap``).
            if inflight and perf() - moved_at >= nap.spin_s:
                nap_s = nap.next(nap_s)
                left = check_at - monotonic()
                if left > 0:
                    t0 = perf()
                    time.sleep(min(nap_s, left))
                    clock.nap_s += perf() - t0
                    clock.naps += 1
    finally:
        clock.poll_s += poll_s
        clock.polls += polls
        t0 = perf()
        for handle, *_ in inflight:
            try:
                agent.release_xfer_handle(handle)
            except Exception as exc:  # noqa: BLE001 - a failed release must not hide the transfer's outcome
                logger.warning("release_xfer_handle failed: %s", exc)
        clock.release_s += perf() - t0


def _release_dlists(agent: Any, prepped: list[Any]) -> None:
    for handle in prepped:
        try:
            agent.release_dlist_handle(handle)
        except Exception as exc:  # noqa: BLE001 - a failed release must not hide the transfer's outcome
            logger.warning("release_dlist_handle failed: %s", exc)
