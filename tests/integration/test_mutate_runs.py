"""``mxchaos mutate`` on real runs: two shipped mutants against two scenarios.

``leak_handle_after_stall`` (a stalled chunked READ's in-flight handles are never released) is
killed by ``frozen_source`` through ``nixl_balance``, the resource audit: without the audit
every check of that scenario passes, since dropping the agent releases the handles silently.
``no_stale_on_exit`` (a clean exit sends no STALE) is killed by ``heartbeat_loss`` through checks
that are no time bound, and by nothing in ``frozen_source``. The baseline passes both.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def test_two_mutants_on_two_scenarios_fill_the_kill_matrix(tmp_path: Path) -> None:
    out = tmp_path / "mutate"
    code = cli.main(["mutate", "--mutants", str(ROOT / "tests" / "mutants"), "--only",
                     "leak_handle_after_stall,no_stale_on_exit", "--repeat", "0", "--min-kills", "1",
                     "--out", str(out), str(ROOT / "scenarios" / "frozen_source.yaml"),
                     str(ROOT / "scenarios" / "heartbeat_loss.yaml")])
    matrix = json.loads((out / "mutate.json").read_text())
    assert (out / "mutate.html").read_text().count("<tr>") == 3
    assert all(not o["killed"] for runs in matrix["baseline"].values() for o in runs), matrix["baseline"]
    rows = {m["name"]: m for m in matrix["mutants"]}
    leak = rows["leak_handle_after_stall"]["cells"]
    assert leak["frozen_source"]["state"] == "killed" and "nixl_balance" in leak["frozen_source"]["by"]
    assert leak["heartbeat_loss"]["state"] == "survived"
    stale = rows["no_stale_on_exit"]["cells"]
    assert stale["heartbeat_loss"]["state"] == "killed", stale["heartbeat_loss"]
    assert stale["frozen_source"]["state"] == "survived"
    assert code == 0
    assert not (out / "scratch" / "tree").exists()
