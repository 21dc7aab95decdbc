"""Source identity and its content hash, ``mx_source_id``.

The hash is the first 16 hex characters of SHA-256 over a canonical JSON of the
identity: sorted keys, no whitespace, strings lowercased, enums as numbers,
``extra_parameters`` sorted by original key then lowercased (first value wins on a
case collision), and the optional compatibility fields present only when set. It
matches ModelExpress's published test vectors, so identities hash the same on both.
"""

from __future__ import annotations

import hashlib
import json

from mxref.v1 import p2p_pb2

_OPTIONAL_FIELDS = (
    "backend_framework_version",
    "torch_version",
    "cuda_version",
    "triton_version",
    "gpu_arch",
    "compile_config_digest",
)


def canonical_json(identity: p2p_pb2.SourceIdentity) -> str:
    extra: dict[str, str] = {}
    for key in sorted(identity.extra_parameters):
        lowered = key.lower()
        if lowered not in extra:
            extra[lowered] = identity.extra_parameters[key].lower()
    doc: dict[str, object] = {
        "mx_version": identity.mx_version.lower(),
        "mx_source_type": int(identity.mx_source_type),
        "model_name": identity.model_name.lower(),
        "backend_framework": int(identity.backend_framework),
        "tensor_parallel_size": identity.tensor_parallel_size,
        "pipeline_parallel_size": identity.pipeline_parallel_size,
        "expert_parallel_size": identity.expert_parallel_size,
        "dtype": identity.dtype.lower(),
        "quantization": identity.quantization.lower(),
        "extra_parameters": extra,
        "revision": identity.revision.lower(),
    }
    for name in _OPTIONAL_FIELDS:
        value = getattr(identity, name)
        if value:
            doc[name] = value.lower()
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def mx_source_id(identity: p2p_pb2.SourceIdentity) -> str:
    """16 hex chars identifying what a source holds (see module docstring)."""
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:16]
