"""CI-native output, as a CI job meets it: ``mxchaos run`` with ``$GITHUB_STEP_SUMMARY`` set
appends a markdown summary (verdict counts, the runs that did not pass with their first failing
check, page and rerun command), and ``junit.xml`` has totals on ``<testsuites>`` and failure
bodies a person reads (the check, the rerun command, the page's relative path, the tail of the
log of the process the check names).

Real scenarios: the catalogue's ``smoke`` and a copy of it whose source is sent SIGABRT after
the reader loaded, with ``exit_codes`` expecting it to end well (real NIXL agents, real processes).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from harness import cli
from harness.record.results import RESULTS_ENV, command
from harness.reports.ci import STEP_SUMMARY

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scenarios" / "smoke.yaml"


def _aborted_source(folder: Path) -> Path:
    """smoke, then SIGABRT to source-1 once the reader has exited; exit_codes wants source-1's 0."""
    doc = yaml.safe_load(SMOKE.read_text())
    doc["name"] = "smoke_source_aborted"
    doc["description"] = "smoke whose source is sent SIGABRT after the load"
    doc.pop("references", None)
    doc["steps"].append({"fault": {"kind": "kill", "target": "source-1", "signal": "ABRT", "name": "abort"}})
    doc["steps"].append({"sleep": "500ms"})
    doc["checks"] = [c for c in doc["checks"] if "exit_codes" not in c]
    doc["checks"].insert(0, {"exit_codes": {"expect": {"reader-1": 0, "source-1": 0}}})
    path = folder / "smoke_source_aborted.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_ci_job_gets_a_step_summary_and_readable_junit_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "runs"))
    summary_file = tmp_path / "step-summary.md"
    summary_file.write_text("earlier step's text\n")  # appended to, never replaced
    monkeypatch.setenv(STEP_SUMMARY, str(summary_file))
    aborted = _aborted_source(tmp_path)

    assert cli.main(["run", str(SMOKE), str(aborted)]) == 1
    out = capsys.readouterr().out
    assert "step summary: appended to $GITHUB_STEP_SUMMARY" in out
    folder = (tmp_path / "runs" / "latest").resolve()

    md = summary_file.read_text()
    assert md.startswith("earlier step's text\n### mxchaos run ")
    assert "**1** PASS" in md and "**1** FAIL" in md
    (row,) = [line for line in md.splitlines() if line.startswith("| FAIL |")]
    assert "smoke_source_aborted" in row and "source-1 exited -6 (SIGABRT)" in row
    exe = command()
    assert f"`{exe} run smoke_source_aborted.yaml --seed 1`" in row
    page = re.search(r"`(runs/[^`]+/report\.html)`", row)
    assert page is not None and (tmp_path / page.group(1)).is_file()  # relative to the working folder
    assert f"index: `runs/{folder.name}/index.html`" in md
    assert "| smoke |" not in md  # a run that passed has no row

    root = ET.parse(folder / "junit.xml").getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 2
    for key in ("tests", "failures", "errors", "skipped"):
        assert root.get(key) == str(sum(int(s.get(key) or 0) for s in suites)), key
    assert int(root.get("failures") or 0) >= 1
    assert abs(float(root.get("time") or 0) - sum(float(s.get("time") or 0) for s in suites)) < 0.01
    (failure,) = [f for case in root.iter("testcase") if case.get("name") == "exit_codes" for f in case.findall("failure")]
    body = failure.text or ""
    assert "(SIGABRT)" in (failure.get("message") or "")
    assert body.startswith("check:    exit_codes: ") and "source-1 exited -6 (SIGABRT)" in body
    assert f"rerun:    {exe} run smoke_source_aborted.yaml --seed 1" in body
    page_line = re.search(r"^page:     (\S+)$", body, re.M)
    assert page_line is not None and not page_line.group(1).startswith("/")
    assert (folder / page_line.group(1)).is_file()  # relative to junit.xml's folder
    log_line = re.search(r"^log of source-1 \(named by exit_codes\): (\S+), last 20 lines:$", body, re.M)
    assert log_line is not None and (folder / log_line.group(1).rstrip(",")).is_file()
    assert "  | " in body  # the log's tail itself
    assert "{" not in body.splitlines()[0]  # plain text, not a JSON blob
