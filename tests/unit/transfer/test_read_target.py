"""READ targets: zeroed, populated host memory, and the head start that prepares one in a thread.

``Arena(zeroed_mapping=True)`` must be zero, page-aligned and writable without a fill (the
reader skips the fill for it), also where the kernel refuses the populate advice.
``TargetPrestart`` hands over what its thread made, reports a failure as "none" (the reader
then prepares one itself), and drops a target nobody took.
"""

from __future__ import annotations

import mmap
import threading
from pathlib import Path

import numpy as np
import pytest

from mxref import model
from mxref.accelerators import CpuBackend
from mxref.model import Arena, TensorSpec
from mxref.transfer.read_target import ReadTarget, TargetPrestart

SPECS = [TensorSpec(f"t{i}", (3, 1000), "float16") for i in range(3)]


@pytest.mark.parametrize("populate_advice", [model.MADV_POPULATE_WRITE, 9999])  # 9999: refused -> pages touched
def test_a_zeroed_mapping_is_zero_aligned_and_writable(monkeypatch: pytest.MonkeyPatch, populate_advice: int) -> None:
    monkeypatch.setattr(model, "MADV_POPULATE_WRITE", populate_advice)
    arena = Arena(SPECS, zeroed_mapping=True)
    assert arena.allocated_zeroed and not Arena(SPECS).allocated_zeroed
    assert arena.addr % mmap.PAGESIZE == 0 and arena.buffer.nbytes == arena.nbytes
    assert not arena.buffer.any()
    arena.raw(1)[:] = 7
    assert arena.view(1).view(np.uint8).min() == 7 and not arena.raw(0).any()
    arena.release()
    assert arena.buffer.nbytes == 0


def _thp_eligible(addr: int) -> bool | None:
    """What the kernel says of the mapping holding ``addr`` (``THPeligible`` in smaps); None if unsaid."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "THPeligible:":
            return line.split()[1] == "1"
    return None


def test_a_target_wanted_in_a_hurry_asks_for_no_huge_pages() -> None:
    """Huge pages' compaction can cost seconds on a busy machine: a target a rollback waits for
    (``allocate(..., hurry=True)``) is mapped without the advice; the others ask for it."""
    big = [TensorSpec("t", (8, 1 << 20), "uint8")]  # 8 MiB: room for huge pages
    calm, hurried = CpuBackend().allocate(big), CpuBackend().allocate(big, hurry=True)
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        said = thp.read_text() if thp.exists() else ""
        if "[never]" in said or _thp_eligible(calm.addr) is None:
            pytest.skip(f"no transparent huge pages to ask for here ({said.strip() or 'unsaid'})")
        assert _thp_eligible(calm.addr) is True
        assert _thp_eligible(hurried.addr) is ("[always]" in said)  # with THP always, every mapping is eligible
        assert hurried.allocated_zeroed and not hurried.buffer.any()
    finally:
        calm.release()
        hurried.release()


class Made:
    def __init__(self) -> None:
        self.discarded = 0

    def discard(self) -> None:
        self.discarded += 1


def test_take_hands_over_what_the_thread_made() -> None:
    made = Made()
    started = threading.Event()

    def make() -> ReadTarget:
        started.set()
        return made  # type: ignore[return-value]

    pre = TargetPrestart(make)
    target, waited = pre.take()
    assert target is made and waited >= 0 and started.is_set() and pre.taken  # type: ignore[comparison-overlap]
    pre.discard()
    assert made.discarded == 0, "a taken target belongs to the taker"


def test_a_failed_head_start_is_none_so_the_reader_prepares_its_own() -> None:
    def make() -> ReadTarget:
        raise RuntimeError("no UCX")

    target, _ = TargetPrestart(make).take()
    assert target is None


def test_a_target_nobody_took_is_discarded() -> None:
    made = Made()
    pre = TargetPrestart(lambda: made)  # type: ignore[arg-type, return-value]
    pre.discard()
    pre.discard()
    assert made.discarded == 1


def test_a_failed_warmup_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    from mxref.errors import NixlUnavailable
    from mxref.transfer import manager as nixl_transfer
    from mxref.transfer.read_target import NixlWarmup

    def missing() -> None:
        raise NixlUnavailable("the nixl package is not installed")

    monkeypatch.setattr(nixl_transfer, "import_nixl", missing)
    warm = NixlWarmup()
    assert warm.wait() >= 0
    assert warm.error is not None and "not installed" in warm.error and warm.seconds >= 0
