"""No READ without a valid lease: the ``leased_reads`` check.

A reader that takes tensor read leases (mxref's ``--lease``) names on each ``transfer_start`` the
lease its READ is made under. The check takes only that name from the reader; whether the lease was
valid it reads from the sources' own records: the source that granted it (``lease_granted``, with
the lifetime it gave) must be the source whose NIXL agent (its ``agent_ready``) the READ is from, and
the lease must have been granted before the READ was posted and not have ended (``lease_returned``,
``lease_expired``, or its lifetime run out) before then, nor before the READ ended
(``transfer_done``, ``transfer_timeout``, ``transfer_error`` of that attempt; a reader killed mid-READ
has no end to judge).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field

from harness.checks import CheckParams, CheckResult, RunFacts, register
from harness.record.timeline import Entry, History
from harness.spec import Name

__all__ = ["LeasedReadsParams", "leased_reads"]

READ_ENDS = ("transfer_done", "transfer_timeout", "transfer_error")


class LeasedReadsParams(CheckParams):
    """Every READ of each of ``readers`` was posted, and ended, inside a live lease granted by the
    source it read from (module docstring); unknown when none of them posted a READ."""

    readers: tuple[Name, ...] = Field(min_length=1)

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for reader in self.readers:
            yield "readers", reader, ("reader",)

    def label(self, kind: str) -> str:
        return self.name or f"leased_reads({', '.join(self.readers)})"


@dataclass(frozen=True)
class _Grant:
    source: str
    t: float
    until: float  # when it ended: given back, noticed expired, or its lifetime out, whichever came first


def _grants(h: History) -> dict[str, _Grant]:
    """lease id -> its grant, as the sources recorded it."""
    ends: dict[str, float] = {}
    for e in h.select(f=("lease_returned", "lease_expired")):
        lease_id = str(e.get("lease_id"))
        ends[lease_id] = min(ends.get(lease_id, e.t), e.t)
    grants: dict[str, _Grant] = {}
    for e in h.select(f="lease_granted"):
        lease_id = str(e.get("lease_id"))
        lifetime = float(e.get("lifetime_s") or 0.0)
        grants.setdefault(lease_id, _Grant(e.actor, e.t, min(e.t + lifetime, ends.get(lease_id, e.t + lifetime))))
    return grants


def _read_end(h: History, start: Entry) -> Entry | None:
    """The end of the READ ``start`` posted: the next end event of its attempt, before another READ."""
    for e in h.select(actor=start.actor, f=("transfer_start", *READ_ENDS), since=start.t):
        if e.index <= start.index:
            continue
        if e.f == "transfer_start":
            return None
        if e.get("index") == start.get("index"):
            return e
    return None


def _judge(read: Entry, h: History, grants: dict[str, _Grant], agents: dict[str, str]) -> str | None:
    """Why this READ was not under a valid lease, or None."""
    what = f"{read.actor} READ #{read.get('index')} at {read.t:.3f}s"
    lease_id = read.get("lease_id")
    if not lease_id:
        return f"{what}: posted without a lease"
    grant = grants.get(str(lease_id))
    if grant is None:
        return f"{what}: lease {lease_id} was never granted by a source"
    source = agents.get(str(read.get("agent_name")))
    if source != grant.source:
        return (f"{what}: lease {lease_id} was granted by {grant.source}, but the READ is from agent "
                f"{read.get('agent_name')!r} ({source or 'no source of this run'})")
    if read.t < grant.t:
        return f"{what}: lease {lease_id} was granted only at {grant.t:.3f}s"
    if read.t >= grant.until:
        return f"{what}: lease {lease_id} had ended at {grant.until:.3f}s"
    end = _read_end(h, read)
    if end is not None and end.t > grant.until:
        return f"{what}: it ended ({end.f}) at {end.t:.3f}s, after lease {lease_id} ended at {grant.until:.3f}s"
    return None


@register("leased_reads", LeasedReadsParams)
def leased_reads(p: LeasedReadsParams, h: History, run: RunFacts) -> CheckResult:
    """Each READ of the readers against the grants the sources recorded."""
    grants = _grants(h)
    agents = {str(e.get("agent_name")): e.actor for e in h.select(f="agent_ready")}
    reads = [e for reader in p.readers for e in h.select(actor=reader, f="transfer_start")]
    details = {"reads": len(reads), "leases_granted": len(grants)}
    if not reads:
        return CheckResult("unknown", f"{', '.join(p.readers)}: no READ was posted (nothing to judge)", details)
    bad = [why for why in (_judge(read, h, grants, agents) for read in reads) if why is not None]
    if bad:
        return CheckResult(False, f"{len(bad)} of {len(reads)} READ(s) without a valid lease: {bad[0]}",
                           {**details, "bad": bad[:20]})
    return CheckResult(True, f"{len(reads)} READ(s), each under a live lease granted by the source it read from",
                       details)
