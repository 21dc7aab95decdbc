"""mxref's command line, typed (``mxref.options``): each front door parses once into a frozen
dataclass, and no module below one sees an ``argparse.Namespace``. The defaults below are
pinned as the flags had them before they were typed: a changed name or default fails here."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from mxref import codegen
from mxref.__main__ import parse_argv
from mxref.bench import fleet, flood, load, raw, refusals
from mxref.modelexpress import adapter
from mxref.options import (
    DemoFlags,
    PrepareFlags,
    ReaderFlags,
    ServerFlags,
    SourceFlags,
    parse,
    parse_known,
    typed,
)

MXREF = Path(__file__).resolve().parents[2] / "mxref"
PARSE_MODULE = MXREF / "options.py"
GENERATED = ("v1", "mx")

COMMON = {"events": None}
MODEL = {"model_name": "mxref/synthetic", "tensors": 16, "tensor_mib": 4.0, "dtype": "float16", "seed": 0,
         "model_file": None, "expect_digest": None, "checkpoint": None}
PEER = {"metrics_port": 0, "metrics_host": "127.0.0.1", "transport": "ucx-tcp", "server": None, "rank": 0,
        "accelerator": "cpu", "device_id": 0, "agent_name": None, "advertise_host": "127.0.0.1", "mx_version": None,
        "tls_ca": None, "tls_cert": None, "tls_key": None, "token_file": None}
DEFAULTS: dict[str, tuple[type[Any], dict[str, Any]]] = {
    "server": (ServerFlags, {
        **COMMON, "name": "server", "host": "127.0.0.1", "port": 0, "metrics_port": 0, "metrics_host": None,
        "heartbeat_timeout": None, "reaper_interval": None, "gc_timeout": None, "store": "memory",
        "store_timeout": 1.0, "grpc_impl": "native", "tls_cert": None, "tls_key": None, "token_file": None,
        "reader_token_file": None, "max_message_bytes": 16 << 20, "max_blob_bytes": 4 << 20, "max_name_bytes": 256,
        "max_tensors": 65536, "max_worker_rank": 65535, "publish_rate": 20.0, "publish_burst": 100,
        "max_records": 100_000, "max_record_bytes": 8 << 20, "max_store_bytes": 2 << 30, "peer_publish_rate": 200.0,
        "peer_publish_burst": 1000, "peer_share": 0.5, "new_peer_headroom": 0.05, "mx_writes": "trusted"}),
    "source": (SourceFlags, {
        **COMMON, **MODEL, **PEER, "name": "source", "mode": "p2p", "nixl_port": 0, "worker_port": 0,
        "heartbeat_interval": None, "serve_seconds": None, "ready_delay": 0.0, "lease_seconds": None,
        "drain_timeout": None, "debug_hooks": False, "grow_tensors": None, "data_seed": None, "lie_manifest": False}),
    "reader": (ReaderFlags, {
        **COMMON, **MODEL, **PEER, "name": "reader", "transfer_timeout": None, "handshake_timeout": 120.0,
        "read_chunk_mib": 16.0, "read_window": 2, "read_ramp": True, "hash_while_reading": True, "rpc_timeout": 30.0,
        "selector": None, "selector_seed": None, "serve_after_load": False, "serve_seconds": None,
        "heartbeat_interval": None, "worker_port": 0, "mode": "p2p", "push_metadata": False, "skip_release": False,
        "simulate_unguarded_retry": False, "result": None, "settle_s": 0.5, "settle_always": False, "lease": False,
        "accept_growth": False, "load_loop": False, "probe_duplicate_registration": False, "debug_leak": None, "debug_hooks": False}),
    "prepare": (PrepareFlags, {**COMMON, **MODEL, "name": "prepare", "checkpoint": Path("c.safetensors"),
                               "data_seed": None}),
    "demo": (DemoFlags, {
        **COMMON, "name": "demo", "tensors": 32, "tensor_mib": 8.0, "workdir": None, "transport": "ucx-tcp",
        "accelerator": "cpu", "no_baseline": False, "compare_chunked_runs": 0, "chunk_mib": 16.0}),
}
REQUIRED = {"prepare": ["--checkpoint", "c.safetensors"]}

# (argv, the field it sets, the value it reaches the role as): one flag of each role's own
GIVEN: dict[str, tuple[list[str], str, Any]] = {
    "server": (["--peer-publish-rate", "3.5"], "peer_publish_rate", 3.5),
    "source": (["--lease-seconds", "4s"], "lease_seconds", 4.0),
    "reader": (["--no-read-ramp"], "read_ramp", False),
    "prepare": (["--data-seed", "7"], "data_seed", 7),
    "demo": (["--compare-chunked-runs", "3"], "compare_chunked_runs", 3),
}

# each bench's and tool's own front door: its parser, its flags' class, its defaults
TOOLS: list[tuple[Any, type[Any], dict[str, Any]]] = [
    (raw.build_parser, raw.RawFlags, {"bytes": 256 << 20, "repeat": 3, "transport": "ucx-tcp", "progress": "pump",
                                      "serve": None, "seconds": 90.0}),
    (flood.build_parser, flood.FloodFlags, {
        "calls": 2000, "rounds": 4, "warmup": 200, "records": 32, "concurrency": 8, "tensors": 16,
        "flood_seconds": 120.0, "flood_ramp": 1.0, "no_unlimited": False, "flood": None}),
    (refusals.build_parser, refusals.RefusalsFlags, {
        "grpc_impl": "both", "seconds": 4.0, "rounds": 2, "interval": 0.02, "connections": 8, "window": 64,
        "rate": 0.0, "heartbeat_timeout": 2.0, "tls_cert": None, "tls_key": None, "tls_ca": None, "token_file": None}),
    (load.build_parser, load.BenchFlags, {
        "mib": [64, 256], "rounds": 9, "baseline": None, "single": True, "variant": [], "raw": False,
        "raw_progress": ["pump", "thread"], "ceiling": True, "transport": "ucx-tcp", "workdir": None}),
    (fleet.build_parser, fleet.FleetFlags, {
        "sources": 10_000, "ranks": 8, "identities": 16, "silent": 2000, "limit": 16, "idle_calls": 200,
        "seconds": 15.0, "clients": 4, "window": 6, "grpc_impl": "native", "native_lanes": "split",
        "full_gc_every": 360, "native_clients": False, "list_interval": 0.0, "rate": 0.0, "client_processes": 0,
        "reaper_interval": 1.0, "heartbeat_timeout": 120.0, "gc_timeout": 240.0, "label": "", "store": "memory"}),
]


@pytest.fixture(autouse=True)
def _no_flag_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults that come from the environment, unset (as on a clean machine)."""
    for name in ("MXREF_EVENTS", "MXREF_TRANSPORT", "MXREF_READ_CHUNK_MIB", "MX_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("role", sorted(DEFAULTS))
def test_each_role_parses_into_its_class_with_the_defaults_it_had(role: str) -> None:
    cls, defaults = DEFAULTS[role]
    flags = parse_argv([role, *REQUIRED.get(role, [])])
    assert type(flags) is cls and flags.role == role
    assert dataclasses.asdict(flags) == defaults


@pytest.mark.parametrize("role", sorted(GIVEN))
def test_a_flag_given_reaches_its_field(role: str) -> None:
    argv, field, value = GIVEN[role]
    flags = parse_argv([role, *REQUIRED.get(role, []), *argv])
    assert getattr(flags, field) == value
    assert dataclasses.asdict(flags) == {**DEFAULTS[role][1], field: value}
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(flags, field, value)


@pytest.mark.parametrize(("build", "cls", "defaults"), TOOLS, ids=[c.__name__ for _, c, _ in TOOLS])
def test_each_bench_parses_into_its_class_with_the_defaults_it_had(build: Any, cls: type[Any],
                                                                   defaults: dict[str, Any]) -> None:
    assert dataclasses.asdict(parse(build(), [], cls)) == defaults


def test_the_adapter_and_codegen_parse_into_their_classes() -> None:
    flags, rest = parse_known(adapter.build_parser(), ["reader", "--serve-after-load", "--not-ours"], adapter.AdapterFlags)
    assert (flags.role, flags.name, flags.serve_after_load, flags.server, flags.mode) == (
        "reader", "reader", True, None, "p2p")
    assert rest == ["--not-ours"]
    assert parse(codegen.build_parser(), [], codegen.CodegenFlags).out == codegen.ROOT
    assert parse(codegen.build_parser(), ["--out", "x"], codegen.CodegenFlags).out == Path("x")


def test_a_flag_without_a_field_or_a_field_without_a_flag_is_named() -> None:
    @dataclasses.dataclass(frozen=True)
    class Narrow:
        port: int
        missing: str

    with pytest.raises(TypeError, match=r"Narrow: flags without a field \['host'\], fields without a flag \['missing'\]"):
        typed(Narrow, argparse.Namespace(port=1, host="h"))


def _namespace_uses(source: str) -> list[str]:
    """Where ``source`` names ``Namespace`` or parses a command line itself (line: what)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id == "Namespace":
            found.append(f"{node.lineno}: Namespace")
        elif isinstance(node, ast.Attribute) and node.attr in ("Namespace", "parse_args", "parse_known_args"):
            found.append(f"{node.lineno}: {node.attr}")
        elif isinstance(node, ast.ImportFrom) and any(a.name == "Namespace" for a in node.names):
            found.append(f"{node.lineno}: import Namespace")
    return found


def test_no_module_below_the_front_door_takes_a_namespace() -> None:
    """Only ``mxref.options`` parses a command line and sees its ``argparse.Namespace``; every
    other module (the roles, the server, the benches, the adapter) gets typed flags."""
    offenders = {}
    for path in sorted(MXREF.rglob("*.py")):
        relative = path.relative_to(MXREF)
        if path == PARSE_MODULE or relative.parts[0] in GENERATED:
            continue
        uses = _namespace_uses(path.read_text())
        if uses:
            offenders[str(relative)] = uses
    assert not offenders, f"parse with mxref.options and pass its typed flags instead: {offenders}"


def test_the_namespace_scan_finds_each_kind_of_use() -> None:
    source = ("import argparse\nfrom argparse import Namespace\n"
              "def f(a: argparse.Namespace) -> None: ...\n"
              "def g(p: argparse.ArgumentParser) -> None:\n    p.parse_args([])\n    p.parse_known_args([])\n")
    assert _namespace_uses(source) == ["2: import Namespace", "3: Namespace", "5: parse_args", "6: parse_known_args"]
