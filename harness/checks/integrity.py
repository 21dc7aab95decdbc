"""``integrity``: what every reader ended up holding is the scenario's model, judged independently.

The oracle is ``RunFacts.expected()``: the model as the harness computes it (``harness.judge.content``:
from the scenario's model flags with the generator's definition, or from the model file, hashed
by the harness). Nothing a peer says about the model is taken as the truth: what a reader
*reports holding* (the xxh3-64 checksums of its memory in its ``memory_digest`` events) is
compared with that, and what it *claims* (``load_done``'s ``integrity``) is only used to say
that a reader holding wrong bytes claimed they were verified.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.checks import CheckParams, CheckResult, RunFacts, register, truthy_integrity
from harness.record.timeline import Entry, History
from harness.spec import Name

__all__ = ["IntegrityParams", "differing", "integrity"]

JUDGED_WHEN = ("settled", "exit")  # besides the last one, every memory_digest of these is judged


class IntegrityParams(CheckParams):
    """What every reader (of ``readers``, default all) holds is the scenario's model as the
    harness computes it: the checksums of its ``memory_digest`` events (its last one, and each
    ``settled`` / ``exit`` one) match (and so does their digest, when they report one), and
    every ``load_done`` is verified. A reader that loaded
    but reported no ``memory_digest`` in that incarnation is "unknown". ``require_load``: no load at all is
    "unknown" (false: fine, e.g. when the only checkpoint is tampered and nothing may load)."""

    readers: tuple[Name, ...] | None = None
    require_load: bool = True

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for i, reader in enumerate(self.readers or ()):
            yield f"readers[{i}]", reader, ("reader",)

    def label(self, kind: str) -> str:
        return self.name or ("integrity" if not self.readers else f"integrity({', '.join(self.readers)})")


def differing(expected: Mapping[str, str], held: Mapping[str, Any]) -> list[str]:
    """The tensors whose checksum in ``held`` is not the expected one (missing or extra ones too)."""
    out = [
        name if name in held else f"{name} (missing)"
        for name, checksum in expected.items()
        if str(held.get(name, "")).lower() != checksum.lower()
    ]
    out += [f"{name} (not in the model)" for name in held if name not in expected]
    return out


def _judged(digests: list[Entry]) -> list[Entry]:
    if not digests:
        return []
    return [d for d in digests[:-1] if d.get("when") in JUDGED_WHEN] + [digests[-1]]


def _readers(p: IntegrityParams, h: History, run: RunFacts) -> list[str]:
    if p.readers:
        return list(p.readers)
    named = run.processes("reader")
    seen = {e.actor for e in h.select(f=("load_done", "memory_digest"))}
    return [*named, *sorted(seen - set(named))]


@register("integrity", IntegrityParams)
def integrity(p: IntegrityParams, h: History, run: RunFacts) -> CheckResult:
    """Each reader's memory_digest checksums against the harness's own model; every load verified."""
    if run.expected is None:
        return CheckResult("unknown", "no expected content to judge against (no scenario model in the run facts)")
    expected = run.expected()
    want = expected.checksums()
    want_digest = expected.digest()
    bad: list[str] = []
    unknown: list[str] = []
    held: list[str] = []
    per_reader: dict[str, Any] = {}
    marks: list[tuple[float, str]] = []
    loads_total = 0
    for reader in _readers(p, h, run):
        loads = h.select(actor=reader, f="load_done")
        digests = h.select(actor=reader, f="memory_digest")
        rejected = [e for e in h.select(actor=reader, f="integrity") if e.get("ok") is not True]
        loads_total += len(loads)
        claims = [e for e in loads if truthy_integrity(e.get("integrity")) is True]
        info: dict[str, Any] = {"loads": len(loads), "memory_digests": len(digests), "rejected": len(rejected)}
        per_reader[reader] = info
        for load in loads:
            if truthy_integrity(load.get("integrity")) is not True:
                bad.append(f"{reader} load_done at {load.t:.3f}s: integrity {load.get('integrity')!r}, not verified")
        if loads and not any(d.get("incarnation") == loads[-1].get("incarnation") for d in digests):
            unknown.append(
                f"{reader} loaded (load_done at {loads[-1].t:.3f}s) but reported no memory_digest for that load, "
                "so what it holds cannot be checked independently"
            )
        for digest in _judged(digests):
            sums = digest.get("checksums")
            when = digest.get("when")
            if not isinstance(sums, Mapping):
                unknown.append(f"{reader} memory_digest ({when}) at {digest.t:.3f}s carries no checksums")
                continue
            if not sums and not loads:
                continue  # it holds nothing, and claimed nothing
            diff = differing(want, sums)
            reported = digest.get("digest")
            if not diff and reported is not None and str(reported).lower() != want_digest:
                diff = [f"digest {reported} (the model's: {want_digest}; dtype or shape differ)"]
            info.setdefault("differ", {})[f"{when}@{digest.t:.3f}"] = diff
            if not diff:
                held.append(f"{reader} ({when})")
                continue
            claimed = [c for c in claims if c.get("incarnation") == digest.get("incarnation")]
            claim = (
                f"; it CLAIMED VERIFIED (load_done at {claimed[-1].t:.3f}s, path {claimed[-1].get('path')!r})"
                if claimed
                else ""
            )
            shown = ", ".join(diff[:5]) + (f" (+{len(diff) - 5} more)" if len(diff) > 5 else "")
            bad.append(
                f"{reader} holds wrong bytes ({when}, {digest.t:.3f}s): {len(diff)} of {len(want)} tensors differ "
                f"from the model: {shown}{claim}"
            )
            marks.append((digest.t, f"{reader} wrong bytes"))
    details = {
        "expected": {"origin": expected.origin, "tensors": len(want), "digest": want_digest},
        "readers": per_reader,
        "bad": bad,
        "unknown": unknown,
    }
    if bad:
        summary = "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
        return CheckResult(False, summary, details, tuple(marks))
    if unknown:
        return CheckResult("unknown", "; ".join(unknown[:3]), details)
    if loads_total == 0 and not held:
        if p.require_load:
            return CheckResult("unknown", "no reader loaded, nothing to verify", details)
        return CheckResult(True, "no reader loaded, so none holds wrong bytes", details)
    return CheckResult(
        True,
        f"{len(held)} memory digest(s) match the model as the harness computes it ({expected.origin}): "
        + ", ".join(held[:4]),
        details,
    )
