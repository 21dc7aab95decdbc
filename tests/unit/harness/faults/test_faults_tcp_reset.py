"""``tcp_reset`` over the fake context and a fake shell: which connections it finds in ``ss``
output, the exact ``ss -K`` it issues for each, and what it refuses to do."""

from __future__ import annotations

import time

import pytest
from fixtures.fault_context import FakeContext, FakeShell, install_shell

from harness.errors import FaultError
from harness.faults import make_fault
from harness.faults.tcp_reset import TcpResetSpec
from harness.record.witness import Witness
from harness.spec import SourceOf


@pytest.fixture
def ctx() -> FakeContext:
    ctx = FakeContext()
    ctx.add_process("source-1")  # pid 4242
    ctx.add_process("reader-1", role="reader")  # pid 4243
    ctx.add_process("server", role="server")  # pid 4244
    ctx.sources["reader-1"] = "source-1"
    return ctx


SS = """\
0 0 127.0.0.1:40001 127.0.0.1:50001 users:(("python",pid=4243,fd=7))
0 0 127.0.0.1:50001 127.0.0.1:40001 users:(("python",pid=4242,fd=9))
0 0 [::1]:40002 [::1]:50002 users:(("python",pid=4243,fd=8))
0 0 [::1]:50002 [::1]:40002 users:(("python",pid=4242,fd=10))
0 0 127.0.0.1:40003 127.0.0.1:60000 users:(("python",pid=4243,fd=11))
0 0 127.0.0.1:60000 127.0.0.1:40003 users:(("python",pid=4244,fd=3))
short line
"""


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> FakeShell:
    return install_shell(monkeypatch, FakeShell(sockets=SS))


def test_tcp_reset_kills_each_connection_between_the_two_and_no_other(ctx: FakeContext, shell: FakeShell) -> None:
    fault = make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer=SourceOf(source_of="reader-1")), "rst")
    injected = fault.inject(ctx)
    assert injected.token is None
    record = dict(injected.record)
    witness = Witness.of(record.pop("witness"))
    assert record == {"target": "reader-1", "peer": "source-1", "waited_s": 0.0,
                      "connections": ["127.0.0.1:40001->127.0.0.1:50001", "[::1]:40002->[::1]:50002"]}
    assert witness is not None and witness.effect == "seen" and witness.why == "2 of 2 connections destroyed"
    assert shell.commands == [
        (None, ("ss", "-tnpH", "state", "established")),
        (None, ("ss", "-K", "-tn", "src", "127.0.0.1:40001", "dst", "127.0.0.1:50001")),
        (None, ("ss", "-K", "-tn", "src", "::1:40002", "dst", "::1:50002")),
        (None, ("ss", "-tnpH", "state", "established")),  # its witness: are they gone?
    ]
    assert fault.heal(ctx, None) is None  # nothing to heal


def test_an_ss_that_destroys_nothing_is_no_effect(ctx: FakeContext, shell: FakeShell) -> None:
    """A kernel without INET_DIAG_DESTROY: ``ss -K`` answers 0 and every connection stays."""
    shell.destroys = False
    injected = make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="source-1"), "rst").inject(ctx)
    witness = Witness.of(injected.record["witness"])
    assert witness is not None and witness.effect == "none"
    assert witness.figures["destroyed"] == 0 and len(witness.figures["still"]) == 2


def test_tcp_reset_without_a_connection_between_them_fails(ctx: FakeContext, shell: FakeShell) -> None:
    with pytest.raises(FaultError, match=r"no established TCP connection between source-1 and server within 0.01s \(wait\)"):
        make_fault(TcpResetSpec(kind="tcp_reset", target="source-1", peer="server", wait=0.01), "rst").inject(ctx)
    assert {argv[1] for _ns, argv in shell.commands} == {"-tnpH"}  # looked, reset nothing


def test_tcp_reset_looks_again_until_the_connection_is_there(ctx: FakeContext, shell: FakeShell,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader announces transfer_start before NIXL's first post: the connection (or the
    source's accept of it) can come a moment later, and the inject waits for it."""
    shell.sockets = ""
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            shell.sockets = SS

    monkeypatch.setattr(ctx, "sleep", nap)
    injected = make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="source-1"), "rst").inject(ctx)
    assert naps == [0.02, 0.02, 0.02]
    assert [argv[1] for _ns, argv in shell.commands] == ["-tnpH"] * 4 + ["-K", "-K", "-tnpH"]
    assert injected.record["connections"] == ["127.0.0.1:40001->127.0.0.1:50001", "[::1]:40002->[::1]:50002"]
    assert 0.0 <= injected.record["waited_s"] < 1.0


def test_tcp_reset_waits_no_longer_than_its_bound(ctx: FakeContext, shell: FakeShell,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    shell.sockets = ""
    monkeypatch.setattr(ctx, "sleep", time.sleep)
    began = time.monotonic()
    with pytest.raises(FaultError, match=r"within 0.1s \(wait\)"):
        make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="source-1", wait=0.1), "rst").inject(ctx)
    assert 0.1 <= time.monotonic() - began < 1.0
    assert 2 <= len(shell.commands) <= 7


def test_tcp_reset_needs_both_running(ctx: FakeContext, shell: FakeShell) -> None:
    ctx.add_process("gone", alive=False)
    with pytest.raises(FaultError, match="reader-1 and gone must both be running"):
        make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="gone"), "rst").inject(ctx)
    assert shell.commands == []


def test_tcp_reset_reports_a_failed_ss(ctx: FakeContext, shell: FakeShell) -> None:
    shell.fail("ss", "-K", rc=1, out="SOCK_DESTROY answers: Operation not supported")
    with pytest.raises(FaultError, match=r"ss -K -tn src 127.0.0.1:40001 .* failed \(rc 1\): SOCK_DESTROY"):
        make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="source-1"), "rst").inject(ctx)


def test_tcp_reset_without_ss_runs_nothing(ctx: FakeContext, shell: FakeShell) -> None:
    shell.programs.discard("ss")
    with pytest.raises(FaultError, match="needs `ss`"):
        make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="source-1"), "rst").inject(ctx)
    assert shell.commands == []


def test_tcp_reset_refers_to_both_processes() -> None:
    spec = TcpResetSpec(kind="tcp_reset", target="reader-1", peer=SourceOf(source_of="reader-2"))
    assert spec.process_refs() == ("reader-1", "reader-2")
    assert spec.host_refs() == () and spec.proxy_refs() == ()


def test_a_dual_stack_socket_is_matched_with_its_ipv4_peer(ctx: FakeContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's dual-stack socket shows its IPv4 server as an IPv4-mapped address; the server's
    socket shows the client's plain IPv4 one: the same connection, reset as the client's ss names it."""
    mapped = """\
0 0 [::ffff:10.0.0.2]:50646 [::ffff:10.0.0.1]:34891 users:(("python",pid=4243,fd=7))
0 0 10.0.0.1:34891 10.0.0.2:50646 users:(("python",pid=4242,fd=9))
"""
    shell = install_shell(monkeypatch, FakeShell(sockets=mapped))
    injected = make_fault(TcpResetSpec(kind="tcp_reset", target="reader-1", peer="source-1"), "rst").inject(ctx)
    assert injected.record["connections"] == ["[::ffff:10.0.0.2]:50646->[::ffff:10.0.0.1]:34891"]
    assert (None, ("ss", "-K", "-tn", "src", "::ffff:10.0.0.2:50646", "dst", "::ffff:10.0.0.1:34891")) in shell.commands
