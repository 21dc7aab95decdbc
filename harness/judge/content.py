"""Expected content: what the scenario's model holds, as the harness computes it itself.

The ``integrity`` check's oracle. It never takes a peer's word: no checksum from an mxref
event, manifest or checkpoint metadata is used. A synthetic model is rebuilt from the
scenario's own model flags (parsed by mxref's command line, so the harness means exactly the
model its processes were started with) with the generator's definition (tensor ``i`` is
the raw outputs of ``PCG64([seed, i])``: a unit test holds this to ``mxref.model.generate``); a model
``file`` is read with the ``safetensors`` library. Each tensor is hashed here with
``xxhash`` (xxh3-64), one tensor at a time, so a large model never sits in memory whole. The
result's types (``ExpectedModel``) live in ``harness.record.expected``, which the checks import.

Also here: the tampered checkpoint copy a reader with ``tamper_checkpoint`` falls back to
(``reader_checkpoint``, called by the runner when it starts that reader).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from harness.errors import HarnessError
from harness.faults.disk import checkpoint_folder
from harness.record.expected import ExpectedModel, ExpectedTensor, digest_of
from harness.scenario import FaultStep, ReaderProcess, iter_steps
from mxref.model import spec_from_flags

if TYPE_CHECKING:
    # late: safetensors only for a scenario that names a model file
    from harness.record.timeline import Timeline
    from harness.scenario import Scenario
    from harness.scenario.models import TamperCheckpoint

__all__ = [
    "ExpectedModel",
    "ExpectedTensor",
    "digest_of",
    "expected_model",
    "grown_model",
    "lazy_grown",
    "lazy_expected",
    "reader_checkpoint",
    "tamper_copy",
    "tensor_checksum",
]


def _xxh(data: bytes | memoryview) -> str:
    return xxhash.xxh3_64_hexdigest(data)


GENERATED_SLICE_BYTES = 1 << 20  # a multiple of 8: the generator's stream goes on across draws


def tensor_checksum(seed: int, index: int, nbytes: int) -> str:
    """The xxh3-64 of tensor ``index`` of a synthetic model of ``seed`` (the generator's
    definition: the raw 64-bit outputs of ``PCG64([seed, index])``, little-endian, cut to
    ``nbytes``), drawn and hashed ``GENERATED_SLICE_BYTES`` at a time: the same bytes and
    digest as one draw, without a tensor-sized array (a 512 MiB model: 0.62-0.84 s of every
    run's judging when each tensor was drawn whole and copied twice)."""
    generator = np.random.PCG64([seed, index])
    hasher = xxhash.xxh3_64()
    for start in range(0, nbytes, GENERATED_SLICE_BYTES):
        size = min(GENERATED_SLICE_BYTES, nbytes - start)
        hasher.update(generator.random_raw(-(-size // 8)).astype("<u8", copy=False).view(np.uint8)[:size].data)
    return hasher.hexdigest()


def _from_generator(flags: list[str], added: int = 0) -> ExpectedModel:
    """The synthetic model of ``flags``; ``added``: with that many more tensors of its tensor size
    (the generator's next indices: a source's ``grow_tensors``)."""
    spec = spec_from_flags(flags)
    if added:
        sizes = spec.sizes or (spec.tensor_bytes,) * spec.tensors
        spec = dataclasses.replace(spec, sizes=(*sizes, *(spec.tensor_bytes,) * added))
    tensors = tuple(
        ExpectedTensor(t.name, t.dtype, tuple(t.shape), tensor_checksum(spec.seed, i, t.nbytes))
        for i, t in enumerate(spec.tensor_specs())
    )
    origin = f"generator: {spec.tensors} x {spec.tensor_bytes} B {spec.dtype}, seed {spec.seed}"
    return ExpectedModel(origin + (f", {added} tensor(s) added" if added else ""), tensors)


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _from_file(path: Path) -> ExpectedModel:
    # late: safetensors only for a scenario that names a model file
    from safetensors import safe_open

    if not path.is_file():
        raise HarnessError(f"model.file {path}: no such file, so the expected content cannot be computed")
    tensors = []
    with safe_open(str(path), framework="numpy") as f:
        for name in sorted(f.keys(), key=_natural):
            array = np.ascontiguousarray(f.get_tensor(name))
            tensors.append(ExpectedTensor(name, str(array.dtype), tuple(array.shape), _xxh(array.view(np.uint8).data)))
            del array
    return ExpectedModel(f"file: {path}", tuple(tensors))


def expected_model(sc: Scenario) -> ExpectedModel:
    """The scenario's model as the harness computes it (tensor by tensor)."""
    if sc.model.file:
        return _from_file((sc.directory / sc.model.file).resolve())
    return _from_generator(sc.model.flags(sc.seed, sc.directory))


def grown_model(sc: Scenario, added: int) -> ExpectedModel:
    """The scenario's synthetic model with ``added`` more tensors (a manifest that grew after
    publishing), as the harness computes it; HarnessError for a model file (nothing to grow)."""
    if sc.model.file:
        raise HarnessError(f"model.file {sc.model.file}: a model file cannot grow; the grown generation "
                           "is computed for a synthetic model only")
    return _from_generator(sc.model.flags(sc.seed, sc.directory), added)


def lazy_grown(sc: Scenario) -> Callable[[int], ExpectedModel]:
    """``grown_model(sc, added)``, each computed once."""
    return functools.cache(lambda added: grown_model(sc, added))


def lazy_expected(sc: Scenario) -> Callable[[], ExpectedModel]:
    """``expected_model(sc)``, computed on the first call only (a run without an ``integrity``
    check never computes it)."""
    return functools.cache(lambda: expected_model(sc))


# ---------------------------------------------------------------------------- tampering


def _tensors_in(path: Path) -> Iterator[tuple[str, Any]]:
    # late: safetensors only for a scenario that names a model file
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        for name in sorted(f.keys(), key=_natural):
            yield name, f.get_tensor(name)


def tamper_copy(src: Path, dst: Path, tamper: TamperCheckpoint, metadata: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Write a copy of checkpoint ``src`` to ``dst`` with one byte XORed; returns what it did.
    ``tamper.consistent``: the copy's recorded checksums (``mxref_checksums``) match its
    tampered bytes; else they stay the ones ``src`` recorded."""
    # late: safetensors only for a scenario that names a model file
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(src), framework="numpy") as f:
        meta = dict(f.metadata() or {})
    if metadata:
        meta.update(metadata)
    arrays = dict(_tensors_in(src))
    names = list(arrays)
    if tamper.tensor >= len(names):
        raise HarnessError(
            f"tamper_checkpoint.tensor: {tamper.tensor} is not a tensor index of {src} "
            f"(it holds {len(names)} tensors: 0..{len(names) - 1})"
        )
    name = names[tamper.tensor]
    raw = np.ascontiguousarray(arrays[name]).copy()
    view = raw.reshape(-1).view(np.uint8)
    if tamper.byte >= view.size:
        raise HarnessError(
            f"tamper_checkpoint.byte: {tamper.byte} is past the end of tensor {name!r} of {src} ({view.size} bytes)"
        )
    before = _xxh(view.data)
    view[tamper.byte] ^= tamper.xor
    arrays[name] = raw
    if tamper.consistent:
        meta["mxref_checksums"] = json.dumps(
            {n: _xxh(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data) for n, a in arrays.items()}
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    save_file(arrays, str(tmp), metadata=meta)
    tmp.replace(dst)
    return {
        "checkpoint": str(dst),
        "from": str(src),
        "tensor": name,
        "byte": tamper.byte,
        "xor": tamper.xor,
        "consistent": tamper.consistent,
        "checksum_before": before,
        "checksum_after": _xxh(view.data),
    }


def reader_checkpoint(sc: Scenario, name: str, prepared: Path | None, run_dir: Path, timeline: Timeline) -> Path | None:
    """The checkpoint reader ``name`` is started with: ``prepared``, or for a reader with
    ``tamper_checkpoint`` a tampered copy of it in the run folder (written once, recorded as
    the harness's ``tamper_checkpoint`` entry), or for a reader a fault on its checkpoint
    folder targets (``disk``) the same file in a folder of its own there."""
    spec = sc.processes[name]
    if prepared is not None and isinstance(spec, ReaderProcess) and _checkpoint_faulted(sc, name):
        return _own_folder_copy(prepared, run_dir, name, timeline)
    if not isinstance(spec, ReaderProcess) or spec.tamper_checkpoint is None or prepared is None:
        return prepared
    dst = run_dir / "checkpoints" / f"{name}.tampered.safetensors"
    if not dst.is_file():
        record = tamper_copy(prepared, dst, spec.tamper_checkpoint)
        timeline.append("info", "harness", "tamper_checkpoint", {"reader": name, **record})
    return dst


def _checkpoint_faulted(sc: Scenario, reader: str) -> bool:
    """Whether a fault of the scenario acts on ``reader``'s checkpoint folder (its spec's
    ``on_checkpoint``, e.g. ``disk``)."""
    return any(isinstance(ref.step, FaultStep) and getattr(type(ref.step.fault), "on_checkpoint", False)
               and getattr(ref.step.fault, "target", None) == reader for ref in iter_steps(sc.steps))


def _own_folder_copy(prepared: Path, run_dir: Path, reader: str, timeline: Timeline) -> Path:
    """``prepared`` copied into ``<run>/checkpoints/<reader>/`` (recorded as ``checkpoint_folder``).
    A copy, never a hard link: a hard link is the cache's own file, and anything written through
    the faulted folder (or its FUSE layer) would rewrite the checkpoint every later run reads."""
    folder = checkpoint_folder(run_dir, reader)
    dst = folder / prepared.name
    if not dst.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(prepared, dst)
        timeline.append("info", "harness", "checkpoint_folder", {"reader": reader, "folder": str(folder), "how": "copy"})
    return dst
