"""The committed ``mxref/v1`` and ``mxref/mx`` code is exactly what the pinned protoc makes of ``proto/``.

Fails when someone edits the proto without regenerating (or hand-edits the
generated files); fix with ``python -m mxref.codegen``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mxref import codegen

pytest.importorskip("grpc_tools", reason="grpcio-tools (the codegen extra) is not installed")

COMMITTED = [codegen.ROOT / "mxref" / pkg for pkg in codegen.PACKAGES]


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    fresh = {str(p.relative_to(tmp_path)): p.read_bytes() for p in codegen.generate(tmp_path)}
    committed = {str(p.relative_to(codegen.ROOT)): p.read_bytes() for d in COMMITTED for p in sorted(d.glob("*_pb2*.py*"))}
    assert sorted(fresh) == sorted(committed), "generated file set differs; run python -m mxref.codegen"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"mxref/v1 or mxref/mx is out of date with proto/ ({', '.join(stale)}); run python -m mxref.codegen"
