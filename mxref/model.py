"""Model weights for sources, readers and the disk checkpoint.

A ``ModelSpec`` describes a synthetic model (tensor count, sizes, dtype, seed);
its bytes are deterministic, so any process can regenerate or verify them. A
source may instead serve a safetensors file. Checksums are xxh3-64 per tensor.
Tensors live in one contiguous host ``Arena`` (page aligned) so registration and
freeing are single operations, with one NIXL descriptor per tensor.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

ALIGN = 4096
DTYPES = ("float32", "float16", "int8", "uint8", "int32", "int64")


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

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ModelSpec:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(doc) - known
        if unknown:
            raise ValueError(f"unknown model spec keys: {sorted(unknown)} (known: {sorted(known)})")
        doc = dict(doc)
        if "sizes" in doc:
            doc["sizes"] = tuple(int(s) for s in doc["sizes"])
        return cls(**doc)


def checksum(buf: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(buf).view(np.uint8).data)


class Arena:
    """One page-aligned host buffer holding every tensor of a model back to back."""

    def __init__(self, specs: list[TensorSpec]) -> None:
        self.specs = list(specs)
        self.offsets: list[int] = []
        off = 0
        for spec in self.specs:
            self.offsets.append(off)
            off += -(-spec.nbytes // ALIGN) * ALIGN
        self.nbytes = max(off, ALIGN)
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
        return [self.checksum(i) for i in range(len(self.specs))]

    def tensors(self) -> dict[str, np.ndarray]:
        return {spec.name: self.view(i) for i, spec in enumerate(self.specs)}

    def fill(self, value: int = 0) -> None:
        self.buffer.fill(value)

    def release(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)
        self._raw = self.buffer


def generate(spec: ModelSpec) -> Arena:
    """Deterministic contents: tensor i comes from PCG64(seed, i)."""
    arena = Arena(spec.tensor_specs())
    for i, t in enumerate(arena.specs):
        rng = np.random.Generator(np.random.PCG64([spec.seed, i]))
        arena.raw(i)[:] = np.frombuffer(rng.bytes(t.nbytes), dtype=np.uint8)
    return arena


def expected_checksums(spec: ModelSpec) -> dict[str, str]:
    arena = generate(spec)
    sums = dict(zip((t.name for t in arena.specs), arena.checksums()))
    arena.release()
    return sums


def save_checkpoint(arena: Arena, path: Path, spec: ModelSpec | None = None) -> None:
    """Write the arena's tensors as one safetensors file (the disk-fallback checkpoint)."""
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"mxref_checksums": json.dumps(dict(zip((t.name for t in arena.specs), arena.checksums())))}
    if spec is not None:
        meta["mxref_model_spec"] = spec.to_json()
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file({name: np.ascontiguousarray(t) for name, t in arena.tensors().items()}, str(tmp), metadata=meta)
    tmp.replace(path)


def load_checkpoint(path: Path) -> tuple[Arena, dict[str, str]]:
    """Read a safetensors file into a fresh arena. Returns the arena and its recorded checksums."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        names = list(f.keys())
        arrays = {n: f.get_tensor(n) for n in names}
    order = sorted(names, key=_natural_key)
    specs = [TensorSpec(name=n, shape=tuple(arrays[n].shape), dtype=str(arrays[n].dtype)) for n in order]
    arena = Arena(specs)
    for i, n in enumerate(order):
        arena.view(i)[...] = arrays[n]
    sums = json.loads(meta.get("mxref_checksums", "{}"))
    return arena, sums


def _natural_key(name: str) -> list[object]:
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
