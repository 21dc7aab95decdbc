"""Cross-host time checks on ssh hosts: an ``elapsed`` whose two ends were stamped by different
hosts' clocks shows (and records) the error bound of the offsets the harness probed; one whose
ends share a clock shows none."""

from __future__ import annotations

from typing import Any

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.record.timeline import History

ROLES = RunFacts(roles={"source-1": "source", "reader-1": "reader"})


def _clock(offset: float, error: float, end_offset: float) -> dict[str, Any]:
    return {"start": {"offset_s": offset, "error_s": error}, "end": {"offset_s": end_offset, "error_s": error}}


ROWS: list[tuple[float, str, str, str, dict[str, Any]]] = [
    (0.0, "ok", "harness", "ssh_hosts", {"hosts": {"a": {"clock": _clock(0.5, 0.001, 0.5)},
                                                    "r": {"clock": _clock(-0.2, 0.002, -0.2)}}}),
    (0.1, "ok", "source-1", "start", {"host": "a"}),
    (0.2, "ok", "reader-1", "start", {"host": "r"}),
    (1.0, "info", "source-1", "status_change", {"status": "READY"}),
    (1.5, "info", "reader-1", "transfer_start", {}),
    (4.6, "info", "reader-1", "transfer_timeout", {}),
    (9.0, "info", "harness", "ssh_clocks", {"hosts": {"a": {"clock": _clock(0.5, 0.001, 0.503)},
                                                      "r": {"clock": _clock(-0.2, 0.002, -0.2)}}}),
]


def _elapsed(frm: dict[str, Any], to: dict[str, Any]) -> checks.NamedResult:
    definition = checks.REGISTRY["elapsed"]
    params = definition.params.model_validate({"from": frm, "to": to, "within": 5})
    return evaluate(0, "elapsed", params, History.build(ROWS), ROLES)


def test_ends_on_two_hosts_carry_both_errors_and_the_drift() -> None:
    got = _elapsed({"process": "source-1", "event": "status_change"}, {"process": "reader-1", "event": "transfer_start"})
    assert got.valid is True
    # a: 1 ms probe error + 3 ms drift between the start and end probes; r: 2 ms
    assert got.details["clock_error_s"] == 0.006
    assert got.details["clock_hosts"] == ["a", "r"]
    assert "±6.000 ms: clocks of a and r" in got.summary


def test_ends_on_one_host_share_its_clock() -> None:
    got = _elapsed({"process": "reader-1", "event": "transfer_start"}, {"process": "reader-1", "event": "transfer_timeout"})
    assert "clock_error_s" not in got.details and "±" not in got.summary


def test_a_run_without_ssh_hosts_shows_no_bound() -> None:
    rows = [r for r in ROWS if r[2] != "harness"]
    definition = checks.REGISTRY["elapsed"]
    params = definition.params.model_validate({"from": {"process": "source-1", "event": "status_change"},
                                               "to": {"process": "reader-1", "event": "transfer_start"}, "within": 5})
    got = evaluate(0, "elapsed", params, History.build(rows), ROLES)
    assert "clock_error_s" not in got.details
