"""Model weights for sources, readers and the disk checkpoint, and their content reference.

A ``ModelSpec`` describes a synthetic model (tensor count, sizes, dtype, seed);
its bytes are deterministic, so any process can regenerate or verify them. A
source may instead serve a safetensors file. Checksums are xxh3-64 per tensor.
Tensors live in one contiguous host ``Arena`` (page aligned) so registration and
freeing are single operations, with one NIXL descriptor per tensor.

A ``Reference`` is what a model's content must be, known without asking the peer
that serves it: per-tensor checksums and a whole-model ``digest`` (``sha256:`` +
SHA-256 hex of the canonical JSON list ``[[name, dtype, [shape...], checksum], ...]``
in tensor order, no whitespace). It comes from a ``ModelSpec`` (the generator is the
definition), from the ``__metadata__`` that ``save_checkpoint`` records in a
safetensors file (``mxref_checksums``, ``mxref_digest``), or from hashing a file's
tensors. The digest travels in the source identity's ``revision``.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import hashlib
import json
import mmap
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from mxref.options import ModelFlags, parse_known

ALIGN = 4096
DTYPES = ("float32", "float16", "int8", "uint8", "int32", "int64")
# safetensors' dtype names for ours
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "I8": "int8", "U8": "uint8", "I32": "int32",
                      "I64": "int64"}
DIGEST_PREFIX = "sha256:"
META_CHECKSUMS = "mxref_checksums"  # JSON {name: xxh3-64 hex}, in tensor order
META_DIGEST = "mxref_digest"
META_SPEC = "mxref_model_spec"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ModelSpec:
    """A synthetic model: ``tensors`` tensors of ``tensor_bytes`` each (last may differ)."""

    name: str = "mxref/synthetic"
    tensors: int = 16
    tensor_bytes: int = 4 << 20
    dtype: str = "float16"
    seed: int = 0
    sizes: tuple[int, ...] = field(default=())  # explicit per-tensor byte sizes; overrides tensors/tensor_bytes

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model dtype {self.dtype!r} is not supported (known: {', '.join(DTYPES)})")
        item = np.dtype(self.dtype).itemsize
        sizes = self.sizes or (self.tensor_bytes,) * self.tensors
        if not sizes:
            raise ValueError("a model needs at least one tensor")
        for i, size in enumerate(sizes):
            if size <= 0 or size % item:
                raise ValueError(f"tensor {i}: size {size} must be a positive multiple of {item} ({self.dtype})")

    def tensor_specs(self) -> list[TensorSpec]:
        item = np.dtype(self.dtype).itemsize
        sizes = self.sizes or (self.tensor_bytes,) * self.tensors
        return [
            TensorSpec(name=f"model.layers.{i}.weight", shape=(size // item,), dtype=self.dtype)
            for i, size in enumerate(sizes)
        ]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensor_specs())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

def checksum(buf: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(buf).view(np.uint8).data)


HASH_THREADS = min(4, os.cpu_count() or 1)
"""Threads that hash a model's tensors side by side: xxhash lets go of the GIL while it hashes,
so a 1 GiB model in two halves took 0.096 s on two threads against 0.172 s on one, here."""


def hash_all(jobs: Sequence[Callable[[], str]]) -> list[str]:
    """Each job's checksum, in order, up to ``HASH_THREADS`` of them at once."""
    if len(jobs) <= 1 or HASH_THREADS <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(min(HASH_THREADS, len(jobs)), thread_name_prefix="mxref-hash") as pool:
        return list(pool.map(lambda job: job(), jobs))


