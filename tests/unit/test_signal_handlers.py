"""A signal handler takes no lock: one that arrives while the main thread holds the lock its
work needs (``Event.wait`` holds its condition's lock for a few bytecodes before it sleeps) is
still handled, at once, and its work done once the lock is free. Each case runs in a child
process, so a handler that waits for itself fails the test at its timeout instead of hanging it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_child(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_stop_signals_handler_runs_while_the_main_thread_holds_the_stop_events_lock() -> None:
    out = run_child("""
        import os, signal, time
        from mxref.process import StopSignals
        with StopSignals() as signals:
            with signals.stop._cond:  # as Event.wait holds it, just before it sleeps
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # bytecodes: the handler runs among them
                    pass
                print("handled while held", flush=True)
            assert signals.stop.wait(10), "stop never set"
            print("stopped by", signal.Signals(signals.received).name)
    """)
    assert out.splitlines() == ["handled while held", "stopped by SIGTERM"]


def test_queued_signal_runs_each_action_in_order_on_its_thread_and_restores_the_handler() -> None:
    out = run_child("""
        import os, signal, threading
        from mxref.signals import QueuedSignal
        seen, done = [], threading.Event()
        def action(signum):
            seen.append((signal.Signals(signum).name, threading.current_thread().name))
            if len(seen) == 2:
                done.set()
        with QueuedSignal((signal.SIGUSR1, signal.SIGUSR2), action, "relay-under-test"):
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR2)
            assert done.wait(10), seen
        print(seen)
        print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL)
    """)
    assert out.splitlines() == ["[('SIGUSR1', 'relay-under-test'), ('SIGUSR2', 'relay-under-test')]", "True"]


def test_a_runs_interrupt_is_raised_while_the_main_thread_holds_its_clocks_locks() -> None:
    out = run_child("""
        import os, signal, time
        from harness.engine.runner import Runner
        from harness.errors import RunInterrupted
        from harness.scenario.load import parse_scenario
        sc = parse_scenario('''
        name: held
        processes:
          server: {role: server}
        steps:
          - sleep: 1s
        ''')
        runner = Runner(sc, out_dir="/nonexistent-never-written")
        with runner._signals():
            try:
                with runner.clock._lock, runner.clock._abort._cond:
                    os.kill(os.getpid(), signal.SIGINT)
                    for _ in range(100000):
                        pass
                print("not raised")
            except RunInterrupted as exc:
                print("raised", signal.Signals(exc.signum).name)
            assert runner.clock.signalled == signal.SIGINT
            deadline = time.monotonic() + 10
            while not runner.clock.aborted and time.monotonic() < deadline:
                time.sleep(0.01)
            print("waits woken", runner.clock.aborted)
    """)
    assert out.splitlines() == ["raised SIGINT", "waits woken True"]
