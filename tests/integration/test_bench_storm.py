"""``python -m mxref bench storm`` at a small size, for real: a metadata server, two sources and
three long-lived readers (real NIXL processes over UCX-over-TCP) storming together, a raw NIXL
fan-out of the same bytes beside them, one storm with a source frozen mid-storm, and the record
it writes checked for consistency: every READ counted once per source, every byte verified,
the bench's own ListSources timings taken during the storms."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

READERS, SOURCES, MIB, ROUNDS, FROZEN = 3, 2, 8, 2, 2


def test_a_small_storm_records_consistent_figures(tmp_path: Path) -> None:
    out = tmp_path / "storm.json"
    done = subprocess.run(
        [sys.executable, "-m", "mxref", "bench", "storm", "--readers", str(READERS), "--sources", str(SOURCES),
         "--mib", str(MIB), "--rounds", str(ROUNDS), "--frozen-rounds", str(FROZEN), "--workdir", str(tmp_path / "work"),
         "--json", str(out)],
        capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())["bench_storm"]
    assert record["selector"] == "ordinal" and record["mode"] == "central"
    (cell,) = record["cells"]
    nbytes = MIB << 20
    assert (cell["subject"], cell["readers"], cell["sources"], cell["bytes"]) == ("mxref", READERS, SOURCES, nbytes)
    # every reader's READ counted once, on one of the two sources; every byte verified
    assert len(cell["reads_per_source"]) == ROUNDS
    for per_source in cell["reads_per_source"]:
        assert sum(per_source.values()) == READERS and len(per_source) <= SOURCES
    assert cell["bytes_verified"] == ROUNDS * READERS * nbytes
    # the ordinal selector: ceil(3 / 2) = 2 READs at most on a source in a healthy storm
    assert cell["spread_rounds"] == [1.0] * ROUNDS
    assert cell["goals"]["spread"]["verdict"] == "MET"
    assert cell["goals"]["healthy"]["verdict"] == "MET" and cell["fallbacks"] == 0 and cell["stalls"] == 0
    assert cell["attempts"] == ROUNDS * READERS
    # the load times: one per reader and round, ordered quantiles
    load = cell["load"]
    assert load["n"] == ROUNDS * READERS and 0 < load["p50_s"] <= load["p99_s"] <= load["max_s"]
    # the ceiling ran in the same rounds, and both aggregates are R x bytes over a positive wall time
    assert len(cell["raw_rounds"]) == ROUNDS and all(g > 0 for g in cell["raw_rounds"])
    assert len(cell["aggregate_rounds"]) == ROUNDS and all(g > 0 for g in cell["aggregate_rounds"])
    assert len(cell["figures"]["storm_over_raw"]["rounds"]) == ROUNDS and cell["goals"]["aggregate_over_raw"]["value"] > 0
    # every figure over 2 rounds has an interval (their range, 50 %) and decides no goal
    for key in ("aggregate_gbps", "raw_gbps", "storm_over_raw", "p50_s", "p99_s", "p99_over_p50"):
        fig = cell["figures"][key]
        assert fig["n"] == ROUNDS and fig["ci"][0] <= fig["median"] <= fig["ci"][1] and fig["coverage"] == 0.5, key
    for name in ("aggregate_over_raw", "p99_over_p50"):
        assert cell["goals"][name]["verdict"] == "UNDECIDED", name
    # ListSources was timed by the bench during the storms
    assert cell["list_sources"]["n"] >= ROUNDS and cell["list_sources"]["p50_ms"] > 0
    # the storm with source 1 frozen: every reader still loaded verified
    frozen = cell["frozen"]
    assert frozen["rounds"] + frozen["not_landed"] == FROZEN and frozen["rounds"] >= 1
    assert frozen["verified"] == READERS * frozen["rounds"] and frozen["fallbacks"] == 0
    assert cell["goals"]["frozen_over_healthy_p99"]["verdict"] == "UNDECIDED"
    assert "storm table (all cells):" in done.stdout


def test_bad_flags_are_refused_naming_the_flag() -> None:
    done = subprocess.run([sys.executable, "-m", "mxref", "bench", "storm", "--readers", "0"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "readers must be 1..64" in done.stderr
    done = subprocess.run([sys.executable, "-m", "mxref", "bench", "storm", "--freeze-at", "1.5"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--freeze-at 1.5: must be strictly between 0 and 1" in done.stderr
    done = subprocess.run([sys.executable, "-m", "mxref", "bench", "storm", "--baseline", "/nonexistent-checkout"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--baseline /nonexistent-checkout: no mxref/__main__.py there" in done.stderr


def test_a_baseline_checkouts_readers_storm_in_the_same_rounds(tmp_path: Path) -> None:
    # another checkout: a copy of this tree's mxref whose import leaves a mark (one file per process)
    checkout = tmp_path / "checkout"
    shutil.copytree(Path(__file__).resolve().parents[2] / "mxref", checkout / "mxref",
                    ignore=shutil.ignore_patterns("__pycache__", "target"))
    with open(checkout / "mxref" / "__init__.py", "a") as init:
        init.write("\nopen(__file__ + f'.imported-{__import__(\"os\").getpid()}', 'w').close()\n")
    out = tmp_path / "storm.json"
    done = subprocess.run(
        [sys.executable, "-m", "mxref", "bench", "storm", "--readers", "2", "--sources", "1", "--mib", str(MIB),
         "--rounds", str(ROUNDS), "--frozen-rounds", "0", "--baseline", str(checkout), "--workdir",
         str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    mine, base = json.loads(out.read_text())["bench_storm"]["cells"]
    assert (mine["subject"], base["subject"]) == ("mxref", "baseline")
    assert base["bytes_verified"] == ROUNDS * 2 * (MIB << 20) and base["raw_rounds"] == mine["raw_rounds"]
    assert mine["figures"]["over_baseline"]["rounds"] == [
        round(a / b, 4) for a, b in zip(mine["aggregate_rounds"], base["aggregate_rounds"])]
    # the baseline's two readers ran the checkout's code, and only they did
    marks = list((checkout / "mxref").glob("__init__.py.imported-*"))
    assert len(marks) >= 2, marks
    assert not list((Path(__file__).resolve().parents[2] / "mxref").glob("__init__.py.imported-*"))
    for i in range(2):
        assert "load_done" in (tmp_path / "work" / f"baseline-reader-{i}.events.jsonl").read_text()
    assert "mxref / baseline aggregate 2x1, per round:" in done.stdout
