"""Regenerate the gRPC/protobuf Python code in ``mxref/v1/`` and ``mxref/mx/`` from ``proto/``.

The proto tree mirrors the package tree (``proto/mxref/v1`` -> ``mxref/v1``: mxref's own
contract; ``proto/mxref/mx`` -> ``mxref/mx``: ModelExpress's ``model_express.p2p``, served
beside it), so protoc's absolute imports resolve without post-processing. Run with the pinned
grpcio-tools (``pip install -e .[codegen]``)::

    python -m mxref.codegen            # rewrite mxref/v1/
    python -m mxref.codegen --out DIR  # write elsewhere (the drift test does this)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from mxref.options import parse

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGES = ("v1", "mx")
PROTOS = sorted(p.relative_to(PROTO_ROOT) for pkg in PACKAGES for p in (PROTO_ROOT / "mxref" / pkg).glob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Compile every proto under proto/mxref/{v1,mx} into ``out`` (a repo-root-like dir)."""
    from grpc_tools import protoc  # imported here: codegen is an optional extra

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p) for p in PROTOS],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(args)}")
    return sorted(path for pkg in PACKAGES for path in (out / "mxref" / pkg).glob("*_pb2*.py*"))


@dataclass(frozen=True, kw_only=True)
class CodegenFlags:
    """``python -m mxref.codegen``'s flags, typed (``mxref.options``)."""

    out: Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write mxref/v1/ and mxref/mx/ under")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv, CodegenFlags)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
