"""Checks are pure functions of a timeline: each is exercised here on hand-built histories,
including the cases where the verdict must be "unknown" rather than a guess."""

from __future__ import annotations

from typing import Any

import pytest

from harness import checks
from harness.checks import CheckResult, RunFacts, evaluate, merge_valid, register
from harness.checks.events import CountParams, OrderingParams
from harness.checks.integrity import IntegrityParams
from harness.checks.loads import FellBackParams, LoadedParams
from harness.checks.metrics import MetricCheckParams
from harness.checks.processes import ExitCodesParams, NothingLeakedParams
from harness.checks.status import HealthParams, ListedParams
from harness.judge.content import ExpectedModel, ExpectedTensor
from harness.record.timeline import History

ROLES = RunFacts(roles={"server": "server", "source-1": "source", "source-2": "source", "reader-1": "reader"})


def run(kind: str, params: dict[str, Any], rows: list[tuple[Any, ...]]) -> checks.NamedResult:
    definition = checks.REGISTRY[kind]
    return evaluate(0, kind, definition.params.model_validate(params), History.build(rows), ROLES)


BASE = [
    (0.10, "ok", "source-1", "start", {"incarnation": 1, "pid": 100}),
    (0.30, "info", "source-1", "agent_ready", {"agent_name": "source-1-ab12"}),
    (0.31, "info", "source-1", "published", {"worker_id": "w1", "mx_source_id": "m"}),
    (0.32, "info", "source-1", "status_change", {"status": "READY"}),
    (1.00, "ok", "reader-1", "start", {"incarnation": 1, "pid": 200}),
]


def test_merge_valid_lets_the_worst_win() -> None:
    assert merge_valid([]) is True
    assert merge_valid([True, True]) is True
    assert merge_valid([True, "unknown"]) == "unknown"
    assert merge_valid(["unknown", False, True]) is False


def test_a_check_that_raises_is_unknown_not_a_crash() -> None:
    class Params(checks.CheckParams):
        pass

    @register("_explodes", Params)
    def explodes(p: Params, h: History, run: RunFacts) -> CheckResult:
        raise RuntimeError("boom")

    try:
        result = evaluate(3, "_explodes", Params(), History.build([]), ROLES)
    finally:
        del checks.REGISTRY["_explodes"]
    assert result.valid == "unknown"
    assert result.summary == "check raised RuntimeError: boom"
    assert "RuntimeError: boom" in result.details["traceback"]
    assert result.index == 3


def test_loaded_passes_on_a_verified_rdma_load_from_the_named_source() -> None:
    rows = [*BASE, (2.0, "info", "reader-1", "load_done", {"path": "rdma", "source": "source-1-ab12", "integrity": "verified"})]
    result = run("loaded", {"reader": "reader-1", "path": "rdma", "source": "source-1", "within": "2s"}, rows)
    assert result.valid is True, result.summary
    assert result.summary == "reader-1 loaded over rdma from source-1-ab12 in 1.000s after reader-1 start"
    assert result.marks == ((2.0, "reader-1 loaded (rdma)"),)


@pytest.mark.parametrize(
    ("load", "params", "summary"),
    [
        (
            {"path": "disk", "source": None, "integrity": True},
            {},
            "reader-1: path 'disk', expected 'rdma'",
        ),
        (
            {"path": "rdma", "source": "source-2-x", "worker_id": "w2", "integrity": True},
            {"source": "source-1"},
            "reader-1: source 'source-2-x' (worker 'w2') is not source-1",
        ),
        (
            {"path": "rdma", "source": "source-1", "integrity": True},
            {"within": "500ms"},
            "reader-1: took 1.000s after reader-1 start, budget 500ms",
        ),
        (
            {"path": "rdma", "source": "source-1", "integrity": False},
            {},
            "reader-1: integrity False, expected verified",
        ),
    ],
)
def test_loaded_fails_with_the_reason(load: dict[str, Any], params: dict[str, Any], summary: str) -> None:
    rows = [*BASE, (2.0, "info", "reader-1", "load_done", load)]
    result = run("loaded", {"reader": "reader-1", **params}, rows)
    assert (result.valid, result.summary) == (False, summary)


