"""Which transport carried a process's READs: the ``transport`` check.

It judges the ``ucx_endpoints`` entries the runner records when a process exits
(``harness.record.ucxlog``: the endpoint configurations UCX logged with ``UCX_LOG_LEVEL=info``): for
each endpoint to a peer (``intra-node`` or ``inter-node``; a worker's ``self`` loopback is left
out), the transports of its READ lanes (``rma``, else ``rma_am``). A silent fallback (a backend
meant for RDMA running over TCP, a same-host run that picked shared memory where the scenario
meant TCP) shows here, whatever the process itself reports.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field, model_validator

from harness.checks import CheckParams, CheckResult, RunFacts, register
from harness.record import ucxlog
from harness.record.timeline import History
from harness.spec import Name, custom_error

__all__ = ["TransportParams", "transport"]


class TransportParams(CheckParams):
    """Every READ lane of ``process``'s peer endpoints runs over transports in ``allow`` (UCX
    names: ``tcp``, ``rc_mlx5``, ``dc_mlx5``, ``cma``, ``posix`` ...) and none in ``forbid``; the
    process must run with ``env: {UCX_LOG_LEVEL: info}`` (no endpoint logged: unknown)."""

    process: Name
    allow: tuple[str, ...] = Field((), max_length=32)
    forbid: tuple[str, ...] = Field((), max_length=32)

    @model_validator(mode="after")
    def _something(self) -> TransportParams:
        if not self.allow and not self.forbid:
            raise custom_error("allow", "give allow (the transports a READ may use), forbid, or both")
        both = sorted(set(self.allow) & set(self.forbid))
        if both:
            raise custom_error("forbid", f"{', '.join(both)} both allowed and forbidden")
        return self

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "process", self.process, ("reader", "source")

    def label(self, kind: str) -> str:
        rule = " ".join(filter(None, [f"over {'|'.join(self.allow)}" if self.allow else "",
                                      f"never {'|'.join(self.forbid)}" if self.forbid else ""]))
        return self.name or f"transport({self.process} {rule})"


@register("transport", TransportParams)
def transport(p: TransportParams, h: History, run: RunFacts) -> CheckResult:
    """The transports UCX built for a process's READs, as its own log says, against allow/forbid."""
    peers = [(e.t, ep) for e in h.select(actor=p.process, f="ucx_endpoints")
             for ep in e.value.get("endpoints", []) if ep.get("scope") != "self"]
    if not peers:
        return CheckResult("unknown", f"{p.process}: UCX logged no endpoint to a peer (start it with "
                           "env: {UCX_LOG_LEVEL: info}; a process that never connected has none)")
    used = sorted({tl for _t, ep in peers for tl in ucxlog.read_transports(ep)})
    details = {"endpoints": [{"worker": ep["worker"], "scope": ep["scope"], "read": ucxlog.read_transports(ep)}
                             for _t, ep in peers], "used": used}
    wrong = [tl for tl in used if (p.allow and tl not in p.allow) or tl in p.forbid]
    if wrong:
        return CheckResult(False, f"{p.process}: READ lanes over {', '.join(wrong)} "
                           f"({len(peers)} peer endpoint(s); used {', '.join(used)})", details)
    if not used:
        return CheckResult(False, f"{p.process}: {len(peers)} peer endpoint(s) with no READ lane (no rma, no rma_am)",
                           details)
    return CheckResult(True, f"{p.process}: READs over {', '.join(used)} ({len(peers)} peer endpoint(s))", details)
