"""The ``spread`` check on hand-built storms: the readers' verified loads counted per source
against the bound, and every way a reader can fail to count."""

from __future__ import annotations

from typing import Any

import pytest

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.record.timeline import History

READERS = [f"reader-{i}" for i in range(1, 5)]
FACTS = RunFacts(roles={"source-1": "source", "source-2": "source", **{r: "reader" for r in READERS}})
SOURCES = [
    (0.30, "info", "source-1", "agent_ready", {"agent_name": "source-1-ab12"}),
    (0.31, "info", "source-2", "agent_ready", {"agent_name": "source-2-cd34"}),
]


def run(params: dict[str, Any], loads: dict[str, dict[str, Any]]) -> checks.NamedResult:
    rows = [*SOURCES] + [(1.0 + i, "info", r, "load_done", load) for i, (r, load) in enumerate(loads.items())]
    definition = checks.REGISTRY["spread"]
    return evaluate(0, "spread", definition.params.model_validate(params), History.build(rows), FACTS)


def rdma(agent: str) -> dict[str, Any]:
    return {"path": "rdma", "source": agent, "integrity": "verified"}


PARAMS = {"readers": READERS, "sources": ["source-1", "source-2"]}


def test_an_even_spread_passes_and_names_the_counts() -> None:
    result = run(PARAMS, dict(zip(READERS, map(rdma, ["source-1-ab12", "source-2-cd34"] * 2))))
    assert result.valid is True, result.summary
    assert result.summary == "served: source-1 2, source-2 2 (at most 3 each)"


def test_a_source_over_the_bound_fails() -> None:
    result = run(PARAMS, {r: rdma("source-1-ab12") for r in READERS})
    assert result.valid is False
    assert "source-1 served 4 loads, more than 3" in result.summary
    tight = run({**PARAMS, "at_most": 2}, dict(zip(READERS, map(rdma, ["source-1-ab12"] * 3 + ["source-2-cd34"]))))
    assert tight.valid is False and "source-1 served 3 loads, more than 2" in tight.summary


@pytest.mark.parametrize(("load", "why"), [
    (None, "reader-4: no load_done"),
    ({"path": "disk", "source": None, "integrity": "verified"}, "reader-4: path 'disk'"),
    ({"path": "rdma", "source": "source-2-cd34", "integrity": "failed"}, "integrity 'failed'"),
    (rdma("elsewhere-9"), "reader-4 loaded from 'elsewhere-9', none of source-1, source-2"),
])
def test_a_reader_that_did_not_load_from_a_named_source_fails(load: dict[str, Any] | None, why: str) -> None:
    loads = dict(zip(READERS[:3], map(rdma, ["source-1-ab12", "source-2-cd34", "source-1-ab12"])))
    if load is not None:
        loads["reader-4"] = load
    result = run(PARAMS, loads)
    assert result.valid is False and why in result.summary


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="readers: a name is given twice"):
        checks.REGISTRY["spread"].params.model_validate({"readers": ["reader-1", "reader-1"], "sources": ["source-1"]})
