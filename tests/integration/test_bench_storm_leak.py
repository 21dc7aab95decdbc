"""``python -m mxref bench storm`` leaves no process behind, frozen or not, however it ends: a real
storm (a metadata server, two sources, two readers and a raw NIXL fan-out, real NIXL processes
over UCX-over-TCP) with frozen rounds, SIGKILLed or SIGINTed while source 1 is SIGSTOPped.

Every process the bench starts inherits a tag in its environment (``TAG_VAR``, a fresh value per
test), so the test finds the bench's processes in /proc whatever became of their parent, without
asking the bench. The frozen moment is seen in /proc too: a child of the bench in state T. The
bench is then SIGSTOPped itself, so it cannot thaw the source before the signal lands; the source
is checked to be stopped still, and the signal is sent: SIGKILL or SIGINT to the bench, or SIGINT
to its whole process group (a terminal's Ctrl-C; the bench runs in a session of its own here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness.machine.runscope import proc_stat

TAG_VAR = "MXREF_TEST_STORM_TAG"
ARGS = ["--readers", "2", "--sources", "2", "--mib", "8", "--rounds", "1", "--list-interval", "0.05"]
FROZEN_ROUNDS = 12  # the bench is caught in one of them; a round that ended before the catch (or before its freeze landed: a fast round under no load) lets the next try
START_S, CATCH_S, EXIT_S, GONE_S = 240.0, 240.0, 90.0, 20.0


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def tagged(tag: str) -> dict[int, str]:
    """pid -> 'state cmdline' of every live process whose environment holds ``TAG_VAR=tag``
    (zombies, already dead, do not count)."""
    needle = f"{TAG_VAR}={tag}".encode()
    out = {}
    for pid in _pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        st = proc_stat(pid)
        if needle in env and st is not None and st.state != "Z":
            out[pid] = f"{st.state} {cmd[:160]}"
    return out


def stopped_child(parent: int) -> int | None:
    """A child of ``parent`` in state T (stopped), if any."""
    for pid in _pids():
        st = proc_stat(pid)
        if st is not None and st.ppid == parent and st.state == "T":
            return pid
    return None


def gone(tag: str, within_s: float) -> dict[int, str]:
    """The tagged processes still alive after waiting up to ``within_s`` for them to go."""
    deadline = time.monotonic() + within_s
    left = tagged(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = tagged(tag)
    return left


def _as_a_terminal_starts_it() -> None:
    """SIGINT at its default in the bench, as a terminal's foreground job has it: a test run started
    in the background of a non-interactive shell (a CI step's `cmd &`) ignores SIGINT, and the bench
    would inherit that and never see the Ctrl-C this test sends (it did: the bench ran on to its end)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_bench(tmp_path: Path, tag: str, frozen_rounds: int) -> subprocess.Popen[bytes]:
    with open(tmp_path / "bench.out", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "mxref", "bench", "storm", *ARGS, "--frozen-rounds",
                                 str(frozen_rounds), "--workdir", str(tmp_path / "work")],
                                env={**os.environ, TAG_VAR: tag}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_as_a_terminal_starts_it)


def catch_frozen(bench: subprocess.Popen[bytes], tmp_path: Path) -> int:
    """Wait for a child of the bench in state T, SIGSTOP the bench, and return that child's pid
    once it is seen stopped still (the bench stopped before it could thaw it)."""
    deadline = time.monotonic() + START_S + CATCH_S
    while time.monotonic() < deadline:
        if bench.poll() is not None:
            pytest.fail(f"the bench ended ({bench.returncode}) before a frozen source was caught: "
                        + (tmp_path / "bench.out").read_text()[-3000:])
        frozen = stopped_child(bench.pid)
        if frozen is None:
            time.sleep(0.01)
            continue
        os.kill(bench.pid, signal.SIGSTOP)
        st = proc_stat(frozen)
        if st is not None and st.state == "T":
            return frozen
        os.kill(bench.pid, signal.SIGCONT)  # the round ended between the two looks: the next one
    pytest.fail(f"no frozen source seen within {START_S + CATCH_S:g}s: " + (tmp_path / "bench.out").read_text()[-3000:])


def test_a_storm_with_frozen_rounds_leaves_nothing_when_it_ends(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    bench = start_bench(tmp_path, tag, 1)
    try:
        assert bench.wait(START_S + CATCH_S) == 0, (tmp_path / "bench.out").read_text()[-3000:]
        assert "storm: froze source-1" in (tmp_path / "bench.out").read_text()  # the frozen round froze
        assert gone(tag, GONE_S) == {}
    finally:
        _kill_all(bench, tag)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT", "ctrl-c"])
def test_a_bench_ended_mid_frozen_round_leaves_nothing(tmp_path: Path, how: str) -> None:
    tag = uuid.uuid4().hex
    bench = start_bench(tmp_path, tag, FROZEN_ROUNDS)
    try:
        frozen = catch_frozen(bench, tmp_path)
        assert frozen in tagged(tag)
        if how == "ctrl-c":  # a terminal's Ctrl-C: SIGINT to the whole foreground group, the bench's
            os.killpg(bench.pid, signal.SIGINT)
        else:
            os.kill(bench.pid, getattr(signal, how))
        os.kill(bench.pid, signal.SIGCONT)  # SIGINT: the bench acts on it now; SIGKILL: already gone
        bench.wait(EXIT_S)
        left = gone(tag, GONE_S)
        stopped = {pid: what for pid, what in left.items() if what.startswith("T ")}
        assert not stopped, f"stopped processes of the bench left after its {how}: {stopped}"
        assert not left, f"processes of the bench left after its {how}: {left}"
        if how != "SIGKILL":
            assert bench.returncode != 0
    finally:
        _kill_all(bench, tag)


def _kill_all(bench: subprocess.Popen[bytes], tag: str) -> None:
    """However the test went, nothing of this bench outlives it."""
    if bench.poll() is None:
        bench.kill()
        bench.wait(EXIT_S)
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
