"""The published ModelExpress client's gRPC contract, read from its wheel, compared with ours.

``client_descriptor(wheel)`` reads ``modelexpress/p2p_pb2.py`` out of the wheel as text and
takes the serialized ``FileDescriptorProto`` from its ``AddSerializedFile(b"...")`` call with
``ast`` (nothing of the package is imported or executed: its ``__init__`` pulls torch).
``describe`` flattens a file descriptor into what the wire depends on: the package, every
service's methods (input, output, streaming), every message's fields (number, name, type,
type name, label, oneof by name, proto3 ``optional``, ``deprecated``) and map entries, every
enum's values. ``differences`` lists, one line each, where two such descriptions disagree.
``message_classes(fdp)`` builds a descriptor's message classes in a pool of their own, so a
test can speak to our server with the client's own classes. ``client_wheel(version)`` finds the wheel in the cache (``<cache>/wheels``, where
``.ci/bootstrap`` puts it) or fetches it with ``pip download --no-deps``; ``None`` when the
registry cannot be reached.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

from harness.subjects.cache import cache_dir
from mxref.mx import p2p_pb2

__all__ = ["CLIENT_MODULE", "client_descriptor", "client_wheel", "client_or_our_classes", "describe", "differences", "message_classes",
           "our_descriptor"]

CLIENT_MODULE = "modelexpress/p2p_pb2.py"
FETCH_TIMEOUT_S = 180.0

_FDP = descriptor_pb2.FieldDescriptorProto
TYPE_NAMES = {number: name.removeprefix("TYPE_").lower() for name, number in _FDP.Type.items()}
LABEL_NAMES = {number: name.removeprefix("LABEL_").lower() for name, number in _FDP.Label.items()}


def wheels_dir() -> Path:
    return cache_dir() / "wheels"


def client_wheel(version: str, *, fetch: bool = True) -> tuple[Path | None, str]:
    """The ``modelexpress==version`` wheel and how it was found, or ``(None, why not)``."""
    where = wheels_dir()
    found = sorted(where.glob(f"modelexpress-{version}-*.whl"))
    if found:
        return found[-1], f"cached in {where}"
    if not fetch:
        return None, f"no modelexpress-{version} wheel in {where}"
    where.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
            "-d", str(where), f"modelexpress=={version}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"pip download modelexpress=={version} timed out after {FETCH_TIMEOUT_S:g}s (registry unreachable?)"
    found = sorted(where.glob(f"modelexpress-{version}-*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"pip download modelexpress=={version} failed (registry unreachable?): {last}"
    return found[-1], f"downloaded into {where}"


def client_descriptor(wheel: Path, module: str = CLIENT_MODULE) -> Any:
    """The ``FileDescriptorProto`` serialized in ``module`` of ``wheel``; ``ValueError`` naming
    the wheel and module when it holds none."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            source = archive.read(module).decode()
        except KeyError:
            raise ValueError(f"{wheel}: no {module} in the wheel") from None
    for node in ast.walk(ast.parse(source, filename=f"{wheel.name}/{module}")):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "AddSerializedFile"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bytes)):
            return descriptor_pb2.FileDescriptorProto.FromString(node.args[0].value)
    raise ValueError(f"{wheel}: {module} has no AddSerializedFile(b'...') call to read the descriptor from")


def message_classes(fdp: Any) -> dict[str, type[Any]]:
    """Message classes of ``fdp`` built in a pool of their own (so the client's and ours, which
    share names, live side by side in one process), keyed by short name (``ListSourcesRequest``)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        msg.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{fdp.package}.{msg.name}"))
        for msg in fdp.message_type
    }


def client_or_our_classes(version: str = "0.7.0") -> dict[str, type[Any]]:
    """The client's message classes when its wheel is at hand, else ours (the same wire)."""
    wheel, _ = client_wheel(version)
    return message_classes(client_descriptor(wheel) if wheel is not None else our_descriptor())


def our_descriptor() -> Any:
    """Our ``model_express.p2p`` file descriptor (``proto/mxref/mx/p2p.proto``) as a proto."""
    fdp = descriptor_pb2.FileDescriptorProto()
    p2p_pb2.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _message(msg: Any, prefix: str, out: dict[str, Any]) -> None:
    name = f"{prefix}.{msg.name}"
    oneofs = [o.name for o in msg.oneof_decl]
    fields = {}
    for f in msg.field:
        fields[f.number] = {
            "name": f.name,
            "type": TYPE_NAMES[f.type],
            "type_name": f.type_name,
            "label": LABEL_NAMES[f.label],
            "oneof": oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
            "proto3_optional": f.proto3_optional,
            "deprecated": f.options.deprecated,
        }
    out[name] = {"fields": fields, "oneofs": sorted(oneofs), "map_entry": msg.options.map_entry}
    for nested in msg.nested_type:
        _message(nested, name, out)
    for enum in msg.enum_type:
        out[f"{name}.{enum.name}"] = {"enum": {v.name: v.number for v in enum.value}}


def describe(fdp: Any) -> dict[str, Any]:
    """What the wire depends on in ``fdp``, keyed by full names (order-free)."""
    prefix = f".{fdp.package}"
    types: dict[str, Any] = {}
    for msg in fdp.message_type:
        _message(msg, prefix, types)
    for enum in fdp.enum_type:
        types[f"{prefix}.{enum.name}"] = {"enum": {v.name: v.number for v in enum.value}}
    services = {
        f"{prefix}.{s.name}": {
            m.name: {"input": m.input_type, "output": m.output_type,
                     "client_streaming": m.client_streaming, "server_streaming": m.server_streaming}
            for m in s.method
        }
        for s in fdp.service
    }
    return {"package": fdp.package, "syntax": fdp.syntax, "services": services, "types": types}


def _diff(path: str, ours: Any, theirs: Any, out: list[str]) -> None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in theirs:
                out.append(f"{where}: ours only ({ours[key]!r})")
            elif key not in ours:
                out.append(f"{where}: the client's only ({theirs[key]!r})")
            else:
                _diff(where, ours[key], theirs[key], out)
    elif ours != theirs:
        out.append(f"{path}: ours {ours!r}, the client's {theirs!r}")


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Every disagreement between two ``describe`` results, one line each (empty: same wire)."""
    out: list[str] = []
    _diff("", ours, theirs, out)
    return out
