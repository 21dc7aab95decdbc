"""One folder per ``mxchaos run`` invocation (``harness.reports.invocation``): a later invocation keeps
an earlier one's index, summary and runs; ``runs/latest`` names the newest; the terminal shows
``[i/N]`` lines, and a run that did not pass names its first failing check and what to do next.

Fast scenarios of the fake process (``tests/fixtures/fakeproc.py``): real processes, no NIXL.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import cli
from harness.record.results import RESULTS_ENV, command
from harness.record.saved import SummaryDoc

pytestmark = pytest.mark.integration

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fakeproc.py"


def _scenario(folder: Path, name: str, count: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f'name: {name}\nlauncher: ["{{python}}", "{FAKE}"]\nscrape: {{interval: 200ms}}\n'
        "budgets: {step: 10s, run: 40s, stop_grace: 2s, progress: 20s, heal: 500ms}\n"
        "processes:\n  server: {role: server}\n  source-1: {role: source}\n"
        "steps:\n  - start: [server, source-1]\n  - await: {process: source-1, event: heartbeat}\n"
        f"checks:\n  - count: {{process: source-1, event: heartbeat, {count}}}\n"
    )
    return path


def _links(index: Path) -> list[str]:
    """The links to files (not the page's own anchors: the count chips' ``#only-PASS``)."""
    found = [double or single for double, single in re.findall(r"""href=(?:"([^"]+)"|'([^']+)')""", index.read_text())]
    return [link for link in found if not link.startswith("#")]


def test_each_invocation_keeps_its_own_folder_index_and_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))  # the results root, here rather than the checkout's
    first_a, first_b = _scenario(tmp_path, "first_a", "min: 1"), _scenario(tmp_path, "first_b", "min: 1")
    assert cli.main(["run", str(first_a), str(first_b)]) == 0
    out = capsys.readouterr().out
    assert "[1/2] first_a (seed" in out and "[2/2] first_b: PASS" in out
    first = (tmp_path / "runs" / "latest").resolve()
    assert first.parent == (tmp_path / "runs").resolve()

    failing = _scenario(tmp_path, "second", "max: 0")  # a source heartbeats: this check fails
    assert cli.main(["run", str(failing), "-q"]) == 1
    out = capsys.readouterr().out
    second = (tmp_path / "runs" / "latest").resolve()
    assert second != first
    # -q: the failing run's line names its first failing check, then what to do next
    assert "[1/1] second: FAIL" in out and "first failing: count(" in out
    exe = command()  # .venv/bin/mxchaos from a checkout (whole: the test runs outside it), else mxchaos
    assert f"rerun:  {exe} run second.yaml --seed" in out and f"replay: {exe} replay runs/{second.name}/second/" in out

    # the first invocation is intact: its summary, its index linking both of its runs
    summary = json.loads((first / "summary.json").read_text())
    assert set(summary["scenarios"]) == {"first_a", "first_b"}
    links = _links(first / "index.html")
    assert len(links) == 2 and all((first / link).is_file() for link in links), links
    assert {Path(link).parts[0] for link in links} == {"first_a", "first_b"}
    assert 'testsuite name="mxchaos.first_a"' in (first / "junit.xml").read_text()
    record = json.loads((first / "invocation.json").read_text())
    assert record["kind"] == "run" and record["passed"] is True and record["exit_code"] == 0

    # the second has its own
    assert set(json.loads((second / "summary.json").read_text())["scenarios"]) == {"second"}
    (link,) = _links(second / "index.html")
    assert (second / link).is_file() and "FAILED" in (second / "index.html").read_text()
    assert json.loads((second / "invocation.json").read_text())["exit_code"] == 1


def test_an_explicit_out_is_the_invocation_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrix and the tests name the folder: runs go straight into it, and no runs/ appears."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))  # the results root, here rather than the checkout's
    path = _scenario(tmp_path, "named", "min: 1")
    assert cli.main(["run", str(path), "--out", str(tmp_path / "col"), "-q"]) == 0
    assert (tmp_path / "col" / "named" / "latest" / "verdict.json").is_file()
    assert {"summary.json", "junit.xml", "index.html", "invocation.json"} <= {p.name for p in (tmp_path / "col").iterdir()}
    assert not (tmp_path / "runs").exists()


