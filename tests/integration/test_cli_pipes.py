"""``mxchaos`` as a child process whose standard output is a pipe nobody reads any more
(``mxchaos schema | head -1``): it exits 141 (128 + SIGPIPE), quietly, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["schema"], ["list"], ["list", "--faults"]])
def test_a_closed_pipe_ends_the_cli_quietly(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: deterministic EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "harness.cli", *argv],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_head_1_gets_the_first_line_and_the_cli_exits_quietly() -> None:
    """What a person types: a shell pipeline into ``head -1`` (whether the CLI meets the closed
    pipe depends on timing; the test above forces it)."""
    full = subprocess.run([sys.executable, "-m", "harness.cli", "list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    proc = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$0" -m harness.cli list | head -1; echo "rc=${PIPESTATUS[0]}"', sys.executable],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    assert lines == [full.stdout.splitlines()[0], lines[1]] and lines[1] in ("rc=0", "rc=141"), proc.stdout
    assert proc.stderr == ""


def test_piped_list_keeps_every_description_whole() -> None:
    """A terminal's width cuts a description; piped (into grep, a file) nothing is cut."""
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    from harness.scenario import load_scenario

    whole = load_scenario(REPO / "scenarios" / "frozen_source.yaml").description.strip().splitlines()[0]
    assert len(whole) > 100  # long enough that a terminal would cut it
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("frozen_source ")]
    assert line.endswith(whole) and "..." not in line