class Arena:
    """One page-aligned host buffer holding every tensor of a model back to back.

    ``zeroed_mapping=True`` backs it with its own anonymous mapping, populated at once: its
    pages are faulted in once, in the kernel, and are zero (``allocated_zeroed``), so nothing
    has to touch or fill them; ``huge_pages`` asks for transparent huge pages there.
    A READ target is allocated so (``CpuBackend.allocate``)."""

    allocated_zeroed = False  # True: the memory was zero when allocated (no fill needed)

    def __init__(self, specs: list[TensorSpec], *, zeroed_mapping: bool = False, huge_pages: bool = True) -> None:
        self.specs = list(specs)
        self.offsets: list[int] = []
        off = 0
        for spec in self.specs:
            self.offsets.append(off)
            off += -(-spec.nbytes // ALIGN) * ALIGN
        self.nbytes = max(off, ALIGN)
        self._map: mmap.mmap | None = None
        if zeroed_mapping:
            self._map = _populated_anonymous_map(self.nbytes, huge=huge_pages)
            raw = np.frombuffer(self._map, dtype=np.uint8)  # page-aligned: a mapping starts on a page
            self.allocated_zeroed = True
        else:
            raw = np.empty(self.nbytes + ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        self.buffer = raw[start:start + self.nbytes]
        self._raw = raw

    @property
    def addr(self) -> int:
        return int(self.buffer.ctypes.data)

    def view(self, i: int) -> np.ndarray:
        spec = self.specs[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + spec.nbytes].view(spec.dtype).reshape(spec.shape)

    def raw(self, i: int) -> np.ndarray:
        return self.buffer[self.offsets[i]:self.offsets[i] + self.specs[i].nbytes]

    def regions(self) -> list[tuple[int, int]]:
        """(address, length) of each tensor."""
        return [(self.addr + off, spec.nbytes) for off, spec in zip(self.offsets, self.specs)]

    def checksum(self, i: int) -> str:
        return checksum(self.raw(i))

    def checksums(self) -> list[str]:
        """Every tensor's checksum, in spec order (tensors hashed side by side: ``hash_all``)."""
        return hash_all([functools.partial(self.checksum, i) for i in range(len(self.specs))])

    def tensors(self) -> dict[str, np.ndarray]:
        return {spec.name: self.view(i) for i, spec in enumerate(self.specs)}

    def fill(self, value: int = 0) -> None:
        self.buffer.fill(value)

    def release(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)
        self._raw = self.buffer
        self._map = None  # unmapped once no view of it is left


MADV_POPULATE_WRITE = 23  # Linux >= 5.14; Python's mmap module (3.11) does not name it
POPULATE_SLICE = 8 << 20  # a multiple of the huge page size (2 MiB)


LANDING_SLICE_BYTES = 1 << 20
"""Most bytes ``LandingChecksums.work`` hashes per call: ~35 us at xxh3's 30 GB/s here."""


class LandingChecksums:
    """A host arena's checksums, taken while a chunked READ is still landing the rest.

    ``landed(ranges)``: a chunk completed, so its local ``(addr, size, device_id)`` ranges hold
    their final bytes. Each tensor has one streaming xxh3-64 that takes its bytes in order, so a
    tensor's landed prefix (from its start up to the first byte still in flight) can be hashed
    before the rest of it lands. ``work()``, called between polls, hashes at most
    ``slice_bytes`` of such a prefix, so the poll loop is held ~35 us at a time, and how much is
    left for ``finish()`` no longer depends on the tensors' sizes (with whole tensors only, a
    2 GiB model of 256 MiB tensors always left at least one tensor for after its READ), only on
    the CPU the poll loop can spare: on 2 cores, where the READ keeps both busy, 0.09-0.14 s of
    hashing was left after a 2 GiB READ. ``finish()`` hashes what is left (``hash_all``) and
    returns every tensor's checksum: the same as ``Arena.checksums()`` then.

    Only bytes a completed transfer wrote are hashed before the end, and they are final: an
    attempt reads into fresh memory that no earlier, stalled READ can write (the reader's
    late-write guard); a checksum taken early would otherwise miss a late write.
    """

    def __init__(self, arena: Arena, slice_bytes: int = LANDING_SLICE_BYTES) -> None:
        self._arena = arena
        self._slice = max(1, slice_bytes)
        self._starts = [arena.addr + off for off in arena.offsets]
        self._sizes = [spec.nbytes for spec in arena.specs]
        self._landed = [0] * len(self._sizes)  # bytes landed, in any order
        self._frontier = [0] * len(self._sizes)  # end of the landed prefix
        self._ahead: list[dict[int, int]] = [{} for _ in self._sizes]  # landed past the prefix: start -> end
        # tensor -> (its hasher, bytes hashed); an empty tensor's prefix is whole from the start
        self._hashers: dict[int, tuple[Any, int]] = {i: (xxhash.xxh3_64(), 0) for i, size in enumerate(self._sizes) if size == 0}
        self._ready: deque[int] = deque(i for i, size in enumerate(self._sizes) if size == 0)  # prefix not all hashed
        self._digests: list[str | None] = [None] * len(self._sizes)
        self.during_read = 0  # tensors whose checksum was complete before ``finish``
        self.hashing_s = 0.0  # time spent hashing in ``work`` before ``finish`` (the READ loop's share)

    def landed(self, ranges: Sequence[tuple[int, int, int]]) -> None:
        for addr, size, _device in ranges:
            i = bisect.bisect_right(self._starts, addr) - 1
            start = addr - self._starts[i] if i >= 0 else -1
            if (i < 0 or start + size > self._sizes[i] or self._landed[i] + size > self._sizes[i]
                    or start < self._frontier[i] or start in self._ahead[i]):
                raise ValueError(f"landed range [{addr:#x}, +{size}) is not unlanded bytes of one tensor of this arena")
            self._landed[i] += size
            if start > self._frontier[i]:
                self._ahead[i][start] = start + size
                continue
            frontier, ahead = start + size, self._ahead[i]
            while frontier in ahead:
                frontier = ahead.pop(frontier)
            self._frontier[i] = frontier
            if i not in self._hashers:
                self._hashers[i] = (xxhash.xxh3_64(), 0)
                self._ready.append(i)
            elif i not in self._ready:
                self._ready.append(i)

    def work(self) -> bool:
        """Hash one slice of a tensor's landed prefix; False when there was nothing to hash."""
        if not self._ready:
            return False
        i = self._ready[0]
        hasher, done = self._hashers[i]
        end = min(done + self._slice, self._frontier[i])
        t0 = time.perf_counter()
        hasher.update(self._arena.raw(i)[done:end].data)
        self.hashing_s += time.perf_counter() - t0
        self._hashers[i] = (hasher, end)
        if end == self._sizes[i]:
            self._ready.popleft()
            self._digests[i] = hasher.hexdigest()
            del self._hashers[i]
            self.during_read += 1
        elif end == self._frontier[i]:
            self._ready.popleft()  # back when more of it lands
        return True

    def finish(self) -> list[str]:
        """Every tensor's checksum (in spec order), hashing now whatever is not hashed yet, as the
        memory holds it (side by side: ``hash_all``); a tensor begun goes on from where it was."""

        def rest(i: int) -> Callable[[], str]:
            digest = self._digests[i]
            if digest is not None:
                return lambda: digest
            if i not in self._hashers:
                return lambda: self._arena.checksum(i)
            hasher, done = self._hashers[i]

            def go_on() -> str:
                hasher.update(self._arena.raw(i)[done:].data)
                done_digest = str(hasher.hexdigest())
                self._digests[i] = done_digest  # once: a second ``finish`` takes it as it is
                return done_digest
            return go_on

        return hash_all([rest(i) for i in range(len(self._sizes))])


def _populated_anonymous_map(nbytes: int, *, huge: bool = True) -> mmap.mmap:
    """A private anonymous mapping of ``nbytes``, transparent huge pages asked for (``huge``), every page
    faulted in (writable, zero) by the kernel before it is returned; where the kernel lacks an
    advice, normal pages / touching them instead (never a failure).

    Huge pages, as numpy asks for its large arrays: with 4 KiB pages mxref's READ took 1.35x
    (256 MiB) and 1.86x (2 GiB) as long as the baseline reader's into a numpy array, with huge
    pages 1.16x (256 MiB; interleaved runs, UCX over TCP). Their cost is at allocation: with the kernel's
    THP defrag in ``madvise`` mode the fault path compacts memory directly (0.1-1.9 s for
    256 MiB on a busy machine, against 0.2-0.5 s for normal pages), so a reader allocates its
    first target beside the reference's computation, off the load's path, and a target wanted in
    a hurry (the next attempt's, after a stall) without them: 512 MiB with two CPU hogs took
    0.2-7.2 s (median 3.4 s) with huge pages and 0.55-1.8 s (median 1.15 s) without, interleaved."""
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None) if huge else None
    if advice is not None:
        try:
            mapping.madvise(advice)
        except OSError:
            pass  # THP off or unsupported: normal pages
    try:
        # in slices: populating holds the process's mmap lock, which stalls every other thread
        # that maps memory meanwhile (a gRPC channel starting its threads: measured 0.1-1.5 s)
        for start in range(0, nbytes, POPULATE_SLICE):
            mapping.madvise(MADV_POPULATE_WRITE, start, min(POPULATE_SLICE, nbytes - start))
    except OSError:
        np.frombuffer(mapping, dtype=np.uint8)[::mmap.PAGESIZE] = 0  # one write per page faults it in
    return mapping


SEED_SLICE_BYTES = 1 << 20
"""Bytes of a synthetic tensor drawn at once when filling an arena (a multiple of 8). Drawn whole,
each tensor was a fresh array whose pages were faulted in, then copied: a source's 512 MiB model
filled in 0.5-1.5 s; in slices (one warm buffer reused) 0.23-0.26 s, in fresh processes here."""


def _seeded_slices(seed: int, index: int, nbytes: int) -> Iterator[np.ndarray]:
    """Tensor ``index`` of a synthetic model of ``seed``, in order, ``SEED_SLICE_BYTES`` at a
    time: the first ``nbytes`` of the raw 64-bit outputs of ``PCG64([seed, index])``,
    little-endian (about 1.7 GB/s here, 15x ``Generator.bytes``). The generator's stream goes on
    from one draw to the next, so the slices joined are the bytes of one draw of ``nbytes``.
    Each slice is valid until the next is drawn."""
    generator = np.random.PCG64([seed, index])
    for start in range(0, nbytes, SEED_SLICE_BYTES):
        size = min(SEED_SLICE_BYTES, nbytes - start)
        yield generator.random_raw(-(-size // 8)).astype("<u8", copy=False).view(np.uint8)[:size]


def _seeded_checksum(seed: int, index: int, nbytes: int) -> str:
    """``checksum`` of tensor ``index`` of a synthetic model of ``seed``, drawn whole.

    Whole, not in slices, on purpose: a reader computes its reference this way, beside the
    allocation of its first READ target (which takes longer), so slices would not make its load
    sooner, and they change the reader's address space. NIXL 1.5.1's receive-buffer overrun
    (``segment_size_mismatch``) then no longer aborts the reader: 0 of 18 runs with the reference
    drawn in slices (of 1 MiB or 64 KiB), 10 of 18 drawn whole (2026-12-03; 14 of 16 measured
    before), so the release matrix would have called that defect fixed."""
    words = np.random.PCG64([seed, index]).random_raw(-(-nbytes // 8))
    return checksum(words.astype("<u8", copy=False).view(np.uint8)[:nbytes])


def generate(spec: ModelSpec) -> Arena:
    """Deterministic contents: tensor i comes from PCG64(seed, i)."""
    arena = Arena(spec.tensor_specs())
    fill_from_seed(arena, spec.seed)
    return arena


def fill_from_seed(arena: Arena, seed: int, first: int = 0) -> None:
    """Overwrite every tensor with the generator's bytes for ``seed`` (tensor i: PCG64(seed, first + i);
    ``first``: the model index of the arena's first tensor, for tensors added to a model after it was built)."""
    for i, t in enumerate(arena.specs):
        target, start = arena.raw(i), 0
        for piece in _seeded_slices(seed, first + i, t.nbytes):
            target[start:start + len(piece)] = piece
            start += len(piece)


def expected_checksums(spec: ModelSpec) -> dict[str, str]:
    return dict(Reference.from_spec(spec).checksums)


# ----------------------------------------------------------------------------- the content reference


def model_digest(entries: Iterable[tuple[TensorSpec, str]]) -> str:
    """``sha256:`` + SHA-256 hex of ``[[name, dtype, [shape...], checksum], ...]`` (canonical JSON)."""
    doc = [[t.name, t.dtype, [int(d) for d in t.shape], sum_] for t, sum_ in entries]
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=True)
    return DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def check_digest_syntax(digest: str, what: str) -> str:
    """``digest`` lowercased when it is ``sha256:`` + 64 hex digits; ValueError naming ``what`` otherwise."""
    value = digest.strip().lower()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        raise ValueError(f"{what}: {digest!r} is not a model digest (sha256: followed by 64 hex digits)")
    return value


@dataclass(frozen=True)
class Reference:
    """What a model's content must be: ``checksums`` (name -> xxh3-64 hex, tensor order) and
    the whole-model ``digest`` over ``tensors`` and those checksums (module docstring).
    ``origin`` says where it came from: ``spec`` | ``recorded`` | ``hashed`` | ``memory``."""

    tensors: tuple[TensorSpec, ...]
    checksums: dict[str, str]
    digest: str
    origin: str = "spec"

    @classmethod
    def of(cls, tensors: Iterable[TensorSpec], checksums: Iterable[str], origin: str) -> Reference:
        specs = tuple(tensors)
        sums = list(checksums)
        if len(sums) != len(specs):
            raise ValueError(f"{len(specs)} tensors but {len(sums)} checksums")
        names = [t.name for t in specs]
        if len(set(names)) != len(names):
            raise ValueError("tensor names repeat")
        return cls(specs, dict(zip(names, sums)), model_digest(zip(specs, sums)), origin)

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> Reference:
        """The reference of a synthetic model: its generator's bytes, each tensor drawn whole and
        hashed (``_seeded_checksum`` says why whole)."""
        specs = spec.tensor_specs()
        return cls.of(specs, (_seeded_checksum(spec.seed, i, t.nbytes) for i, t in enumerate(specs)), "spec")

    @classmethod
    def from_arena(cls, arena: Any, origin: str = "memory") -> Reference:
        """The reference of what ``arena`` holds now (its memory re-hashed; any arena type)."""
        return cls.of(arena.specs, arena.checksums(), origin)

    @classmethod
    def from_file(cls, path: Path) -> Reference:
        """The reference of a safetensors file by hashing its tensors (whatever it records)."""
        arena = load_checkpoint(path)
        try:
            return cls.from_arena(arena, "hashed")
        finally:
            arena.release()

    @classmethod
    def recorded(cls, path: Path) -> Reference | None:
        """The reference ``save_checkpoint`` recorded in ``path``'s ``__metadata__``, read without
        its tensor data; ``None`` when it records none. ValueError (naming the file and the key)
        when the record is malformed or disagrees with the file's own tensor list or digest."""
        meta, tensors = read_header(path)
        if META_CHECKSUMS not in meta and META_DIGEST not in meta:
            return None
        for key in (META_CHECKSUMS, META_DIGEST):
            if key not in meta:
                raise ValueError(f"{path}: __metadata__ has no {key!r} (recorded with the other one; both or neither)")
        try:
            sums = json.loads(meta[META_CHECKSUMS])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: __metadata__ {META_CHECKSUMS!r} is not JSON: {exc}") from None
        if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
            raise ValueError(f"{path}: __metadata__ {META_CHECKSUMS!r} must map tensor names to hex strings")
        if sorted(sums) != sorted(t.name for t in tensors):
            raise ValueError(f"{path}: __metadata__ {META_CHECKSUMS!r} names other tensors than the file holds")
        ref = cls.of(tensors, (sums[t.name] for t in tensors), "recorded")
        digest = check_digest_syntax(meta[META_DIGEST], f"{path}: __metadata__ {META_DIGEST!r}")
        if digest != ref.digest:
            raise ValueError(f"{path}: __metadata__ {META_DIGEST!r} is {digest}, but the recorded checksums "
                             f"and tensors give {ref.digest}")
        return ref

    def metadata(self) -> dict[str, str]:
        """The safetensors ``__metadata__`` entries recording this reference."""
        return {META_CHECKSUMS: json.dumps(self.checksums), META_DIGEST: self.digest}

    def layout_mismatch(self, tensors: Iterable[TensorSpec]) -> str | None:
        """Why ``tensors`` (names, dtypes, shapes, in order) are not this reference's, or None."""
        have = [(t.name, t.dtype, tuple(t.shape)) for t in tensors]
        want = [(t.name, t.dtype, tuple(t.shape)) for t in self.tensors]
        if have == want:
            return None
        if len(have) != len(want):
            return f"{len(have)} tensors, the reference has {len(want)}"
        first = next(i for i, (h, w) in enumerate(zip(have, want)) if h != w)
        return f"tensor {first} is {have[first]}, the reference says {want[first]}"

    def mismatches(self, checksums: Mapping[str, str]) -> list[str]:
        """Names of this reference's tensors whose checksum in ``checksums`` differs or is missing."""
        return [name for name, want in self.checksums.items() if checksums.get(name) != want]


def save_checkpoint(arena: Arena, path: Path, spec: ModelSpec | None = None,
                    reference: Reference | None = None) -> Reference:
    """Write the arena's tensors as one safetensors file (the disk-fallback checkpoint), recording
    ``reference`` (default: the arena's own content) in its ``__metadata__``; returns it."""
    # late: safetensors only for a checkpoint or model file
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    ref = reference if reference is not None else Reference.from_arena(arena, "spec" if spec else "hashed")
    meta = ref.metadata()
    if spec is not None:
        meta[META_SPEC] = spec.to_json()
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file({name: np.ascontiguousarray(t) for name, t in arena.tensors().items()}, str(tmp), metadata=meta)
    tmp.replace(path)
    return ref


def read_header(path: Path) -> tuple[dict[str, str], list[TensorSpec]]:
    """A safetensors file's ``__metadata__`` and tensor list (tensor order), without its data."""
    # late: safetensors only for a checkpoint or model file
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata() or {})
        tensors = []
        for name in sorted(f.keys(), key=_natural_key):
            part = f.get_slice(name)
            dtype = SAFETENSORS_DTYPES.get(part.get_dtype())
            if dtype is None:
                raise ValueError(f"{path}: tensor {name!r} has dtype {part.get_dtype()} "
                                 f"(supported: {', '.join(SAFETENSORS_DTYPES)})")
            tensors.append(TensorSpec(name=name, shape=tuple(int(d) for d in part.get_shape()), dtype=dtype))
    return meta, tensors


def load_checkpoint(path: Path) -> Arena:
    """Read a safetensors file into a fresh arena (tensor order). Its recorded reference, if
    any, is ``Reference.recorded(path)``; nothing here is verified. The file is read with
    read(), not mapped: a disk that fails a read (EIO) is then an OSError the reader reports,
    where a mapped page that cannot be read kills the process with SIGBUS."""
    # late: safetensors only for a checkpoint or model file
    from safetensors.numpy import load

    if os.environ.get("MXREF_SIMULATED_BUG") == "mapped_checkpoint":  # SIMULATED BUG: the mapped read (SIGBUS on EIO)
        # late: safetensors only for a checkpoint or model file
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            arrays = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 - safe_open is no dict
    else:
        arrays = load(path.read_bytes())
    names = list(arrays)
    order = sorted(names, key=_natural_key)
    specs = [TensorSpec(name=n, shape=tuple(arrays[n].shape), dtype=str(arrays[n].dtype)) for n in order]
    arena = Arena(specs)
    for i, n in enumerate(order):
        arena.view(i)[...] = arrays[n]
    return arena


def _natural_key(name: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def add_model_args(p: argparse.ArgumentParser, checkpoint_required: bool = False) -> None:
    """The model flags every role that holds a model takes (a synthetic spec, or a safetensors file)."""
    g = p.add_argument_group("model (a synthetic spec, or a safetensors file)")
    g.add_argument("--model-name", default="mxref/synthetic")
    g.add_argument("--tensors", type=int, default=16)
    g.add_argument("--tensor-mib", type=float, default=4.0, help="MiB per tensor (default 4)")
    g.add_argument("--dtype", default="float16")
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic bytes")
    g.add_argument("--model-file", type=Path, default=None,
                   help="this safetensors file is the model (a source serves its tensors, verified first "
                        "against the checksums recorded in it; a reader expects its content)")
    g.add_argument("--expect-digest", default=None, metavar="DIGEST",
                   help="the whole-model digest (sha256:<64 hex>) the model must have; exit 2 otherwise")
    p.add_argument("--checkpoint", type=Path, default=None, required=checkpoint_required,
                   help="safetensors checkpoint (reader: disk fallback; prepare: output)")


def model_spec(args: ModelFlags) -> ModelSpec:
    """The synthetic model the flags of ``add_model_args`` name (its tensor size cut to whole elements)."""
    tensor_bytes = int(args.tensor_mib * (1 << 20))
    tensor_bytes -= tensor_bytes % np.dtype(args.dtype).itemsize
    return ModelSpec(name=args.model_name, tensors=args.tensors, tensor_bytes=tensor_bytes, dtype=args.dtype,
                     seed=args.seed)


def spec_from_flags(flags: Sequence[str]) -> ModelSpec:
    """The synthetic model named by model flags, as ``python -m mxref ROLE`` reads them (the
    harness's oracle parses a scenario's model with this, so both mean the same model). Flags
    that are not model flags are ignored."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_model_args(parser)
    args, _ = parse_known(parser, list(flags), ModelFlags)
    return model_spec(args)
