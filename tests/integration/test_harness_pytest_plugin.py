"""The pytest plugin in a scratch project: scenario files become items, an invalid file is a
collection error naming file, line, key and rule, a failing scenario prints its failing
checks and run folder (no traceback), ``pytest -n 2`` works, a known defect is xfailed (or
passes with a note), a missing capability skips, a file named on the command line runs
wherever it lies, and required capabilities become ``root`` / ``toxiproxy`` markers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fakeproc.py"

BODY = """\
name: {name}
launcher: ["{{python}}", "{fake}"]
budgets: {{step: 10s, run: 30s, stop_grace: 2s}}
processes:
  server: {{role: server}}
  source-1: {{role: source}}
steps:
  - start: [server, source-1]
  - await: {{process: source-1, event: heartbeat}}
checks:
  - count: {{process: source-1, event: heartbeat, {bound}}}
"""


def project(tmp_path: Path, *, typo: bool) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    scenarios = tmp_path / "scenarios"
    (scenarios / "sub").mkdir(parents=True)
    (scenarios / "ok.yaml").write_text(BODY.format(name="ok_scenario", fake=FAKE, bound="min: 1"))
    (scenarios / "sub" / "bad.yaml").write_text(BODY.format(name="bad_scenario", fake=FAKE, bound="max: 0"))
    if typo:
        (scenarios / "typo.yaml").write_text(BODY.format(name="typo", fake=FAKE, bound="min: 1").replace("within", "x").replace("steps:", "step:"))
    (tmp_path / "other.yaml").write_text("not: a scenario\n")  # outside scenarios/: ignored
    return tmp_path


def pytest_in(path: Path, *args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MXCHAOS_"))}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=path,
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )


def test_items_failures_and_collection_errors(tmp_path: Path) -> None:
    root = project(tmp_path, typo=True)
    out = pytest_in(root, "-rA")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text  # an error during collection interrupts the session
    assert "ERROR collecting scenarios/typo.yaml" in text
    assert f"{root / 'scenarios' / 'typo.yaml'}:7: step: unknown key 'step'; did you mean 'steps'?" in text
    assert "Traceback" not in text

    out = pytest_in(root, "-rA", "--deselect", "scenarios/typo.yaml", "--continue-on-collection-errors", "--mxchaos-out", str(tmp_path / "out"))
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "PASSED scenarios/ok.yaml::ok_scenario" in text
    assert "FAILED scenarios/sub/bad.yaml::bad_scenario" in text
    assert "scenario bad_scenario: FAIL (seed 0)" in text
    assert "FAIL     count(source-1 heartbeat <= 0): source-1 heartbeat:" in text
    assert f"run folder: {tmp_path / 'out' / 'bad_scenario'}" in text
    assert "Traceback" not in text and "runner.py" not in text
    assert (tmp_path / "out" / "ok_scenario" / "latest" / "report.html").is_file()


def test_pytest_xdist_runs_scenarios_in_parallel(tmp_path: Path) -> None:
    root = project(tmp_path, typo=False)
    out = pytest_in(root, "-n", "2", "-q", "-m", "mxchaos")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "1 failed, 1 passed" in text
    runs = sorted(p.parent.parent.name for p in (root / "runs").glob("*/*/verdict.json") if not p.parent.is_symlink())
    assert runs == ["bad_scenario", "ok_scenario"]


def test_known_defects_xfail_or_pass_with_a_note_and_missing_capabilities_skip(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\nxfail_strict = true\n")
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    defect = "known_defect: 'fake 1.0: heartbeats are lost'\n"
    (scenarios / "reproduced.yaml").write_text(defect + BODY.format(name="reproduced", fake=FAKE, bound="max: 0"))
    (scenarios / "fixed.yaml").write_text(defect + BODY.format(name="fixed", fake=FAKE, bound="min: 1"))
    (scenarios / "needs_root.yaml").write_text(
        BODY.format(name="needs_root", fake=FAKE, bound="min: 1").replace(
            "  - await:", "  - fault: {kind: tcp_reset, target: source-1, peer: server, name: cut}\n  - await:"
        )
    )
    out = pytest_in(tmp_path, "-rA", "-W", "error", env_extra={"MXCHAOS_MISSING_CAPABILITIES": "root"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "1 passed, 1 skipped, 1 xfailed" in text
    assert "XFAIL scenarios/reproduced.yaml::reproduced - known defect: fake 1.0: heartbeats are lost | reproduced: count(" in text
    assert "SKIPPED [1] scenarios/needs_root.yaml:1: mxchaos: this machine lacks root (for cut (tcp_reset))" in text
    assert "PASSED scenarios/fixed.yaml::fixed" in text
    assert "mxchaos: known defects that did not reproduce" in text
    assert "XPASS scenarios/fixed.yaml::fixed" in text
    assert "the known defect did not reproduce in this run (one run cannot call it fixed; --mxchaos-repeat N can): fake 1.0: heartbeats are lost" in text
    assert "warning" not in text.lower()
    assert not list((tmp_path / "runs").glob("needs_root/*/procs"))  # nothing was started


def test_a_scenario_file_named_on_the_command_line_runs_wherever_it_lies(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --strict-markers\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "one.yaml").write_text(BODY.format(name="one_elsewhere", fake=FAKE, bound="min: 1"))
    (elsewhere / "two.yaml").write_text(BODY.format(name="two_elsewhere", fake=FAKE, bound="min: 1"))
    out = pytest_in(tmp_path, "-rA", "elsewhere/one.yaml", "--mxchaos-out", str(tmp_path / "out"))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "PASSED elsewhere/one.yaml::one_elsewhere" in text
    assert "1 passed" in text and "two_elsewhere" not in text  # only the file named
    assert (tmp_path / "out" / "one_elsewhere" / "latest" / "verdict.json").is_file()
    out = pytest_in(tmp_path, "--collect-only", "-q", "elsewhere")  # a folder outside scenarios/: only named files count
    assert out.returncode == 5 and "no tests collected" in out.stdout, out.stdout + out.stderr


def test_capabilities_become_markers_so_m_not_root_deselects(tmp_path: Path) -> None:
    # no markers declared by the project, --strict-markers: the plugin declares root and toxiproxy
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --strict-markers\n")
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "plain.yaml").write_text(BODY.format(name="plain", fake=FAKE, bound="min: 1"))
    (scenarios / "reset.yaml").write_text(
        BODY.format(name="reset", fake=FAKE, bound="min: 1").replace(
            "  - await:", "  - fault: {kind: tcp_reset, target: source-1, peer: server, name: cut}\n  - await:"
        )
    )
    (scenarios / "netns.yaml").write_text(
        BODY.format(name="in_netns", fake=FAKE, bound="min: 1").replace(
            "processes:\n  server: {role: server}\n  source-1: {role: source}",
            "hosts:\n  a: {kind: netns}\nprocesses:\n  server: {role: server, host: a}\n  source-1: {role: source, host: a}",
        )
    )
    (scenarios / "proxied.yaml").write_text(
        BODY.format(name="proxied", fake=FAKE, bound="min: 1").replace(
            "processes:\n", "proxies:\n  mds: {upstream: server}\nprocesses:\n"
        )
    )

    def collected(*args: str) -> set[str]:
        out = pytest_in(tmp_path, "--collect-only", "-q", *args)
        assert out.returncode == 0, out.stdout + out.stderr
        return {line.split("::")[1] for line in out.stdout.splitlines() if "::" in line}

    assert collected() == {"plain", "reset", "in_netns", "proxied"}
    assert collected("-m", "not root") == {"plain", "proxied"}
    assert collected("-m", "not toxiproxy") == {"plain", "reset", "in_netns"}
    assert collected("-m", "root") == {"reset", "in_netns"}
    out = pytest_in(tmp_path, "--markers")
    assert "@pytest.mark.root: needs root" in out.stdout and "@pytest.mark.toxiproxy:" in out.stdout
