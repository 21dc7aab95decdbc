"""``throughput``: a reader's READ ran at least a stated fraction of a baseline reader's in the same run.

"It completed" is not "it recovered" (Mooncake #3596: after a link flap, transfers ran about 5x
slower until a restart): a load after a fault is judged against the same run's baseline load,
on the same hosts and links, so the machine's speed cancels out. Each side's throughput is its
last completed READ's (``transfer_done``: bytes over the READ's own seconds, not the load's
control-plane calls). ``within`` (with ``from``, default the reader's start): that READ ended at
most this long after it, so a recovery that takes minutes does not pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from harness.checks import CheckParams, CheckResult, RunFacts, ref_or_start, register
from harness.record.timeline import Entry, History
from harness.spec import Duration, Name, Ref, format_seconds

__all__ = ["ThroughputParams", "throughput"]


class ThroughputParams(CheckParams):
    """``reader``'s last completed READ ran at ``at_least`` x ``baseline``'s (another reader of
    the run) or faster, and ended ``within`` of ``from`` when given."""

    reader: Name
    baseline: Name
    at_least: float = Field(gt=0.0, le=1.0)
    within: Duration | None = None
    from_: Ref | None = Field(default=None, alias="from")

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "reader", self.reader, ("reader",)
        yield "baseline", self.baseline, ("reader",)

    def label(self, kind: str) -> str:
        return self.name or f"throughput({self.reader} >= {self.at_least:g} x {self.baseline})"


def _last_read(h: History, reader: str) -> Entry | None:
    done = [e for e in h.select(actor=reader, f="transfer_done") if isinstance(e.value.get("gbps"), int | float)]
    return done[-1] if done else None


@register("throughput", ThroughputParams)
def throughput(p: ThroughputParams, h: History, run: RunFacts) -> CheckResult:
    """Compares the ``gbps`` of each reader's last ``transfer_done``."""
    base, read = _last_read(h, p.baseline), _last_read(h, p.reader)
    if base is None or float(base.value["gbps"]) <= 0:
        return CheckResult("unknown", f"the baseline {p.baseline} completed no READ to compare with")
    if read is None:
        return CheckResult(False, f"{p.reader} completed no READ (baseline {p.baseline}: {base.value['gbps']:g} GB/s)")
    ratio = float(read.value["gbps"]) / float(base.value["gbps"])
    details = {"gbps": read.value["gbps"], "baseline_gbps": base.value["gbps"], "ratio": round(ratio, 3)}
    text = (f"{p.reader} READ at {read.value['gbps']:g} GB/s, {ratio:.2f} x {p.baseline}'s "
            f"{base.value['gbps']:g} GB/s (at least {p.at_least:g})")
    if ratio < p.at_least:
        return CheckResult(False, f"slower after recovery: {text}", details, marks=((read.t, "slow"),))
    if p.within is not None:
        t_ref, ref_text = ref_or_start(p.from_, h, p.reader)
        if t_ref is None:
            return CheckResult("unknown", f"reference point ({ref_text}) never happened", details)
        took = read.t - t_ref
        if took > p.within:
            return CheckResult(False, f"{text}, but {format_seconds(took)} after {ref_text} "
                               f"(within {format_seconds(p.within)})", details, marks=((read.t, "late"),))
        text += f", {format_seconds(took)} after {ref_text}"
    return CheckResult(True, text, details, marks=((read.t, "recovered"),))
