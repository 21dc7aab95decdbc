"""The content reference (``mxref.model.Reference``): from a spec, from the metadata a
checkpoint records, from hashing a file, all agree; one changed byte changes it; a bad
record is refused naming the file and the key. Also the ``--debug-hooks`` corruption
toggle, with a real SIGUSR2 to this process.

The expected digest is computed here from the formula (PCG64 bytes, xxh3-64, SHA-256
over the canonical JSON list), not taken from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from safetensors.numpy import save_file

from mxref.debug_hooks import CorruptionToggle, flip_first_bytes
from mxref.model import (
    META_CHECKSUMS,
    META_DIGEST,
    SEED_SLICE_BYTES,
    ModelSpec,
    Reference,
    TensorSpec,
    check_digest_syntax,
    generate,
    load_checkpoint,
    read_header,
    save_checkpoint,
)

SPEC = ModelSpec(name="mxref/unit", tensors=4, tensor_bytes=4096, dtype="float16", seed=3)


def formula(spec: ModelSpec, seed: int | None = None) -> tuple[dict[str, str], str]:
    """(checksums, digest) of a synthetic model, straight from the definition."""
    item = np.dtype(spec.dtype).itemsize
    sums: dict[str, str] = {}
    doc = []
    for i in range(spec.tensors):
        rng = np.random.Generator(np.random.PCG64([spec.seed if seed is None else seed, i]))
        name = f"model.layers.{i}.weight"
        sums[name] = xxhash.xxh3_64_hexdigest(rng.bytes(spec.tensor_bytes))
        doc.append([name, spec.dtype, [spec.tensor_bytes // item], sums[name]])
    text = json.dumps(doc, separators=(",", ":"))
    return sums, "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_the_reference_of_a_spec_is_the_formula() -> None:
    sums, digest = formula(SPEC)
    ref = Reference.from_spec(SPEC)
    assert ref.checksums == sums and list(ref.checksums) == list(sums)  # tensor order
    assert ref.digest == digest and ref.origin == "spec"
    assert [t.name for t in ref.tensors] == list(sums)


def test_a_tensor_drawn_in_slices_is_the_tensor_drawn_at_once() -> None:
    """Filled ``SEED_SLICE_BYTES`` at a time, a tensor of two slices and 6 bytes (not a whole
    64-bit word) is still one draw of the generator: its memory hashes to the reference, which
    draws each tensor whole, and both are the formula's."""
    spec = ModelSpec(name="mxref/unit", tensors=2, tensor_bytes=2 * SEED_SLICE_BYTES + 6, dtype="float16", seed=4)
    sums, digest = formula(spec)
    assert Reference.from_spec(spec).checksums == sums
    assert Reference.from_spec(spec).digest == digest
    arena = generate(spec)
    try:
        assert Reference.from_arena(arena).digest == digest
    finally:
        arena.release()


