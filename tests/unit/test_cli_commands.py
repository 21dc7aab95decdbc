"""``mxchaos`` in-process: ``--version``, the exit codes in ``--help``, what ``list`` says this
machine would skip, and ``validate``'s per-file lines and tally."""

from __future__ import annotations

import platform
import re
from importlib import metadata
from pathlib import Path

import pytest

from harness import capabilities, cli

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fakeproc.py"

BODY = """\
name: {name}
launcher: ["{{python}}", "{fake}"]
processes:
  server: {{role: server}}
  source-1: {{role: source}}
steps:
  - start: [server, source-1]
{extra}  - await: {{process: source-1, event: heartbeat}}
"""
RESET = "  - fault: {kind: tcp_reset, target: source-1, peer: server, name: cut}\n"


def write(folder: Path, name: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(BODY.format(name=name, fake=FAKE, extra=extra))
    return path


def test_version_names_the_package_nixl_and_python(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"mxchaos {metadata.version('mxchaos')}, nixl {metadata.version('nixl')}, Python {platform.python_version()}\n"


def test_help_documents_every_exit_code_the_cli_returns(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("exit codes:") :]
    documented = {int(m) for m in re.findall(r"^  (\d+)  ", section, re.MULTILINE)}
    returned = {v for k, v in vars(cli).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert documented == returned == {0, 1, 2, 130, 141}
    assert re.search(r"^  130  interrupted \(SIGINT / SIGTERM\)", section, re.MULTILINE)
    assert re.search(r"^  141  standard output was closed early", section, re.MULTILINE)


def test_list_says_which_scenarios_this_machine_would_skip_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "plain")
    write(tmp_path, "needs_root", RESET)
    monkeypatch.setenv(capabilities.ENV_MISSING, "root")
    assert cli.main(["list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    skips = [line.strip() for line in lines if "would SKIP" in line]
    assert len(skips) == 1 and skips[0].startswith("would SKIP here: this machine lacks root (for cut (tcp_reset))"), out
    assert lines.index(f"{'':36} {tmp_path / 'needs_root.yaml'}") == lines.index(f"{'':36} {skips[0]}") - 1
    assert lines[-1] == "2 scenarios; 1 would be skipped on this machine (it lacks root)"

    monkeypatch.setenv(capabilities.ENV_MISSING, "")
    monkeypatch.setattr(capabilities, "have", lambda capability: True)
    assert cli.main(["list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "would SKIP" not in out and out.splitlines()[-1] == "2 scenarios; this machine can run every one"


def test_validate_prints_each_file_in_order_then_a_tally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "s", "good")
    bad = write(tmp_path / "s", "h_bad")
    bad.write_text(bad.read_text().replace("steps:", "stpes:"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate", "s", "missing.yaml"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "ok  s/good.yaml  (good: 2 processes, 2 steps, 0 checks)\n"
    err = captured.err.splitlines()
    assert err[0] == "missing.yaml: no such file or folder"
    assert err[1] == f"{Path('s') / 'h_bad.yaml'}: invalid scenario (2 problems)"
    assert err[-1] == "2 files: 1 valid, 1 invalid; 1 path problem"

    assert cli.main(["validate", str(good)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 file: 1 valid, 0 invalid"
