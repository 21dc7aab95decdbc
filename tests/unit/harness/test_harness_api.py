"""The harness's public surface is deliberate: ``__all__`` lists exactly what resolves, and
the fault and check registries hold the documented kinds."""

from __future__ import annotations

import harness
from harness import checks, faults


def test_all_names_resolve() -> None:
    for name in harness.__all__:
        assert getattr(harness, name) is not None, name
    assert sorted(harness.__all__) == sorted(dir(harness))


def test_registries_hold_the_documented_kinds() -> None:
    """Other modules may register more kinds; these are the harness's own."""
    assert {"depart", "kill", "pause", "restart", "stop"} <= set(faults.REGISTRY)
    own = ("depart", "kill", "pause", "restart", "stop")
    assert [k for k in own if faults.REGISTRY[k].healable] == ["pause"]
    assert {
        "count", "exit_codes", "fell_back", "health", "integrity", "listed", "loaded", "metric", "nothing_leaked", "ordering",
        "spread",
    } <= set(checks.REGISTRY)


def test_fault_specs_must_declare_their_kind_literal() -> None:
    from typing import Literal

    import pytest

    class WrongSpec(faults.FaultSpec):
        kind: Literal["other"]

    class Wrong(faults.Fault[WrongSpec, None]):
        kind = "wrong"
        Spec = WrongSpec

    with pytest.raises(ValueError, match=r"WrongSpec.kind must be Literal\['wrong'\]"):
        faults.register(Wrong)
    assert "wrong" not in faults.REGISTRY


def test_signals_parse_by_name_or_number() -> None:
    import signal

    import pytest

    assert faults.parse_signal("KILL") == signal.SIGKILL
    assert faults.parse_signal("sigterm") == signal.SIGTERM
    assert faults.parse_signal(19) == signal.SIGSTOP
    assert faults.parse_signal("2") == signal.SIGINT
    for bad in ("NOPE", 999, True):
        with pytest.raises(ValueError):
            faults.parse_signal(bad)


def test_port_leases_are_exclusive_until_released(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fcntl
    import os
    import socket

    import pytest

    from harness.machine.ports import lease_port

    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path))
    with lease_port() as lease:
        fd = os.open(tmp_path / "ports" / f"{lease.port}.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        with socket.socket() as sock:  # the port itself is free for the program it is meant for
            sock.bind(("127.0.0.1", lease.port))
    fd = os.open(tmp_path / "ports" / f"{lease.port}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_the_readme_example_is_a_valid_scenario() -> None:
    import re
    from pathlib import Path

    from harness.scenario import parse_scenario

    text = (Path(__file__).resolve().parents[3] / "harness" / "README.md").read_text()
    block = re.search(r"## An example\n\n```yaml\n(.*?)```", text, re.S)
    assert block is not None
    assert parse_scenario(block.group(1), "README.md").name == "reader_falls_back_when_source_freezes"
