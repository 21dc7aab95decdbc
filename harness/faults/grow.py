"""A source's model grows after publishing: the ``grow`` fault (ModelExpress 0.8's republish).

A source started with ``options: {debug_hooks: true, grow_tensors: N}`` takes SIGHUP as a refit
whose write adds N tensors: their memory is registered first, then the manifest is swapped for
the grown one and republished under the same identity (``manifest_grown``). ``grow`` sends the
SIGHUP to the source process only and waits, bounded by ``confirm``, for ``manifest_grown``. A
refit drains the source's tensor read leases first (bounded by its ``drain_timeout``), so a
reader holding one finishes on the manifest it was granted. Nothing to heal: the model stays grown.

Its witness: the ``manifest_grown`` the timeline received from the incarnation it signalled (how
many tensors it added, and the manifest's size after), and the target still running after it. A
growth that never began (no ``manifest_grown`` within ``confirm``) fails its step with a witness of
no effect, as a drain's does (``harness.faults.drain.signal_refit``: where the SIGHUP went), so the
run is NOT EXERCISED with the failed step named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from harness.faults import Fault, FaultContext, Injected, register
from harness.faults.corrupt import hooked_source_issues
from harness.faults.drain import RefitSpec, signal_refit
from harness.record.witness import Witness

__all__ = ["Grow", "GrowSpec", "grow_witness"]

EVENT = "manifest_grown"


class GrowSpec(RefitSpec):
    """Ask a source (``options: {debug_hooks: true, grow_tensors: N}``) to add N tensors and
    republish its grown manifest. ``confirm``: how long to wait for ``manifest_grown``."""

    kind: Literal["grow"]

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        issues = hooked_source_issues("grow", self.target, processes, "grows a source's model",
                                      "asks a source's refit")
        spec = processes.get(self.target) if isinstance(self.target, str) else None
        if not issues and spec is not None and not getattr(getattr(spec, "options", None), "grow_tensors", None):
            issues = (("target", f"a grow fault adds the tensors of the source's `grow_tensors` option, and "
                       f"{self.target!r} sets none (without it a refit rewrites the weights instead)"),)
        return issues


def grow_witness(target: str, pid: int, grown: Mapping[str, Any], alive: bool | None) -> Witness:
    """What the growth did: the tensors the source added (``grown``, the event the timeline received)."""
    added = grown.get("added")
    figures = {"pid": pid, "added": added, "tensors": grown.get("tensors"), "alive": alive}
    if alive is False:
        return Witness.none(f"{target} (pid {pid}) ended as its model grew", **figures)
    if not isinstance(added, int):
        return Witness.unwitnessed(f"{target}'s manifest_grown carries no count of added tensors", **figures)
    said = f"{target} (pid {pid}) republished its manifest with {added} tensor(s) added ({grown.get('tensors')} in all)"
    return (Witness.seen if added > 0 else Witness.none)(said, **figures)


@register
class Grow(Fault[GrowSpec, None]):
    kind = "grow"
    Spec = GrowSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        target = ctx.resolve(self.spec.target)
        pid, grown, _caught, alive = signal_refit(ctx, target, self.spec.confirm, EVENT, "growth")
        witness = grow_witness(target, pid, grown, alive)
        return Injected(None, {"target": target, "pid": pid, "signal": "SIGHUP", "added": grown.get("added"),
                               "tensors": grown.get("tensors"), "confirmed_t": grown.get("t"),
                               "witness": witness.to_json()})