def test_loaded_without_a_load_reports_the_failure_event() -> None:
    rows = [*BASE, (2.0, "info", "reader-1", "load_failed", {"error": "no candidates"})]
    result = run("loaded", {"reader": "reader-1"}, rows)
    assert (result.valid, result.summary) == (False, "reader-1 reported no load_done after reader-1 start: load_failed 'no candidates'")


def test_loaded_is_unknown_when_the_reference_never_happened() -> None:
    result = run("loaded", {"reader": "reader-1", "from": {"fault": "freeze"}}, BASE)
    assert (result.valid, result.summary) == ("unknown", "reference point (fault freeze) never happened")


FAULT = [
    (1.5, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": "source-1"}),
    (1.6, "ok", "nemesis", "inject", {"fault": "freeze", "healable": True}),
]


def test_fell_back_measures_from_the_reference() -> None:
    rows = [
        *BASE,
        *FAULT,
        (4.5, "info", "reader-1", "fallback", {"reason": "transfer_timeout"}),
        (5.0, "info", "reader-1", "load_done", {"path": "disk", "integrity": True}),
    ]
    ok = run("fell_back", {"reader": "reader-1", "from": {"fault": "freeze"}, "within": "5s", "not_before": "2s"}, rows)
    assert (ok.valid, ok.summary) == (True, "reader-1 fell back 3.000s after fault freeze (transfer_timeout)")
    early = run("fell_back", {"reader": "reader-1", "from": {"fault": "freeze"}, "not_before": "4s"}, rows)
    assert (early.valid, early.summary) == (False, "reader-1: fell back 3.000s after fault freeze, before 4s")
    late = run("fell_back", {"reader": "reader-1", "from": {"fault": "freeze"}, "within": "1s"}, rows)
    assert late.valid is False and "later than 1s" in late.summary
    reason = run("fell_back", {"reader": "reader-1", "reason": "transfer_error"}, rows)
    assert reason.summary == "reader-1: reason 'transfer_timeout', expected 'transfer_error'"


def test_fell_back_fails_when_the_reader_loaded_over_rdma() -> None:
    rows = [*BASE, (2.0, "info", "reader-1", "load_done", {"path": "rdma", "integrity": True})]
    result = run("fell_back", {"reader": "reader-1"}, rows)
    assert (result.valid, result.summary) == (False, "reader-1 did not fall back after reader-1 start (it loaded over rdma)")


MODEL = ExpectedModel(
    "generator: test",
    (
        ExpectedTensor("model.layers.0.weight", "float16", (4,), "aaaa000000000001"),
        ExpectedTensor("model.layers.1.weight", "float16", (4,), "aaaa000000000002"),
    ),
)
HONEST = {t.name: t.checksum for t in MODEL.tensors}
JUDGED = RunFacts(roles=ROLES.roles, expected=lambda: MODEL)


def judge_integrity(params: dict[str, Any], rows: list[tuple[Any, ...]]) -> checks.NamedResult:
    return evaluate(0, "integrity", IntegrityParams.model_validate(params), History.build(rows), JUDGED)


def digest(t: float, when: str, sums: dict[str, str], reader: str = "reader-1", claims: str | None = None) -> tuple[Any, ...]:
    # a reader's digest field says the model is what it should be unless told otherwise
    value = {"when": when, "digest": claims or MODEL.digest(), "checksums": sums}
    return (t, "info", reader, "memory_digest", value)


VERIFIED = (2.0, "info", "reader-1", "load_done", {"path": "rdma", "source": "source-1", "integrity": "verified"})


def test_integrity_passes_when_the_memory_checksums_match_the_harness_model() -> None:
    rows = [*BASE, VERIFIED, digest(2.01, "loaded", HONEST), digest(3.0, "settled", HONEST), digest(3.5, "exit", HONEST)]
    result = judge_integrity({}, rows)
    assert result.valid is True, result.summary
    assert result.summary == (
        "2 memory digest(s) match the model as the harness computes it (generator: test): reader-1 (settled), reader-1 (exit)"
    )


def test_integrity_fails_loudly_when_a_reader_claims_verified_but_holds_one_wrong_tensor() -> None:
    wrong = {**HONEST, "model.layers.1.weight": "0123456789abcdef"}
    rows = [*BASE, VERIFIED, digest(2.01, "loaded", HONEST), digest(3.0, "settled", wrong), digest(3.5, "exit", HONEST)]
    result = judge_integrity({}, rows)
    assert result.valid is False
    assert result.summary == (
        "reader-1 holds wrong bytes (settled, 3.000s): 1 of 2 tensors differ from the model: model.layers.1.weight; "
        "it CLAIMED VERIFIED (load_done at 2.000s, path 'rdma')"
    )
    assert result.marks == ((3.0, "reader-1 wrong bytes"),)


def test_integrity_never_takes_the_readers_digest_or_claims_for_the_truth() -> None:
    # the reader's own digest field and its integrity events say all is well: the checksums decide
    wrong = {"model.layers.0.weight": "aaaa000000000001", "model.layers.9.weight": "aaaa000000000002"}
    rows = [*BASE, (1.9, "info", "reader-1", "integrity", {"ok": True}), VERIFIED, digest(2.1, "loaded", wrong)]
    result = judge_integrity({}, rows)
    assert result.valid is False
    assert "model.layers.1.weight (missing), model.layers.9.weight (not in the model)" in result.summary


def test_integrity_catches_a_digest_over_other_dtypes_or_shapes_with_the_same_checksums() -> None:
    other = ExpectedModel("x", tuple(ExpectedTensor(t.name, "int8", (8,), t.checksum) for t in MODEL.tensors))
    result = judge_integrity({}, [*BASE, VERIFIED, digest(2.1, "loaded", HONEST, claims=other.digest())])
    assert result.valid is False
    assert f"digest {other.digest()} (the model's: {MODEL.digest()}; dtype or shape differ)" in result.summary


def test_integrity_judges_the_last_digest_and_each_settled_or_exit_one() -> None:
    wrong = {**HONEST, "model.layers.0.weight": "ffff"}
    # an earlier "loaded" digest that is not the last is not judged ...
    assert judge_integrity({}, [*BASE, VERIFIED, digest(2.0, "loaded", wrong), digest(3.0, "exit", HONEST)]).valid is True
    # ... the last one always is
    assert judge_integrity({}, [*BASE, VERIFIED, digest(2.0, "loaded", wrong)]).valid is False


def test_integrity_is_unknown_for_a_reader_that_loaded_without_a_memory_digest() -> None:
    result = judge_integrity({}, [*BASE, VERIFIED])
    assert result.valid == "unknown"
    assert result.summary == (
        "reader-1 loaded (load_done at 2.000s) but reported no memory_digest for that load, "
        "so what it holds cannot be checked independently"
    )


def test_the_digest_a_reader_reports_just_before_load_done_counts_for_that_load() -> None:
    """mxref reports what it holds before it says it loaded (a reader that departs right after
    load_done has still told); a digest of another incarnation does not count."""
    before = (1.9, "info", "reader-1", "memory_digest", {"when": "loaded", "digest": MODEL.digest(), "checksums": HONEST, "incarnation": 1})
    load = (2.0, "info", "reader-1", "load_done", {"path": "rdma", "source": "source-1", "integrity": "verified", "incarnation": 1})
    assert judge_integrity({}, [*BASE, before, load]).valid is True
    stale = (1.9, "info", "reader-1", "memory_digest", {"when": "loaded", "digest": MODEL.digest(), "checksums": HONEST, "incarnation": 0})
    assert judge_integrity({}, [*BASE, stale, load]).valid == "unknown"


def test_integrity_fails_an_unverified_load_and_accepts_a_rejected_attempt() -> None:
    rejected = (1.5, "info", "reader-1", "integrity", {"ok": False, "bad": ["model.layers.0.weight"]})
    assert judge_integrity({}, [*BASE, rejected, VERIFIED, digest(2.1, "loaded", HONEST)]).valid is True
    unverified = (2.0, "info", "reader-1", "load_done", {"path": "disk", "integrity": "failed"})
    result = judge_integrity({}, [*BASE, unverified, digest(2.1, "loaded", HONEST)])
    assert (result.valid, result.summary) == (False, "reader-1 load_done at 2.000s: integrity 'failed', not verified")


def test_integrity_without_loads_is_unknown_unless_no_load_is_the_expected_outcome() -> None:
    failed = (2.0, "info", "reader-1", "load_failed", {"error": "checkpoint tampered"})
    assert judge_integrity({}, [*BASE, failed]).summary == "no reader loaded, nothing to verify"
    assert judge_integrity({}, [*BASE, failed]).valid == "unknown"
    result = judge_integrity({"require_load": False}, [*BASE, failed, digest(2.1, "exit", {})])
    assert (result.valid, result.summary) == (True, "no reader loaded, so none holds wrong bytes")
    # without the harness's model there is nothing to judge against
    loaded: list[tuple[Any, ...]] = [*BASE, VERIFIED]
    no_model = evaluate(0, "integrity", IntegrityParams(), History.build(loaded), ROLES)
    assert no_model.valid == "unknown"


def test_integrity_of_named_readers_only() -> None:
    wrong = {**HONEST, "model.layers.0.weight": "ffff"}
    rows = [*BASE, VERIFIED, digest(2.1, "loaded", HONEST), digest(2.2, "loaded", wrong, reader="reader-2")]
    assert judge_integrity({}, rows).valid is False  # reader-2 is not in the roles but reported a digest
    assert judge_integrity({"readers": ["reader-1"]}, rows).valid is True


STATUS = [
    *BASE,
    (2.0, "info", "source-1", "status_change", {"status": "STALE"}),
    (2.1, "info", "server", "source_status", {"worker_id": "w1", "status": "STALE"}),
    (3.0, "info", "source-1", "status_change", {"status": "READY"}),
    (3.4, "info", "server", "source_status", {"worker_id": "w1", "status": "READY"}),
]


def test_health_finds_the_transition_sequence_within_a_budget() -> None:
    ok = run("health", {"source": "source-1", "sequence": ["READY", "STALE", "READY"], "within": "3s"}, STATUS)
    assert (ok.valid, ok.summary) == (True, "source-1: READY -> STALE -> READY in 2.680s")
    slow = run("health", {"source": "source-1", "sequence": ["READY", "STALE", "READY"], "within": "1s"}, STATUS)
    assert (slow.valid, slow.summary) == (False, "source-1: READY -> STALE -> READY took 2.680s, budget 1s")
    server = run("health", {"source": "source-1", "sequence": ["STALE", "READY"], "view": "server"}, STATUS)
    assert (server.valid, server.summary) == (True, "source-1: STALE -> READY in 1.300s")
    missing = run("health", {"source": "source-1", "sequence": ["STALE", "STALE"]}, STATUS)
    assert (missing.valid, missing.summary) == (False, "source-1: expected STALE -> STALE, saw READY -> STALE -> READY")


def test_listed_reads_the_last_status_at_the_moment() -> None:
    rows = [*STATUS, (2.05, "info", "harness", "mark", {"mark": "mid"})]
    during = run("listed", {"at": {"mark": "mid"}, "after": "100ms", "not_ready": ["source-1"], "view": "server"}, rows)
    assert during.valid is True, during.summary
    after = run("listed", {"at": {"process": "server", "event": "source_status", "occurrence": "last"}, "ready": ["source-1"], "exact": True}, rows)
    assert after.valid is True, after.summary
    wrong = run("listed", {"at": {"mark": "mid"}, "after": "100ms", "ready": ["source-1"]}, rows)
    assert (wrong.valid, wrong.summary) == (False, "at 2.150s: source-1 is STALE, expected READY")
    nobody = run("listed", {"at": {"mark": "mid"}, "ready": ["source-2"]}, rows)
    assert nobody.valid == "unknown"


def test_listed_cannot_judge_a_moment_after_the_last_step() -> None:
    """The teardown stops every source (STALE): a moment past its start judges the harness's
    teardown, not the scenario, so it is unknown and says why, never a false FAIL."""
    rows = [*STATUS, (2.05, "info", "harness", "mark", {"mark": "mid"}), (2.12, "info", "harness", "teardown", {})]
    late = run("listed", {"at": {"mark": "mid"}, "after": "100ms", "not_ready": ["source-1"], "view": "server"}, rows)
    assert late.valid == "unknown"
    assert late.summary.startswith("at 2.150s the run was tearing down (from 2.120s")
    before = run("listed", {"at": {"mark": "mid"}, "after": "60ms", "not_ready": ["source-1"], "view": "server"}, rows)
    assert before.valid is True, before.summary


def test_listed_source_view_counts_an_exited_source_as_not_ready() -> None:
    rows = [*BASE, (2.0, "info", "source-1", "process_exit", {"incarnation": 1, "rc": -9}), (2.5, "info", "harness", "mark", {"mark": "m"})]
    result = run("listed", {"at": {"mark": "m"}, "not_ready": ["source-1"], "view": "source"}, rows)
    assert result.valid is True
    assert result.details["status"]["source-1"] == "EXITED"


def scrape(t: float, process: str, samples: list[list[Any]]) -> tuple[Any, ...]:
    return (t, "info", process, "scrape", {"ok": True, "samples": samples})


def test_metric_sums_label_subsets_and_picks_scrapes() -> None:
    rows = [
        scrape(1.0, "reader-1", [["mxref_loads_total", {"path": "rdma", "integrity": "ok"}, 0.0]]),
        scrape(2.0, "reader-1", [
            ["mxref_loads_total", {"path": "rdma", "integrity": "ok"}, 1.0],
            ["mxref_loads_total", {"path": "rdma", "integrity": "bad"}, 1.0],
            ["mxref_loads_total", {"path": "disk", "integrity": "ok"}, 5.0],
        ]),
    ]
    base = {"process": "reader-1", "metric": "mxref_loads_total", "labels": {"path": "rdma"}}
    assert run("metric", {**base, "op": "==", "value": 2}, rows).valid is True
    assert run("metric", {**base, "op": "==", "value": 0, "when": "any"}, rows).valid is True
    failed = run("metric", {**base, "op": ">=", "value": 1, "when": "all"}, rows)
    assert (failed.valid, failed.summary) == (False, "reader-1: mxref_loads_total >= 1 failed at 1.000s (value 0)")
    absent = run("metric", {"process": "reader-1", "metric": "nope_total", "value": 0}, rows)
    assert (absent.valid, absent.summary) == (False, "reader-1: nope_total == 0 failed at 2.000s (value absent)")
    assert run("metric", {"process": "reader-1", "metric": "nope_total", "value": 0, "default": 0}, rows).valid is True
    assert run("metric", {**base, "process": "server", "value": 1}, rows).valid == "unknown"


def test_exit_codes_use_the_last_incarnation() -> None:
    rows = [
        (0.1, "ok", "reader-1", "start", {"incarnation": 1, "pid": 5}),
        (0.5, "info", "reader-1", "process_exit", {"incarnation": 1, "rc": -9}),
        (0.6, "ok", "reader-1", "start", {"incarnation": 2, "pid": 6}),
        (0.9, "info", "reader-1", "process_exit", {"incarnation": 2, "rc": 0}),
        (0.1, "ok", "source-1", "start", {"incarnation": 1, "pid": 7}),
        (2.0, "info", "source-1", "process_exit", {"incarnation": 1, "rc": -15, "stopped_by_harness": True}),
    ]
    ok = run("exit_codes", {"expect": {"reader-1": 0, "source-1": [0, "TERM"]}}, rows)
    assert (ok.valid, ok.summary) == (True, "reader-1=0, source-1=-15")
    by_itself = run("exit_codes", {"expect": {"source-1": "any"}, "by_itself": ["source-1"]}, rows)
    assert (by_itself.valid, by_itself.summary) == (False, "source-1 was still running when the harness stopped it")
    wrong = run("exit_codes", {"expect": {"reader-1": "KILL"}}, rows)
    assert (wrong.valid, wrong.summary) == (False, "reader-1 exited 0, expected -9")
    never = run("exit_codes", {"expect": {"server": 0}}, rows)
    assert (never.valid, never.summary) == (False, "server never started")
    running = run("exit_codes", {"expect": {"source-1": 0}}, rows[:5])
    assert running.valid == "unknown"


def test_ordering_and_count() -> None:
    rows = [*BASE, *FAULT, (3.0, "info", "reader-1", "load_done", {"path": "disk"})]
    order = {"events": [{"process": "source-1", "event": "agent_ready"}, {"fault": "freeze"}, {"process": "reader-1", "event": "load_done"}]}
    assert run("ordering", order, rows).valid is True
    backwards = {"events": [{"process": "reader-1", "event": "load_done"}, {"fault": "freeze"}]}
    result = run("ordering", backwards, rows)
    assert (result.valid, result.summary) == (False, "fault freeze (1.500s) is not after reader-1 load_done (3.000s)")
    missing = run("ordering", {"events": [{"fault": "freeze"}, {"mark": "never"}]}, rows)
    assert (missing.valid, missing.summary) == (False, "never happened: mark never")
    assert run("count", {"process": "reader-1", "event": "fallback", "max": 0}, rows).valid is True
    too_few = run("count", {"process": "source-1", "event": "heartbeat", "min": 1}, rows)
    assert (too_few.valid, too_few.summary) == (False, "source-1 heartbeat: 0, expected at least 1")
    with pytest.raises(ValueError, match="give min, max or both"):
        CountParams.model_validate({"process": "p", "event": "e"})


def test_count_contains_matches_a_substring_of_a_field() -> None:
    error = "ListSources to metadata server 127.0.0.1:1 failed: UNAVAILABLE: ... Connection refused"
    rows = [
        *BASE,
        (1.2, "info", "reader-1", "candidates", {"listed": 0, "error": error}),
        (1.3, "info", "reader-1", "candidates", {"listed": 1}),
    ]
    refused = {"process": "reader-1", "event": "candidates", "contains": {"error": "Connection refused"}}
    assert run("count", {**refused, "min": 1, "max": 1}, rows).valid is True
    deadline = {**refused, "contains": {"error": "DEADLINE_EXCEEDED"}, "min": 1}
    assert run("count", deadline, rows).summary == "reader-1 candidates: 0, expected at least 1"
    both = {**refused, "where": {"listed": 0}, "contains": {"error": "UNAVAILABLE", "listed": "0"}, "min": 1, "max": 1}
    assert run("count", both, rows).valid is True  # where and contains together; a number is matched as its text


def test_count_matches_a_regular_expression_in_a_field() -> None:
    stall = "READ stalled: no chunk completed for {} ({} of 33 chunks done, no error status from NIXL)"
    rule = {"process": "reader-1", "event": "transfer_timeout", "min": 1, "max": 1,
            "matches": {"error": r"no chunk completed for (0\.75s \(0 of|0\.84s \([1-9][0-9]* of)"}}
    for deadline, done, valid in (("0.75s", 0, True), ("0.84s", 12, True), ("0.84s", 0, False), ("0.75s", 3, False),
                                  ("15.04s", 0, False)):
        rows = [*BASE, (1.2, "info", "reader-1", "transfer_timeout", {"error": stall.format(deadline, done)})]
        assert run("count", rule, rows).valid is valid, (deadline, done)
    no_field = [*BASE, (1.2, "info", "reader-1", "transfer_timeout", {"seconds": 0.75})]
    assert run("count", rule, no_field).summary == "reader-1 transfer_timeout: 0, expected at least 1"
    with pytest.raises(ValueError, match=r"matches.error: '\(0 of' is not a regular expression"):
        CountParams.model_validate({"process": "p", "event": "e", "min": 1, "matches": {"error": "(0 of"}})


def test_nothing_leaked_reads_the_leak_scan() -> None:
    assert run("nothing_leaked", {}, BASE).valid == "unknown"
    clean = [*BASE, (5.0, "info", "harness", "leak_scan", {"processes": [], "ports": [], "checked_ports": [1, 2]})]
    assert run("nothing_leaked", {}, clean).summary == "no process left, 2 reported port(s) closed"
    dirty = [*BASE, (5.0, "info", "harness", "leak_scan", {"processes": [{"pid": 9}], "ports": [4444], "checked_ports": [4444]})]
    result = run("nothing_leaked", {}, dirty)
    assert (result.valid, result.summary) == (False, "1 process(es) alive: pid 9 (?); ports still open: 4444")
    reused = [*BASE, (5.0, "info", "harness", "leak_scan", {"processes": [], "ports": [], "checked_ports": [1, 2],
                                                            "reused_ports": [{"port": 2, "by": [{"pid": 7, "run_id": "r2"}]}]})]
    result = run("nothing_leaked", {}, reused)  # free again after the run, and taken since by a run beside it
    assert (result.valid, result.summary) == (True, "no process left, 2 reported port(s) closed (1 of them since taken by another run: 2)")
    child = {"pid": 12, "proc": "store", "cmdline": "redis-server 127.0.0.1:6379"}  # a wrapper's child, named after it
    result = run("nothing_leaked", {}, [*BASE, (5.0, "info", "harness", "leak_scan", {"processes": [child], "ports": []})])
    assert (result.valid, result.summary) == (False, "1 process(es) alive: pid 12 (store: redis-server 127.0.0.1:6379)")


def test_every_registered_check_has_params_and_a_docstring() -> None:
    expected = {
        "loaded": LoadedParams,
        "fell_back": FellBackParams,
        "integrity": IntegrityParams,
        "health": HealthParams,
        "listed": ListedParams,
        "metric": MetricCheckParams,
        "exit_codes": ExitCodesParams,
        "ordering": OrderingParams,
        "count": CountParams,
        "nothing_leaked": NothingLeakedParams,
    }
    assert {k: checks.REGISTRY[k].params for k in expected} == expected
    assert all(d.doc for d in checks.REGISTRY.values())


OBSERVED = [
    *BASE,
    (0.11, "ok", "source-2", "start", {"incarnation": 1, "pid": 101}),
    (0.35, "info", "source-2", "published", {"worker_id": "w2", "mx_source_id": "m"}),
    (0.36, "info", "source-2", "status_change", {"status": "READY"}),
    (0.40, "info", "server", "source_status", {"worker_id": "w1", "status": "READY"}),
    (0.41, "info", "server", "source_status", {"worker_id": "w2", "status": "READY"}),
    (1.90, "info", "server", "observed", {"ok": True, "offered": [{"worker_id": "w2", "metadata": True},
                                                                   {"worker_id": "w1", "metadata": False}]}),
    (2.00, "info", "harness", "mark", {"mark": "m"}),
]


def test_listed_client_view_judges_what_the_observer_was_offered_not_the_stored_status() -> None:
    at = {"at": {"mark": "m"}}
    assert run("listed", {**at, "ready": ["source-1", "source-2"], "view": "server"}, OBSERVED).valid is True
    seen = run("listed", {**at, "ready": ["source-2"], "not_ready": ["source-1"], "view": "client"}, OBSERVED)
    assert seen.valid is True, seen.summary
    assert seen.details["status"]["source-1"] == "LISTED_NO_METADATA"
    wrong = run("listed", {**at, "ready": ["source-1"], "view": "client"}, OBSERVED)
    assert wrong.valid is False and "source-1 is LISTED_NO_METADATA" in wrong.summary


def test_listed_client_view_is_unknown_without_a_recent_observation() -> None:
    rows = [r for r in OBSERVED if r[3] != "observed"]
    assert run("listed", {"at": {"mark": "m"}, "ready": ["source-2"], "view": "client"}, rows).valid == "unknown"