def test_spec_memory_recorded_metadata_and_file_hashes_agree(tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    arena = generate(SPEC)
    written = save_checkpoint(arena, path, SPEC)
    from_spec = Reference.from_spec(SPEC)
    recorded = Reference.recorded(path)
    hashed = Reference.from_file(path)
    assert recorded is not None
    for ref in (written, Reference.from_arena(arena), recorded, hashed):
        assert (ref.checksums, ref.digest, ref.tensors) == (from_spec.checksums, from_spec.digest, from_spec.tensors)
    assert (recorded.origin, hashed.origin) == ("recorded", "hashed")
    meta, tensors = read_header(path)
    assert meta[META_DIGEST] == from_spec.digest and json.loads(meta[META_CHECKSUMS]) == from_spec.checksums
    assert tuple(tensors) == from_spec.tensors


@pytest.mark.parametrize("tensor", [0, 3])
def test_one_byte_changes_the_digest_and_only_that_tensors_checksum(tensor: int) -> None:
    arena = generate(SPEC)
    before = Reference.from_arena(arena)
    arena.raw(tensor)[-1] ^= 0x01
    after = Reference.from_arena(arena)
    assert after.digest != before.digest
    name = f"model.layers.{tensor}.weight"
    assert before.mismatches(after.checksums) == [name]
    assert [n for n in before.checksums if before.checksums[n] != after.checksums[n]] == [name]


def test_another_seed_is_another_reference() -> None:
    other = Reference.from_spec(ModelSpec(**{**json.loads(SPEC.to_json()), "seed": 4}))
    assert other.digest == formula(SPEC, seed=4)[1] != Reference.from_spec(SPEC).digest
    assert len(Reference.from_spec(SPEC).mismatches(other.checksums)) == SPEC.tensors


def test_the_digest_covers_names_dtypes_and_shapes_not_only_bytes() -> None:
    ref = Reference.from_spec(SPEC)
    sums = list(ref.checksums.values())
    renamed = [TensorSpec(f"x.{i}", t.shape, t.dtype) for i, t in enumerate(ref.tensors)]
    reshaped = [TensorSpec(t.name, (2, t.shape[0] // 2), t.dtype) for t in ref.tensors]
    retyped = [TensorSpec(t.name, (t.shape[0] // 2,), "float32") for t in ref.tensors]
    digests = {Reference.of(tensors, sums, "spec").digest for tensors in (renamed, reshaped, retyped)}
    assert len(digests | {ref.digest}) == 4


def test_a_file_without_a_record_has_no_recorded_reference_but_can_be_hashed(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.linspace(0, 1, 5, dtype=np.float32)
    save_file({"b.weight": b, "a.weight": a}, str(path))
    assert Reference.recorded(path) is None
    ref = Reference.from_file(path)
    assert [t.name for t in ref.tensors] == ["a.weight", "b.weight"]  # natural order, not the file's
    assert ref.checksums == {"a.weight": xxhash.xxh3_64_hexdigest(a.tobytes()),
                             "b.weight": xxhash.xxh3_64_hexdigest(b.tobytes())}
    assert ref.tensors[0] == TensorSpec("a.weight", (2, 3), "int32")


def _with_metadata(tmp_path: Path, meta: dict[str, str]) -> Path:
    arena = generate(SPEC)
    path = tmp_path / "meta.safetensors"
    save_file({n: np.ascontiguousarray(t) for n, t in arena.tensors().items()}, str(path), metadata=meta)
    return path


@pytest.mark.parametrize(("change", "message"), [
    ("no_digest", "has no 'mxref_digest'"),
    ("not_json", "'mxref_checksums' is not JSON"),
    ("other_names", "names other tensors"),
    ("bad_digest_syntax", "is not a model digest"),
    ("inconsistent_digest", "but the recorded checksums and tensors give"),
])
def test_a_malformed_record_is_refused_naming_the_file_and_key(tmp_path: Path, change: str, message: str) -> None:
    good = Reference.from_spec(SPEC).metadata()
    meta = dict(good)
    if change == "no_digest":
        del meta[META_DIGEST]
    elif change == "not_json":
        meta[META_CHECKSUMS] = "{oops"
    elif change == "other_names":
        meta[META_CHECKSUMS] = json.dumps({"x": "0"})
    elif change == "bad_digest_syntax":
        meta[META_DIGEST] = "md5:abc"
    else:
        meta[META_DIGEST] = "sha256:" + "0" * 64
    path = _with_metadata(tmp_path, meta)
    with pytest.raises(ValueError, match=message) as info:
        Reference.recorded(path)
    assert str(path) in str(info.value)


def test_layout_mismatch_names_the_first_difference() -> None:
    ref = Reference.from_spec(SPEC)
    assert ref.layout_mismatch(ref.tensors) is None
    assert ref.layout_mismatch(ref.tensors[:2]) == "2 tensors, the reference has 4"
    changed = list(ref.tensors)
    changed[1] = TensorSpec(changed[1].name, changed[1].shape, "int16")
    assert "tensor 1" in (ref.layout_mismatch(changed) or "")


def test_digest_syntax() -> None:
    digest = Reference.from_spec(SPEC).digest
    assert check_digest_syntax(" " + digest.upper().replace("SHA256", "sha256") + " ", "x") == digest
    with pytest.raises(ValueError, match="--expect-digest: 'abc' is not a model digest"):
        check_digest_syntax("abc", "--expect-digest")


def test_load_checkpoint_returns_the_bytes_written(tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    arena = generate(SPEC)
    save_checkpoint(arena, path, SPEC)
    loaded = load_checkpoint(path)
    assert [loaded.raw(i).tobytes() for i in range(4)] == [arena.raw(i).tobytes() for i in range(4)]


# ----------------------------------------------------------------------------- --debug-hooks


def test_flip_first_bytes_corrupts_every_tensor_and_a_second_flip_restores() -> None:
    arena = generate(SPEC)
    original = [arena.raw(i).tobytes() for i in range(4)]
    ref = Reference.from_arena(arena)
    assert flip_first_bytes(arena) == 4
    assert all(arena.raw(i)[0] == original[i][0] ^ 0xFF for i in range(4))
    assert all(arena.raw(i).tobytes()[1:] == original[i][1:] for i in range(4))
    assert len(ref.mismatches(Reference.from_arena(arena).checksums)) == 4
    flip_first_bytes(arena)
    assert [arena.raw(i).tobytes() for i in range(4)] == original


def test_sigusr2_toggles_the_corruption_and_reports_it() -> None:
    arena = generate(SPEC)
    ref = Reference.from_arena(arena)
    seen: list[dict[str, Any]] = []
    arrived = threading.Semaphore(0)

    def emit(event: str, **fields: Any) -> None:
        seen.append({"event": event, **fields})
        arrived.release()

    hooks = CorruptionToggle(emit, arena).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert arrived.acquire(timeout=5), "no debug_corrupt after SIGUSR2"
        addrs = [addr for addr, _size in arena.regions()]  # where it flipped: the corrupt fault reads them back
        assert seen[-1] == {"event": "debug_corrupt", "corrupted": True, "tensors": 4, "memory": "host", "addrs": addrs}
        assert len(ref.mismatches(Reference.from_arena(arena).checksums)) == 4
        os.kill(os.getpid(), signal.SIGUSR2)
        assert arrived.acquire(timeout=5)
        assert seen[-1] == {"event": "debug_corrupt", "corrupted": False, "tensors": 4, "memory": "host", "addrs": addrs}
        assert Reference.from_arena(arena).digest == ref.digest
    finally:
        hooks.close()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_a_toggle_without_memory_reports_nothing_corrupted() -> None:
    seen: list[dict[str, Any]] = []
    hooks = CorruptionToggle(lambda event, **f: seen.append({"event": event, **f}))
    assert hooks.toggle() is False
    assert seen == [{"event": "debug_corrupt", "corrupted": False, "tensors": 0}]
