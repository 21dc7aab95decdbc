"""``mxchaos nightly`` twice over real scenarios (``scenarios/smoke.yaml``: a real server,
source and reader over NIXL; two coins derived from ``tests/fixtures/scenarios/coin_flaky.yaml``
that land on ``seed // 2``) with ``--repeat 2``: the second night's index, json and terminal
output show what newly fails and what got fixed since the first; and a scenario this machine
cannot run (root counted missing) is skipped with its reason, with no run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scenarios" / "smoke.yaml"
COIN = ROOT / "tests" / "fixtures" / "scenarios" / "coin_flaky.yaml"


def coins(folder: Path) -> list[Path]:
    """``coin_pairs`` passes at seeds 0, 1 (and 4, 5 ...) and fails at 2, 3; ``coin_pairs_inverse``
    the other way round: a night at --seed 0 and one at --seed 2 (x --repeat 2) each flip."""
    text = COIN.read_text()
    pairs = text.replace("name: coin_flaky", "name: coin_pairs").replace("int(sys.argv[1]) % 2", "int(sys.argv[1]) // 2 % 2")
    inverse = text.replace("name: coin_flaky", "name: coin_pairs_inverse").replace(
        "int(sys.argv[1]) % 2", "1 - int(sys.argv[1]) // 2 % 2")
    assert pairs != text and inverse != text, "the fixture's coin changed shape"
    (folder / "coin_pairs.yaml").write_text(pairs)
    (folder / "coin_pairs_inverse.yaml").write_text(inverse)
    return [folder / "coin_pairs.yaml", folder / "coin_pairs_inverse.yaml"]


def test_two_nights_the_second_shows_what_newly_fails_and_what_got_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "nights"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "step-summary.md"))
    paths = [str(SMOKE), *map(str, coins(tmp_path))]
    first_code = cli.main(["nightly", "--out", str(out), "--repeat", "2", "--seed", "0", "-q", *paths])
    first_out = capsys.readouterr().out
    assert first_code == 1, first_out  # coin_pairs_inverse fails at seeds 0, 1
    first = json.loads((out / "latest" / "nightly.json").read_text())
    assert {s["name"]: s["cell"] for s in first["scenarios"]} == {
        "smoke": "PASS", "coin_pairs": "PASS", "coin_pairs_inverse": "FAIL"}
    assert first["comparison"] is None and "nothing to compare" in first_out
    # run's style: -q prints the [i/N] lines of the runs that did not pass only, no event stream,
    # a closing recap (a line per cell not PASS, its first failing run's rerun command), and the history page's path
    lines = first_out.splitlines()
    failed = [line for line in lines if line.startswith("[")]
    assert len(failed) == 2 and all("/6] coin_pairs_inverse run " in line and ": FAIL " in line for line in failed), failed
    assert not any("started (pid" in line for line in lines)
    recap = lines[lines.index(f"{'short summary':-^72}") + 1:]
    assert recap[0].startswith("FAIL  coin_pairs_inverse  ") and " run " in recap[1] and "--seed 0" in recap[1]
    assert f"history: {out / 'history.html'}" in lines
    md = (tmp_path / "step-summary.md").read_text()  # a CI job's page: the night's counts and failing runs
    assert md.startswith(f"### mxchaos nightly {first['night']}: failed") and "**1** FAIL" in md
    assert sum(1 for line in md.splitlines() if line.startswith("| FAIL | coin_pairs_inverse (passed 0/2) |")) == 1  # a row per cell

    second_code = cli.main(["nightly", "--out", str(out), "--repeat", "2", "--seed", "2", "-q", *paths])
    second_out = capsys.readouterr().out
    assert second_code == 1, second_out  # now coin_pairs fails
    night_dir = (out / "latest").resolve()
    assert night_dir.name != first["night"]
    night = json.loads((night_dir / "nightly.json").read_text())
    by = {s["name"]: s for s in night["scenarios"]}
    assert (by["smoke"]["cell"], by["smoke"]["rate"]) == ("PASS", {"k": 2, "n": 2})
    assert [r["seed"] for r in by["smoke"]["runs"]] == [2, 3]
    comp = night["comparison"]
    assert [(i["scenario"], i["old"], i["new"]) for i in comp["newly_failing"]] == [("coin_pairs", "PASS", "FAIL")]
    assert [(i["scenario"], i["old"], i["new"]) for i in comp["fixed"]] == [("coin_pairs_inverse", "FAIL", "PASS")]
    assert night["previous"]["night"] == first["night"]
    assert f"since night {first['night']}: " in second_out
    assert "NEWLY FAILING coin_pairs: newly failing: PASS 2/2 -> FAIL 0/2" in second_out
    assert "FIXED coin_pairs_inverse: fixed: FAIL 0/2 -> PASS 2/2" in second_out

    page = (night_dir / "index.html").read_text()
    assert f'Since night <a href="../{first["night"]}/index.html">' in page
    assert "Newly failing (1)" in page and "Fixed (1)" in page
    for s in night["scenarios"]:  # every run's report is where the page links it
        for run in s["runs"]:
            assert (night_dir / run["report"]).is_file(), run
            assert f'href="{run["report"]}"' in page
    assert (out / first["night"] / "index.html").is_file()  # the first night's page is kept
    junit = (night_dir / "junit.xml").read_text()
    assert junit.count("<testcase ") == 3 and 'failures="1"' in junit
    assert night["versions"]["nixl"] and night["hosts"] == {"binding": "here", "inventory": None}
    assert night["command"] == ["mxchaos", "nightly", "--out", str(out), "--repeat", "2", "--seed", "2", "-q", *paths]
    assert night["artifacts"]["bytes"] < 8 << 20


def test_a_scenario_this_machine_cannot_run_is_skipped_with_its_reason_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXCHAOS_MISSING_CAPABILITIES", "root")  # harness.scenario.capabilities: count root as missing
    out = tmp_path / "nights"
    partition = str(ROOT / "scenarios" / "partition_mid_read.yaml")
    code = cli.main(["nightly", "--out", str(out), "-q", "--seed", "0", partition, str(coins(tmp_path)[0])])
    printed = capsys.readouterr().out
    assert code == 0, printed  # coin_pairs passes at seed 0; the skip does not fail the night
    night = json.loads((out / "latest" / "nightly.json").read_text())
    skipped = {s["name"]: s for s in night["scenarios"]}["partition_mid_read"]
    assert skipped["cell"] == "SKIP" and skipped["runs"] == [] and "lacks root" in skipped["skip"]
    assert skipped["hosts"] == {"ctl": "netns", "a": "netns", "b": "netns", "r": "netns"}
    assert not (out / "latest" / "runs" / "partition_mid_read").exists()  # nothing started, no run folder
    assert "--- partition_mid_read: SKIP  (this machine lacks root" in printed
    assert "skipped: this machine lacks root" in (out / "latest" / "index.html").read_text()

    assert cli.main(["nightly", "--out", str(out), "-q", partition]) == 2  # nothing left to run
    assert "no scenario can be bound or run here (here):\n  partition_mid_read: this machine lacks root" in capsys.readouterr().err
