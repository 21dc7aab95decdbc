"""A manifest that grew while readers pulled: the ``one_generation`` check.

A source that adds tensors after publishing (ModelExpress 0.8's republish; mxref's source with
``grow_tensors``) serves two generations of one model under one identity: the old one (the
scenario's model) and the grown one (it and ``added`` more tensors, the generator's next ones).
Whatever a reader saw, it must end holding exactly one of them: the tensor set *and* every
tensor's bytes of the same generation. Both generations are computed by the harness itself
(``RunFacts.expected`` and ``RunFacts.grown``); what a reader holds is the checksums of its
``memory_digest`` events (its last one, and each ``settled`` / ``exit`` one), never its verdict
on its own load. A reader holding the grown tensor list with an old-generation (or unread) tensor
among the added ones, or the old list with the grown bytes, holds neither: a mix. The generations
one incarnation reports must also agree. ``seen``: generations that at least one judged reader
must end with (what the staging promised to exercise: a reader before the growth, one after).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field

from harness.checks import CheckParams, CheckResult, RunFacts, register
from harness.checks.integrity import JUDGED_WHEN, differing
from harness.errors import HarnessError
from harness.record.expected import ExpectedModel
from harness.record.timeline import History
from harness.spec import Name

__all__ = ["OneGenerationParams", "one_generation"]

Generation = Literal["old", "new"]


class OneGenerationParams(CheckParams):
    """Each of ``readers`` (default: every reader that loaded or reported memory) ends holding the
    old model or the model grown by ``added`` tensors, whole, never a mix (module docstring)."""

    added: int = Field(ge=1, le=4096)
    readers: tuple[Name, ...] | None = None
    seen: tuple[Generation, ...] = ()

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for i, reader in enumerate(self.readers or ()):
            yield f"readers[{i}]", reader, ("reader",)

    def label(self, kind: str) -> str:
        return self.name or f"one_generation(+{self.added})"


def _which(models: Mapping[Generation, ExpectedModel], sums: Mapping[str, Any], digest: Any) -> tuple[Generation | None, str]:
    """The generation ``sums`` (and its reported digest) is, or None with what differs from each."""
    why: list[str] = []
    for gen, model in models.items():
        diff = differing(model.checksums(), sums)
        if not diff and digest is not None and str(digest).lower() != model.digest():
            diff = [f"digest {digest} (the {gen} generation's: {model.digest()})"]
        if not diff:
            return gen, ""
        shown = ", ".join(diff[:4]) + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")
        why.append(f"against the {gen} generation ({len(model.tensors)} tensors) {len(diff)} differ: {shown}")
    return None, "; ".join(why)


@register("one_generation", OneGenerationParams)
def one_generation(p: OneGenerationParams, h: History, run: RunFacts) -> CheckResult:
    """Each reader's memory against both generations, as the harness computes them."""
    if run.expected is None or run.grown is None:
        return CheckResult("unknown", "no expected content to judge against (no scenario model in the run facts)")
    try:
        models: dict[Generation, ExpectedModel] = {"old": run.expected(), "new": run.grown(p.added)}
    except HarnessError as exc:
        return CheckResult("unknown", str(exc))
    names = list(p.readers or ())
    if not names:
        seen_actors = {e.actor for e in h.select(f=("load_done", "memory_digest"))}
        names = sorted(set(run.processes("reader")) & seen_actors | (seen_actors - set(run.roles)))
    bad: list[str] = []
    unknown: list[str] = []
    ended: dict[str, Generation] = {}
    marks: list[tuple[float, str]] = []
    for reader in names:
        digests = h.select(actor=reader, f="memory_digest")
        loads = h.select(actor=reader, f="load_done")
        if loads and not digests:
            unknown.append(f"{reader} loaded but reported no memory_digest, so what it holds cannot be judged")
            continue
        judged = [d for d in digests[:-1] if d.get("when") in JUDGED_WHEN] + digests[-1:]
        per_incarnation: dict[Any, set[Generation]] = {}
        for d in judged:
            sums = d.get("checksums")
            if not isinstance(sums, Mapping):
                unknown.append(f"{reader} memory_digest ({d.get('when')}) at {d.t:.3f}s carries no checksums")
                continue
            if not sums and not loads:
                continue  # it holds nothing, and claimed nothing
            gen, why = _which(models, sums, d.get("digest"))
            if gen is None:
                bad.append(f"{reader} holds neither generation ({d.get('when')}, {d.t:.3f}s, {len(sums)} tensors): {why}")
                marks.append((d.t, f"{reader} a mix"))
                continue
            per_incarnation.setdefault(d.get("incarnation"), set()).add(gen)
            ended[reader] = gen
        for incarnation, gens in per_incarnation.items():
            if len(gens) > 1:
                bad.append(f"{reader} (incarnation {incarnation}) reported both generations in turn: its memory changed under it")
    details = {"generations": {g: {"tensors": len(m.tensors), "digest": m.digest(), "origin": m.origin}
                               for g, m in models.items()},
               "ended": ended, "bad": bad, "unknown": unknown}
    missing = [g for g in p.seen if g not in ended.values()]
    if missing and not bad:
        bad.append(f"no reader ended with the {' or '.join(missing)} generation (seen: {list(p.seen)}; "
                   f"ended: {ended or 'none'}): the growth was not exercised as staged")
    if bad:
        return CheckResult(False, "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""),
                           details, tuple(marks))
    if unknown or not ended:
        return CheckResult("unknown", "; ".join(unknown[:3]) or "no reader holds a model to judge", details)
    counts = {g: sorted(r for r, e in ended.items() if e == g) for g in models}
    return CheckResult(True, "each reader holds one whole generation: "
                       + "; ".join(f"{g}: {', '.join(rs) or 'none'}" for g, rs in counts.items()), details)
