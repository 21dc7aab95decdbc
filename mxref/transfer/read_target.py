"""A reader's READ target: fresh memory registered with a fresh NIXL agent, and its head start.

A target is what one attempt reads into (the late-write guard, ``mxref.roles.reader``: never memory
or an agent a stalled READ may still write through). Preparing one costs the load most of its
fixed time: the first NIXL agent of a process initialises UCX (~0.4 s here; later agents
~0.02 s) and the memory's pages must be faulted in. ``TargetPrestart`` prepares the first
target in a thread while the reader asks the control plane (ListSources, GetMetadata, the
manifest): agent creation releases the GIL, so the two overlap. The prestarted target has
never been read into, so whichever attempt first reaches its READ may take it.

Memory comes from ``AcceleratorBackend.allocate``; for host memory that is an anonymous mapping
the kernel populates at once (``Arena(zeroed_mapping=True)``), so the pages are faulted in
once, without a page-fault trap each, and are already zero (no fill).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from mxref.accelerators import AcceleratorBackend
from mxref.events import EventLog
from mxref.metrics import NixlFamilies
from mxref.model import TensorSpec
from mxref.transfer.local import local_tensors
from mxref.transfer.manager import NixlTransferManager

logger = logging.getLogger("mxref.transfer.read_target")

PRESTART_JOIN_S = 120.0  # a bound on waiting for the head start (agent creation is ~0.4 s)


@dataclass
class ReadTarget:
    """Memory and the agent that registered it; ``phases`` are the seconds each step took."""

    manager: NixlTransferManager
    arena: Any  # Arena | CudaArena
    agent_name: str
    phases: dict[str, float] = field(default_factory=dict)

    def discard(self) -> None:
        """Never read into: shut the agent down and hand the memory back."""
        self.manager.shutdown()
        self.arena.release()


def prepare_target(
    accelerator: AcceleratorBackend,
    specs: list[TensorSpec],
    device_id: int,
    agent_name: str,
    *,
    events: EventLog,
    metrics: NixlFamilies | None,
    initial_error: str | None = None,
    manager_cls: Callable[..., NixlTransferManager] = NixlTransferManager,
    warmup: NixlWarmup | None = None,
    agent_lock: AbstractContextManager[Any] | None = None,
    hurry: bool = False,
) -> ReadTarget:
    """Allocate zeroed memory, create an agent (no progress thread: the READ's polling drives
    it; after ``warmup``, when given) and register the memory with it. On an error nothing is
    left behind. ``agent_lock`` is held from the agent's creation to its registration only (the
    reader holds it to shut a failed attempt's agent down): the allocation, most of the time a
    target takes, never holds up a rollback. ``hurry``: an attempt will wait for this target
    (the next one after a stall), so its memory is allocated the quickest way."""
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    accelerator.set_device(device_id)
    early = warmup.take_arena(specs) if warmup is not None else None
    if early is not None:  # allocated beside the reference's computation
        arena, phases["allocate"] = early
        phases["warmup_wait"] = time.perf_counter() - t0
    else:
        arena = accelerator.allocate(specs, device_id, hurry=hurry)
        if not getattr(arena, "allocated_zeroed", False):
            arena.fill(0)
        phases["allocate"] = time.perf_counter() - t0
    manager = manager_cls(agent_name, device_id, accelerator, events=events, metrics=metrics,
                          initial_error=initial_error)
    try:
        if warmup is not None and "warmup_wait" not in phases:
            phases["warmup_wait"] = warmup.wait()
        with agent_lock if agent_lock is not None else contextlib.nullcontext():
            try:
                t0 = time.perf_counter()
                manager.create_agent_on_free_port(progress_thread=False)
                phases["agent"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                manager.register_tensors(local_tensors(arena, device_id))
                phases["register"] = time.perf_counter() - t0
            except BaseException:
                manager.shutdown()
                raise
    except BaseException:
        arena.release()
        raise
    return ReadTarget(manager, arena, agent_name, phases)


class NixlWarmup:
    """A reader's head start, in a thread from its start, while it works out its content
    reference: NIXL's one-time initialisation (~0.4 s here: a throwaway agent, no listener, no
    memory; later agents then cost ~0.05 s) and, given the model's ``specs``, the first READ
    target's memory (``take_arena``), allocated beside it in a second thread."""

    def __init__(self, accelerator: AcceleratorBackend | None = None, specs: list[TensorSpec] | None = None,
                 device_id: int = 0) -> None:
        self.seconds = 0.0
        self.error: str | None = None
        self._accelerator, self._specs, self._device_id = accelerator, specs, device_id
        self._arena: Any = None
        self._arena_seconds = 0.0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="mxref-nixl-warmup", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from mxref.transfer.manager import import_nixl

        # the memory in a thread of its own: populating pages and NIXL's start-up both run
        # outside the GIL, so on two cores the first target is ready at the later of the two
        allocator = None
        if self._accelerator is not None and self._specs:
            allocator = threading.Thread(target=self._allocate, name="mxref-target-allocate", daemon=True)
            allocator.start()
        t0 = time.perf_counter()
        try:
            api = import_nixl()
            agent = api.nixl_agent(f"warmup-{threading.get_native_id()}",
                                   api.nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False,
                                                         backends=["UCX"]))
            del agent
        except Exception as exc:  # noqa: BLE001 - only a head start: the real agent reports any failure
            self.error = f"{type(exc).__name__}: {exc}"
        self.seconds = time.perf_counter() - t0
        if allocator is not None:
            allocator.join(PRESTART_JOIN_S)

    def _allocate(self) -> None:
        assert self._accelerator is not None and self._specs is not None
        t0 = time.perf_counter()
        try:
            self._accelerator.set_device(self._device_id)
            arena = self._accelerator.allocate(self._specs, self._device_id)
            if not getattr(arena, "allocated_zeroed", False):
                arena.fill(0)
        except Exception as exc:  # noqa: BLE001 - only a head start: the target allocates its own
            logger.warning("allocating the READ target ahead failed: %s: %s", type(exc).__name__, exc)
            return
        with self._lock:
            self._arena, self._arena_seconds = arena, time.perf_counter() - t0

    def wait(self) -> float:
        """Wait (bounded) until it is done; returns how long we waited."""
        t0 = time.perf_counter()
        self._thread.join(PRESTART_JOIN_S)
        return time.perf_counter() - t0

    def take_arena(self, specs: list[TensorSpec]) -> tuple[Any, float] | None:
        """The memory allocated ahead and the seconds that took, once, when it was allocated
        for exactly ``specs`` (never read into: fresh for the late-write guard); else None."""
        self.wait()
        with self._lock:
            arena, self._arena = self._arena, None
        if arena is None:
            return None
        if list(arena.specs) != list(specs):
            arena.release()
            return None
        return arena, self._arena_seconds

    def release_arena(self) -> None:
        """Nobody took it: wait for the thread (bounded; a process must not exit while it is inside
        NIXL: an agent torn down by the interpreter's exit aborts it) and hand the memory back."""
        self.wait()
        with self._lock:
            arena, self._arena = self._arena, None
        if arena is not None:
            arena.release()


