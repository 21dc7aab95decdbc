"""``one_generation``: each reader holds one generation of a grown model whole, judged on
hand-built histories against two generations given as the harness's own (never a reader's word)."""

from __future__ import annotations

from typing import Any

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.errors import HarnessError
from harness.record.expected import ExpectedModel, ExpectedTensor
from harness.record.timeline import History

OLD = ExpectedModel("old", tuple(ExpectedTensor(f"t.{i}", "uint8", (4,), f"{i:016x}") for i in range(2)))
NEW = ExpectedModel("new", (*OLD.tensors, *(ExpectedTensor(f"t.{i}", "uint8", (4,), f"{i:016x}") for i in range(2, 4))))


def grown(added: int) -> ExpectedModel:
    assert added == 2
    return NEW


FACTS = RunFacts(roles={"source-1": "source", "r1": "reader", "r2": "reader"}, expected=lambda: OLD, grown=grown)


def run(rows: list[tuple[Any, ...]], facts: RunFacts = FACTS, **params: Any) -> checks.NamedResult:
    definition = checks.REGISTRY["one_generation"]
    return evaluate(0, "one_generation", definition.params.model_validate({"added": 2, **params}),
                    History.build(rows), facts)


def held(t: float, reader: str, model: ExpectedModel, when: str = "exit", **changed: str) -> tuple[Any, ...]:
    sums = {**model.checksums(), **changed}
    return (t, "info", reader, "memory_digest", {"incarnation": 1, "when": when, "checksums": sums})


def loaded(t: float, reader: str) -> tuple[Any, ...]:
    return (t, "info", reader, "load_done", {"incarnation": 1, "path": "rdma", "integrity": "verified"})


def test_each_reader_on_one_generation_passes_and_says_which() -> None:
    result = run([loaded(1, "r1"), held(1.1, "r1", OLD), loaded(2, "r2"), held(2.1, "r2", NEW)], seen=("old", "new"))
    assert result.valid is True, result.summary
    assert result.details["ended"] == {"r1": "old", "r2": "new"}


def test_the_grown_list_with_an_added_tensor_unread_is_a_mix() -> None:
    result = run([loaded(1, "r1"), held(1.1, "r1", NEW, **{"t.3": "0" * 16})])
    assert result.valid is False
    assert "r1 holds neither generation" in result.summary and "t.3" in result.summary


def test_old_names_with_a_byte_of_another_generation_is_neither() -> None:
    result = run([loaded(1, "r1"), held(1.1, "r1", OLD, **{"t.1": "f" * 16})])
    assert result.valid is False


def test_a_generation_the_staging_promised_and_no_reader_reached_fails() -> None:
    result = run([loaded(1, "r1"), held(1.1, "r1", OLD)], seen=("old", "new"))
    assert result.valid is False and "new generation" in result.summary


def test_two_generations_in_one_incarnation_fail() -> None:
    result = run([loaded(1, "r1"), held(1.1, "r1", OLD, when="settled"), held(1.5, "r1", NEW, when="exit")])
    assert result.valid is False and "both generations" in result.summary


def test_a_load_without_a_memory_report_is_unknown() -> None:
    assert run([loaded(1, "r1")]).valid == "unknown"


def test_a_model_that_cannot_grow_is_unknown() -> None:
    def no_growth(added: int) -> ExpectedModel:
        raise HarnessError("model.file m.safetensors: a model file cannot grow")

    facts = RunFacts(roles=FACTS.roles, expected=lambda: OLD, grown=no_growth)
    result = run([loaded(1, "r1"), held(1.1, "r1", OLD)], facts)
    assert result.valid == "unknown" and "cannot grow" in result.summary