def test_maxfail_stops_last_failed_reruns_only_the_failures_json_and_open_name_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))  # the results root, here rather than the checkout's
    good, bad, later = (_scenario(tmp_path, "good", "min: 1"), _scenario(tmp_path, "bad", "max: 0"),
                        _scenario(tmp_path, "later", "min: 1"))
    assert cli.main(["run", str(good), str(bad), str(later), "-x"]) == 1
    out = capsys.readouterr().out
    assert "stopping: 1 run(s) did not pass (--maxfail 1); later and the rest not run" in out
    first = (tmp_path / "runs" / "latest").resolve()
    # the closing recap: the failing run's check table, no passing run's, a line per run that did not
    # pass (its first failing check and its page), the tally last
    lines = out.splitlines()
    assert any(line.startswith("bad  (seed") for line in lines) and not any(line.startswith("good  (seed") for line in lines)
    recap = lines[lines.index(f"{'short summary':-^72}") + 1:]
    page = Path("runs") / first.name / "bad"
    assert recap[0].split()[:3] == ["FAIL", "bad", "count(source-1"] and str(page) in recap[0]
    assert (tmp_path / recap[0].split()[-1]).is_file()  # the page, as a person would type it
    assert recap[1].split() == ["rerun:", command(), "run", "bad.yaml", "--seed", "0"]  # runs as printed
    assert recap[-3].startswith("2 scenarios: 1 PASS, 1 FAIL in ")  # then the summary: and index: lines
    assert set(json.loads((first / "summary.json").read_text())["scenarios"]) == {"good", "bad"}

    assert cli.main(["run", str(good), "-q"]) == 0  # a passing run since does not hide the failure
    capsys.readouterr()
    assert cli.main(["run", "--lf", "--json"]) == 1  # no PATH: the files of what failed
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout is the document alone; the lines went to stderr
    assert "--lf: 1 scenario(s) whose newest run did not pass: bad" in captured.err and "[1/1] bad" in captured.err
    assert [s["name"] for s in doc["scenarios"]] == ["bad"] and doc["exit_code"] == 1
    folder = tmp_path / doc["folder"]  # relative to the working folder
    assert folder == (tmp_path / "runs" / "latest").resolve() != first
    run = doc["scenarios"][0]["runs"][0]
    assert not Path(run["run_dir"]).is_absolute() and (folder / run["report"]).is_file()
    assert run["first_failing"].startswith("count(") and (folder / doc["summary"]).is_file()

    assert cli.main(["open"]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "index.html")
    assert cli.main(["open", "bad"]) == 0
    assert capsys.readouterr().out.strip() == str((folder / "bad" / "latest" / "report.html").resolve())
    assert cli.main(["open", str(first)]) == 0 and capsys.readouterr().out.strip() == str(first / "index.html")
    assert cli.main(["run", str(good), "-q"]) == 0  # bad is no longer in the newest invocation
    capsys.readouterr()
    assert cli.main(["open", "bad"]) == 0  # its newest run, from the invocation before
    assert capsys.readouterr().out.strip() == str((folder / "bad" / "latest" / "report.html").resolve())
    assert cli.main(["open", "nothing_by_that_name"]) == 2
    assert "no page; looked at" in capsys.readouterr().err

    # from any working folder, a name means that scenario's newest run under the results root
    away = tmp_path / "away"
    away.mkdir()
    monkeypatch.chdir(away)
    assert cli.main(["check", "bad"]) == 1  # re-judged: it still fails
    assert f"--- bad: FAIL  {(folder / 'bad' / 'latest').resolve()}" in capsys.readouterr().out
    assert cli.main(["replay", "good", "-o", "again.yaml"]) == 0
    assert "name: good" in (away / "again.yaml").read_text()


def test_an_invocation_folder_moved_elsewhere_still_finds_every_run_page_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every path a saved document of an invocation holds is relative to the invocation's folder
    (or, for a run's own documents, to the run's): a CI artefact downloaded elsewhere works whole."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))
    _scenario(tmp_path, "good", "min: 1")
    _scenario(tmp_path, "bad", "max: 0")
    assert cli.main(["run", "good.yaml", "bad.yaml", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    folder = tmp_path / doc["folder"]
    assert not Path(doc["folder"]).is_absolute() and folder.parent == tmp_path / "runs"

    moved = tmp_path / "elsewhere" / "artefact"
    moved.parent.mkdir()
    folder.rename(moved)
    (tmp_path / "runs").rename(tmp_path / "gone")  # nothing may still point into the old place

    for name in ("summary.json", "junit.xml", "invocation.json", "index.html"):
        assert str(tmp_path / "runs") not in (moved / name).read_text(), name
    for verdict in moved.glob("*/*/verdict.json"):
        assert str(tmp_path) not in verdict.read_text()
    links = _links(moved / "index.html")
    assert len(links) == 2 and all((moved / link).is_file() for link in links), links
    for link in links:  # each run page's own links, the one back to the index first
        page = moved / link
        assert _links(page)[0] == "../../index.html"
        for href in _links(page):
            if "://" not in href and not href.startswith("#"):
                assert (page.parent / href.split("#")[0]).exists(), (link, href)
    summary = SummaryDoc.read(moved / "summary.json")
    assert summary is not None
    assert all(Path(run.run_dir).is_dir() and Path(run.run_dir).is_relative_to(moved) for _, run in summary.runs())
    for scenario in doc["scenarios"]:
        for run in scenario["runs"]:
            assert (moved / run["run_dir"]).is_dir() and (moved / run["report"]).is_file()
    assert (moved / doc["summary"]).is_file() and (moved / doc["junit"]).is_file() and (moved / doc["index"]).is_file()


def test_keep_leaves_the_newest_invocations_and_refuses_an_out_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))
    _scenario(tmp_path, "good", "min: 1")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine").mkdir()  # not an invocation: never deleted
    made = []
    for _ in range(3):
        assert cli.main(["run", "good.yaml", "-q", "--keep", "2"]) == 0
        made.append((tmp_path / "runs" / "latest").resolve())
    out = capsys.readouterr().out
    assert "--keep 2: deleted 1 older invocation(s) under runs (" in out and made[0].name in out
    left = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert left == sorted([made[1].name, made[2].name, "latest", "mine"])
    assert cli.main(["run", "good.yaml", "--keep", "2", "--out", "col"]) == 2
    assert "--keep prunes the invocations under the results root" in capsys.readouterr().err