class TargetPrestart:
    """``make()`` run in a thread from construction; ``take`` waits for it (bounded)."""

    def __init__(self, make: Callable[[], ReadTarget]) -> None:
        self._make = make
        self._target: ReadTarget | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._thread = threading.Thread(target=self._run, name="mxref-target-prestart", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._target = self._make()
        except BaseException as exc:  # noqa: BLE001 - handed to the taker, who prepares a target itself
            self._error = exc

    @property
    def taken(self) -> bool:
        return self._taken

    def ready(self) -> float:
        """Wait (bounded) until the target is made or failed, without taking it; the seconds waited."""
        t0 = time.perf_counter()
        self._thread.join(PRESTART_JOIN_S)
        return time.perf_counter() - t0

    def take(self) -> tuple[ReadTarget | None, float]:
        """The prepared target (None when preparing it failed: logged) and how long we waited."""
        waited = self.ready()
        self._taken = True
        if self._thread.is_alive():
            logger.warning("the prestarted READ target was not ready within %.0fs; preparing another", PRESTART_JOIN_S)
            return None, waited
        if self._error is not None:
            logger.warning("preparing the READ target ahead failed (%s: %s); preparing it again",
                           type(self._error).__name__, self._error)
            return None, waited
        target, self._target = self._target, None
        return target, waited

    def discard(self) -> None:
        """Nothing took it: wait for it (bounded) and drop it."""
        if self._taken:
            return
        self._taken = True
        self._thread.join(PRESTART_JOIN_S)
        if self._target is not None:
            self._target.discard()
            self._target = None
