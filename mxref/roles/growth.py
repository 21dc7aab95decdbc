"""A manifest that grew after publishing (ModelExpress 0.8): what a reader with ``accept_growth`` reads.

A source may add tensors to its model and republish the grown manifest under the same identity
(``mxref.roles.source.SourceService.grow``). A reader sees one manifest per attempt (one
``GetTensorManifest`` answer, or the lease's): either the one it was built for or a grown one.
``grown_reference`` says which reference that attempt reads and verifies as, from that one answer
only: the operator's ``base`` when the manifest adds nothing, or when it changes any of ``base``'s
tensors (the reader's usual mismatch then refuses it); otherwise ``base``'s tensors, unchanged,
followed by the added ones as the manifest describes them (name, dtype, shape, checksum). An added
tensor without a dtype, shape or checksum claims nothing the reader could verify, so such a
manifest is not adopted either. Never a mix: every tensor name, size and checksum of the result
comes from ``base`` or from that same answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from mxref.model import DTYPES, Reference, TensorSpec
from mxref.v1 import p2p_pb2

__all__ = ["grown_reference"]


def _same(spec: TensorSpec, checksum: str, d: p2p_pb2.TensorDescriptor) -> bool:
    return (d.size == spec.nbytes and (not d.dtype or d.dtype.removeprefix("torch.") == spec.dtype)
            and (not d.shape or tuple(d.shape) == tuple(spec.shape)) and (not d.checksum or d.checksum == checksum))


def grown_reference(base: Reference, tensors: Sequence[p2p_pb2.TensorDescriptor]) -> Reference:
    """The reference one manifest answer (``tensors``) grows ``base`` into (module docstring)."""
    by_name = {d.name: d for d in tensors}
    known = {t.name for t in base.tensors}
    added = [d for d in tensors if d.name not in known]
    if not added or len(by_name) != len(tensors):
        return base
    if any(t.name not in by_name or not _same(t, base.checksums[t.name], by_name[t.name]) for t in base.tensors):
        return base
    specs: list[TensorSpec] = []
    for d in added:
        if d.dtype.removeprefix("torch.") not in DTYPES:
            return base
        spec = TensorSpec(name=d.name, shape=tuple(int(n) for n in d.shape), dtype=d.dtype.removeprefix("torch."))
        if not d.checksum or not d.shape or not d.dtype or spec.nbytes != d.size:
            return base
        specs.append(spec)
    return Reference.of((*base.tensors, *specs), (*base.checksums.values(), *(d.checksum for d in added)), "manifest")
