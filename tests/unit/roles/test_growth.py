"""``grown_reference``: the reference one manifest answer grows a reader's into (mxref.roles.growth)."""

from __future__ import annotations

from mxref.model import Reference, TensorSpec
from mxref.roles.growth import grown_reference
from mxref.v1 import p2p_pb2

SPECS = [TensorSpec(f"w.{i}", (8,), "float16") for i in range(4)]
SUMS = [f"{i:016x}" for i in range(4)]
BASE = Reference.of(SPECS[:2], SUMS[:2], "spec")


def desc(i: int, checksum: str | None = None, dtype: str = "float16") -> p2p_pb2.TensorDescriptor:
    s = SPECS[i]
    return p2p_pb2.TensorDescriptor(name=s.name, size=s.nbytes, dtype=dtype, shape=list(s.shape),
                                    checksum=SUMS[i] if checksum is None else checksum)


def test_the_first_manifest_keeps_the_operators_reference() -> None:
    assert grown_reference(BASE, [desc(0), desc(1)]) is BASE


def test_a_grown_manifest_adds_its_tensors_after_the_references() -> None:
    grown = grown_reference(BASE, [desc(0), desc(1), desc(2), desc(3)])
    assert [t.name for t in grown.tensors] == ["w.0", "w.1", "w.2", "w.3"]
    assert grown.checksums == dict(zip(["w.0", "w.1", "w.2", "w.3"], SUMS))
    assert grown.digest == Reference.of(SPECS, SUMS, "x").digest and grown.origin == "manifest"


def test_a_changed_tensor_of_the_reference_is_not_adopted() -> None:
    assert grown_reference(BASE, [desc(0), desc(1, checksum="f" * 16), desc(2)]) is BASE
    assert grown_reference(BASE, [desc(0), desc(2), desc(3)]) is BASE  # one of ours missing


def test_an_added_tensor_that_claims_nothing_verifiable_is_not_adopted() -> None:
    assert grown_reference(BASE, [desc(0), desc(1), desc(2, checksum="")]) is BASE
    assert grown_reference(BASE, [desc(0), desc(1), desc(2, dtype="complex128")]) is BASE
    assert grown_reference(BASE, [desc(0), desc(1), desc(2), desc(2)]) is BASE  # a name twice


def test_added_tensors_hold_the_generators_next_ones() -> None:
    """What a growing source fills its added tensors with (``fill_from_seed(first=)``) is the bigger
    model's tail, so the grown manifest is the same seed's model with more tensors."""
    from mxref.model import Arena, ModelSpec, expected_checksums, fill_from_seed

    spec = ModelSpec(tensors=5, tensor_bytes=4096, seed=3)
    tail = Arena(spec.tensor_specs()[3:])
    try:
        fill_from_seed(tail, 3, first=3)
        want = expected_checksums(spec)
        assert tail.checksums() == [want["model.layers.3.weight"], want["model.layers.4.weight"]]
    finally:
        tail.release()
