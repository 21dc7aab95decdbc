"""The syscall fault: its spec (call names, errno names, strace's when syntax, something to
do), the strace argument it builds, and, where this machine has root and strace, a real
process whose connect(2) calls fail with ECONNREFUSED while traced and succeed once healed."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures.fault_context import FakeContext
from pydantic import ValidationError

from harness.faults import REGISTRY, make_fault
from harness.faults.syscall import StraceCounts, SyscallSpec, strace_witness, traced_threads
from harness.scenario import capabilities


def spec(**kw: object) -> SyscallSpec:
    return SyscallSpec.model_validate({"kind": "syscall", "target": "reader-1", "calls": ["mmap"], **kw})


def test_the_strace_argument_fails_and_delays_the_calls_numbered_when() -> None:
    assert spec(error="ENOMEM").inject_arg() == "mmap:error=ENOMEM:when=1+"
    both = spec(calls=["sendmsg", "sendto"], error="ECONNRESET", delay="250ms", when="2..4")
    assert both.inject_arg() == "sendmsg,sendto:error=ECONNRESET:delay_enter=250000:when=2..4"
    assert REGISTRY["syscall"].requires == ("root", "strace")


@pytest.mark.parametrize(("kw", "says"), [
    ({}, "needs error (an errno name), delay, or both"),
    ({"error": "ENOPE"}, "'ENOPE' is not an errno name"),
    ({"error": "EIO", "calls": ["Mmap;rm"]}, "is not a system call name"),
    ({"error": "EIO", "calls": []}, "at least 1"),
    ({"error": "EIO", "when": "0"}, "is not FIRST[..LAST][+[STEP]]"),
    ({"error": "EIO", "when": "1+x"}, "is not FIRST[..LAST][+[STEP]]"),
])
def test_bad_syscall_faults_are_refused_naming_the_rule(kw: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(**kw)
    assert says in str(err.value)


PROGRAM = textwrap.dedent("""\
    import socket, sys, time
    port = int(sys.argv[1])
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            print("ok", flush=True)
        except OSError as exc:
            print(exc.errno, flush=True)
""")


@pytest.mark.skipif(bool(capabilities.missing(["root", "strace"])), reason="needs root and strace")
def test_a_traced_process_meets_the_error_until_heal_detaches(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None

    def connect() -> str:
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        return proc.stdout.readline().strip()  # type: ignore[union-attr]

    try:
        assert connect() == "ok"
        ctx = FakeContext(run_dir=tmp_path)
        ctx.add_process("reader-1", role="reader")
        ctx.procs["reader-1"] = replace(ctx.procs["reader-1"], pid=proc.pid)
        fault = make_fault(spec(calls=["connect"], error="ECONNREFUSED"), "refuse")
        injected = fault.inject(ctx)
        assert injected.record["threads"] >= 1 and all(traced_threads(proc.pid).values())
        assert connect() == "111" and connect() == "111"  # ECONNREFUSED, injected: the listener is there
        healed = fault.heal(ctx, injected.token)
        assert healed is not None and healed["faulted"] == 2 and healed["witness"]["effect"] == "seen"
        assert healed["witness"]["figures"]["failed"] == {"connect": 2}
        assert not any(traced_threads(proc.pid).values())
        assert connect() == "ok"
        assert fault.heal(ctx, injected.token) is not None  # idempotent
    finally:
        proc.kill()
        proc.wait(5)
        proc.stdin.close()
        proc.stdout.close()
        listener.close()


STRACE = """\
4101  recvmsg(7, {msg_name=NULL}, 0) = 64 (DELAYED)
4102  recvmsg(9,  <unfinished ...>
4101  sendmsg(7, {msg_name=NULL}, MSG_NOSIGNAL) = -1 ECONNRESET (Connection reset by peer) (INJECTED) (DELAYED)
4102  <... recvmsg resumed>{msg_name=NULL}, 0) = -1 EAGAIN (Resource temporarily unavailable) (DELAYED)
4101  sendmsg(7, {msg_name=NULL, msg_iov=[{iov_base="(INJECTED)", iov_len=10}]}, 0) = 10
4103  +++ exited with 0 +++
4101  --- SIGCHLD {si_signo=SIGCHLD} ---
"""


def test_strace_output_is_counted_per_call_from_its_own_marks() -> None:
    counts = StraceCounts.parse(STRACE)
    assert counts.traced == {"recvmsg": 2, "sendmsg": 2}  # the cut start is counted once, on its resumed line
    assert counts.failed == {"sendmsg": 1}  # the marks of the result only: not a buffer that spells one
    assert counts.delayed == {"recvmsg": 2, "sendmsg": 1}
    assert counts.faulted == 3  # failed and delayed counts once
    assert StraceCounts.parse("strace: Process 12 attached\n").faulted == 0


def test_the_strace_witness_is_seen_none_or_unwitnessed(tmp_path: Path) -> None:
    log = tmp_path / "f.strace"
    log.write_text(STRACE)
    seen = strace_witness(str(log), "reader-1", 4101)
    assert seen.effect == "seen" and "1 calls failed, 3 delayed of 4 traced" in seen.why
    log.write_text("4101  recvmsg(7, {}, 0) = 64\n")  # traced, but ``when`` numbered past it
    assert strace_witness(str(log), "reader-1", 4101).effect == "none"
    assert strace_witness(str(tmp_path / "gone"), "reader-1", 4101).effect == "unwitnessed"
