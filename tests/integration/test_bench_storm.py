"""``python -m mxref bench storm`` at a small size, for real: a metadata server, two sources and
three long-lived readers (real NIXL processes over UCX-over-TCP) storming together, a raw NIXL
fan-out of the same bytes beside them, one storm with a source frozen mid-storm, and the record
it writes checked for consistency: every READ counted once per source, every byte verified,
the bench's own ListSources timings taken during the storms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

READERS, SOURCES, MIB, ROUNDS = 3, 2, 8, 2


def test_a_small_storm_records_consistent_figures(tmp_path: Path) -> None:
    out = tmp_path / "storm.json"
    done = subprocess.run(
        [sys.executable, "-m", "mxref", "bench", "storm", "--readers", str(READERS), "--sources", str(SOURCES),
         "--mib", str(MIB), "--rounds", str(ROUNDS), "--frozen-rounds", "1", "--workdir", str(tmp_path / "work"),
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
    assert cell["goals"]["spread"]["met"] is True
    assert cell["goals"]["healthy"]["met"] is True and cell["fallbacks"] == 0 and cell["stalls"] == 0
    assert cell["attempts"] == ROUNDS * READERS
    # the load times: one per reader and round, ordered quantiles
    load = cell["load"]
    assert load["n"] == ROUNDS * READERS and 0 < load["p50_s"] <= load["p99_s"] <= load["max_s"]
    # the ceiling ran in the same rounds, and both aggregates are R x bytes over a positive wall time
    assert len(cell["raw_rounds"]) == ROUNDS and all(g > 0 for g in cell["raw_rounds"])
    assert len(cell["aggregate_rounds"]) == ROUNDS and all(g > 0 for g in cell["aggregate_rounds"])
    assert cell["goals"]["aggregate_over_raw"]["rounds"] and cell["goals"]["aggregate_over_raw"]["value"] > 0
    # ListSources was timed by the bench during the storms
    assert cell["list_sources"]["n"] >= ROUNDS and cell["list_sources"]["p50_ms"] > 0
    # the storm with source 1 frozen: every reader still loaded verified
    frozen = cell["frozen"]
    assert frozen["rounds"] == 1 and frozen["verified"] == READERS and frozen["fallbacks"] == 0
    assert "frozen_over_healthy_p99" in cell["goals"]
    assert "storm table (all cells):" in done.stdout


def test_bad_flags_are_refused_naming_the_flag() -> None:
    done = subprocess.run([sys.executable, "-m", "mxref", "bench", "storm", "--readers", "0"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "readers must be 1..64" in done.stderr
    done = subprocess.run([sys.executable, "-m", "mxref", "bench", "storm", "--freeze-at", "1.5"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--freeze-at 1.5: must be strictly between 0 and 1" in done.stderr
