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
from harness.faults.syscall import SyscallSpec, traced_threads
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
        assert healed == {"target": "reader-1", "pid": proc.pid, "detached": True, "faulted": 2}
        assert not any(traced_threads(proc.pid).values())
        assert connect() == "ok"
        assert fault.heal(ctx, injected.token) is not None  # idempotent
    finally:
        proc.kill()
        proc.wait(5)
        proc.stdin.close()
        proc.stdout.close()
        listener.close()
