"""``read_json_line``: a child's JSON line is found among log lines, and a silent or dead child
never hangs the caller (the bench and the GPU tests wait on their peers with it)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mxref.process import read_json_line


def child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_the_json_line_is_found_after_log_lines_written_at_once() -> None:
    p = child("import sys, time; sys.stdout.write('log a\\nlog b\\n{\"x\": 1}\\n'); sys.stdout.flush(); time.sleep(10)")
    try:
        assert read_json_line(p.stdout, 5, "child") == {"x": 1}
    finally:
        p.kill()
        p.communicate()


def test_a_silent_child_times_out_at_the_deadline() -> None:
    p = child("import time; time.sleep(10)")
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no JSON line within 0\.3s"):
            read_json_line(p.stdout, 0.3, "child")
        assert time.monotonic() - t0 < 2
    finally:
        p.kill()
        p.communicate()


def test_a_child_that_exits_first_is_an_error() -> None:
    p = child("print('only logs')")
    with pytest.raises(RuntimeError, match="exited before"):
        read_json_line(p.stdout, 5, "child")
    p.communicate()
