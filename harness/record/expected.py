"""The expected model as values: each tensor's name, dtype, shape and checksum, and the
whole-model digest, as the harness computed them (``harness.judge.content`` computes them; the
``integrity`` check judges a run by them). A leaf: the checks import it without importing the
scenario that ``harness.judge.content`` reads."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

__all__ = ["ExpectedModel", "ExpectedTensor", "digest_of"]


@dataclass(frozen=True)
class ExpectedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    checksum: str  # xxh3-64 hex of its bytes, computed by the harness


@dataclass(frozen=True)
class ExpectedModel:
    """The model as the harness computed it; ``origin`` says from what."""

    origin: str
    tensors: tuple[ExpectedTensor, ...]

    def checksums(self) -> dict[str, str]:
        return {t.name: t.checksum for t in self.tensors}

    def digest(self) -> str:
        return digest_of(self.tensors)


def digest_of(tensors: tuple[ExpectedTensor, ...]) -> str:
    """Whole-model digest: ``sha256:`` + SHA-256 hex of the canonical JSON (no whitespace) of
    ``[name, dtype, [shape], checksum]`` per tensor, in the order given (the format readers
    report in ``memory_digest``; computed here, from the harness's own checksums)."""
    rows = [[t.name, t.dtype, list(t.shape), t.checksum] for t in tensors]
    return "sha256:" + hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
