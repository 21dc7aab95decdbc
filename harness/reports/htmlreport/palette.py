"""The one verdict palette of every page (a run's report, a suite's index, a night's page, the
history of nights): for each verdict or cell, a strong colour (text, marks), a light one
(table cells) and a glyph, so no verdict is told by colour alone.

Failing (FAIL, FLAKY, HANG, ERROR, ENV_BROKEN) is red with a cross; UNKNOWN and XFAIL
(a known defect, as expected) amber; NOT EXERCISED (a fault had no effect: the scenario did
not happen) magenta with an empty circle-slash; SKIP and NOT JUDGED (a check an interrupted run did not
reach) neutral grey with a dash or a ring; PASS green with a tick; XPASS and FIXED? blue with a
star. The names are ``harness.record.vocabulary``'s; an older record's words (REPRODUCED) read as today's.
Imports nothing of the report, so any page may use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.record.vocabulary import canonical

__all__ = ["NOT_JUDGED", "Swatch", "glyph_badge", "swatch"]

NOT_JUDGED = "NOT JUDGED"  # a check of an interrupted run that did not pass: the run ended before it could be


@dataclass(frozen=True)
class Swatch:
    strong: str  # marks, text, badges
    light: str  # table cell backgrounds
    glyph: str  # the shape beside the word
    kind: str  # pass | fail | warn | neutral | info: the CSS class of a row or box


_PASS = Swatch("#1a7f37", "#dafbe1", "\u2713", "pass")
_FAIL = Swatch("#cf222e", "#ffebe9", "\u2717", "fail")
_HANG = Swatch("#8250df", "#fbefff", "\u29d6", "fail")
_ERROR = Swatch("#a40e26", "#ffd8d3", "\u26a0", "fail")
_UNKNOWN = Swatch("#9a6700", "#fff8c5", "?", "warn")
_XFAIL = Swatch("#bc4c00", "#fff1e5", "!", "warn")
_BLUE = Swatch("#0969da", "#ddf4ff", "\u2605", "info")
_SKIP = Swatch("#6e7781", "#f6f8fa", "\u2013", "neutral")
_UNEXERCISED = Swatch("#bf3989", "#ffeff7", "\u2298", "fail")
_UNJUDGED = Swatch("#6e7781", "#f6f8fa", "\u25cb", "neutral")

_BY_NAME: dict[str, Swatch] = {
    "pass": _PASS, "fail": _FAIL, "flaky": _FAIL, "hang": _HANG, "error": _ERROR, "env_broken": _ERROR,
    "unknown": _UNKNOWN, "xfail": _XFAIL, "xpass": _BLUE, "fixed?": _BLUE, "skip": _SKIP, "not judged": _UNJUDGED, "not run": _UNJUDGED,
    "not_exercised": _UNEXERCISED, "not exercised": _UNEXERCISED,
    "passed": _PASS, "failed": _FAIL, "unavailable": _SKIP, "not_installable": _SKIP, "none": _SKIP,
}


def swatch(verdict: object) -> Swatch:
    """The swatch of a run verdict, a cell or a check verdict word (any case); unknown names: UNKNOWN's."""
    return _BY_NAME.get(canonical(str(verdict)).lower(), _UNKNOWN)


def glyph_badge(verdict: object, text: str | None = None) -> str:
    """``<span class='verdict K'>G WORD</span>`` in the verdict's strong colour (HTML; the word escaped by the caller)."""
    s = swatch(verdict)
    word = str(verdict).upper() if text is None else text
    return (f"<span class='verdict {s.kind}' style='background:{s.strong}'>"
            f"<span class='glyph' aria-hidden='true'>{s.glyph}</span> <span class='word'>{word}</span></span>")
