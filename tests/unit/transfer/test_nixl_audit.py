"""The NIXL resource audit (``mxref.audit``) and the check that judges it (``nixl_balance``).

A planted leak (a stalled chunked READ whose in-flight handles are never released) shows as
``handles_open`` on the failure and as an open balance when the agent is dropped; the same READ
with the shipped code balances to zero.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fixtures.chunk_agent import MIB, ChunkAgent, manager
from prometheus_client import CollectorRegistry

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.record.timeline import History
from mxref.audit import AuditedAgent, NixlAudit
from mxref.errors import TransferStalled
from mxref.events import EventLog
from mxref.metrics import NixlFamilies
from mxref.transfer.chunked import ChunkPolicy


class PeerAgent(ChunkAgent):
    def register_memory(self, descs: Any, mem: str) -> Any:
        return ("reg", len(descs))

    def deregister_memory(self, reg: Any) -> None:
        pass

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return b"src"

    def remove_remote_agent(self, name: str) -> None:
        pass


class LeakyAgent(PeerAgent):
    """The planted leak: a stalled READ's in-flight handles are never given back to NIXL (the
    release fails; ``tests/mutants/leak_handle_after_stall.diff`` plants it in the code instead)."""

    def release_xfer_handle(self, handle: int) -> None:
        if handle >= self.complete:
            raise RuntimeError("planted leak: handle not released")
        self.released.append(handle)


STALL = ChunkPolicy(chunk_bytes=4 * MIB, slack_s=0.05, floor_bps=1e9)


def _stalled_read(raw: ChunkAgent, tmp_path: Any) -> tuple[NixlAudit, list[dict[str, Any]], NixlFamilies]:
    families = NixlFamilies(CollectorRegistry())
    mgr, remote = manager(raw)
    log = tmp_path / "events.jsonl"
    mgr._events = EventLog(log, "reader-1", "reader")
    mgr.audit = NixlAudit(families)
    mgr._agent = AuditedAgent(raw, mgr.audit)
    mgr._registered_memory.append(mgr._agent.register_memory([(1, 2, 0)], "DRAM"))
    mgr.add_remote_agent(b"md")
    with pytest.raises(TransferStalled):
        mgr.receive_from_source(b"", remote, 5.0, "src", chunks=STALL)
    mgr._events.emit("transfer_timeout", index=0, stalled=True, **mgr.audit.open_fields())
    mgr.shutdown()
    return mgr.audit, [json.loads(line) for line in log.read_text().splitlines()], families


def test_a_stalled_read_that_releases_everything_balances_to_zero(tmp_path: Any) -> None:
    audit, events, families = _stalled_read(PeerAgent(complete=1), tmp_path)
    assert audit.made["handles"] >= 2 and audit.made["dlists"] == 2
    assert audit.open() == {"handles": 0, "dlists": 0, "registrations": 0, "remote_agents": 0}
    (balance,) = [e for e in events if e["event"] == "nixl_audit"]
    assert balance["balanced"] is True and balance["agent_name"] == "rd"
    for resource in ("handles", "dlists", "registrations", "remote_agents"):
        assert families.resources_open.labels(resource)._value.get() == 0


def test_a_planted_handle_leak_shows_on_the_failure_and_in_the_balance(tmp_path: Any) -> None:
    audit, events, families = _stalled_read(LeakyAgent(complete=1), tmp_path)
    (timeout,) = [e for e in events if e["event"] == "transfer_timeout"]
    assert timeout["handles_open"] > 0
    (balance,) = [e for e in events if e["event"] == "nixl_audit"]
    assert balance["open"]["handles"] == audit.open()["handles"] > 0 and balance["balanced"] is False
    assert families.resources_open.labels("handles")._value.get() > 0
    rows = [(1.0, "ok", "reader-1", "start", {"incarnation": 1, "pid": 1})]
    rows += [(2.0 + i, "info", "reader-1", e["event"], e) for i, e in enumerate(events)]
    result = _judge({}, rows)
    assert result.valid is False and "handles" in result.summary


def test_a_failed_release_counts_nothing_and_a_peer_loaded_twice_is_one() -> None:
    audit = NixlAudit()
    agent = AuditedAgent(LeakyAgent(), audit)
    assert agent.transfer(7) == "PROC"  # what the audit does not count passes through
    agent.add_remote_agent(b"x")
    agent.add_remote_agent(b"x")
    assert audit.open()["remote_agents"] == 1
    agent.remove_remote_agent("src")
    agent.remove_remote_agent("src")  # again: harmless, counted once
    assert audit.balance()["released"]["remote_agents"] == 1 and audit.balance()["balanced"]


ROLES = RunFacts(roles={"reader-1": "reader", "source-1": "source"})


def _judge(params: dict[str, Any], rows: list[tuple[Any, ...]]) -> checks.NamedResult:
    definition = checks.REGISTRY["nixl_balance"]
    return evaluate(0, "nixl_balance", definition.params.model_validate(params), History.build(rows), ROLES)


ZERO = {"handles": 0, "dlists": 0, "registrations": 0, "remote_agents": 0}


def test_balance_passes_when_every_failure_is_followed_by_a_zero_balance() -> None:
    rows = [
        (1.0, "info", "reader-1", "transfer_timeout", {"handles_open": 0, "dlists_open": 0, "stalled": True}),
        (1.1, "info", "reader-1", "nixl_audit", {"agent_name": "a", "open": ZERO}),
        (2.0, "info", "reader-1", "nixl_audit", {"agent_name": "a.1", "open": ZERO}),
    ]
    result = _judge({}, rows)
    assert result.valid is True, result.summary


def test_balance_fails_on_an_undisconnected_peer_and_on_a_failure_never_balanced() -> None:
    leak: dict[str, Any] = {"agent_name": "a", "open": {**ZERO, "remote_agents": 1}}
    rows: list[tuple[Any, ...]] = [(1.0, "info", "reader-1", "nixl_audit", leak)]
    assert _judge({}, rows).valid is False
    rows = [(1.0, "info", "reader-1", "transfer_error", {"handles_open": 0})]
    result = _judge({}, rows)
    assert result.valid is False and "no balance" in result.summary


def test_balance_is_unknown_without_any_dropped_agent() -> None:
    assert _judge({}, []).valid == "unknown"


def test_only_the_processes_mxref_plays_are_judged() -> None:
    """ModelExpress's client reports no audit: its reader is named as not observed, never failed;
    an mxref reader beside it is still judged."""
    definition = checks.REGISTRY["nixl_balance"]
    facts = RunFacts(roles={"reader-1": "reader", "reader-2": "reader"},
                     players={"reader-1": "modelexpress", "reader-2": "mxref"})
    leak: dict[str, Any] = {"agent_name": "b", "open": {**ZERO, "handles": 1}}
    judged = evaluate(0, "nixl_balance", definition.params.model_validate({}),
                      History.build([(1.0, "info", "reader-2", "nixl_audit", leak)]), facts)
    assert judged.valid is False and "reader-2" in judged.summary
    assert judged.details["not_audited"] == {"reader-1": "modelexpress"}
    alone = RunFacts(roles={"reader-1": "reader"}, players={"reader-1": "modelexpress"})
    unobserved = evaluate(0, "nixl_balance", definition.params.model_validate({}), History.build([]), alone)
    assert unobserved.valid is True and unobserved.summary.startswith("not observable: reader-1 (played by modelexpress)")
