"""Style of the HTML report: the colours and what each stands for, the geometry the timeline
and the charts share (so their time axes line up), escaping, check ordering and the CSS.

Every other module of ``harness.reports.htmlreport`` draws with these tables; this one imports only
``palette`` (the one verdict palette of every page).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from harness.checks import NamedResult
from harness.reports.htmlreport.palette import NOT_JUDGED, swatch

_GREEN, _RED, _AMBER, _PURPLE, _BLUE, _ORANGE, _VIOLET, _GREY = (
    "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#0969da", "#bc4c00", "#6639ba", "#6e7781",
)
_CHECK_COLORS: dict[object, str] = {True: swatch("pass").strong, False: swatch("fail").strong,
                                     "unknown": swatch("unknown").strong}
_VERDICT_COLORS = {v: swatch(v).strong for v in ("pass", "fail", "unknown", "hang", "error", "xfail", "xpass", "skip",
                                                  "not_exercised")}
# a scenario's cell over its --repeat N runs (harness.record.rates.CELLS)
_CELL_COLORS = {c: swatch(c).strong for c in ("PASS", "FLAKY", "FAIL", "UNKNOWN", "ERROR", "HANG", "SKIP", "XFAIL",
                                               "FIXED?", "XPASS", "NOT_EXERCISED")}
# events drawn as dots on a process lane: colour, legend text
_EVENT_STYLE = {
    "load_done": (_GREEN, "load_done"),
    "fallback": (_ORANGE, "fallback"),
    "transfer_timeout": (_RED, "transfer timeout"),
    "transfer_error": (_RED, "transfer error"),
    "load_failed": (_RED, "load_failed"),
    "peer_disconnected": (_VIOLET, "peer disconnected"),
    "integrity": (_BLUE, "integrity"),
}
_ALIVE, _FAULT, _STEP, _STATUS, _AXIS = "#afb8c1", _RED, "#57606a", _BLUE, "#57606a"
# one colour per process in the metric charts (cycled)
_SERIES = ("#0969da", "#bc4c00", "#1a7f37", "#8250df", "#cf222e", "#1b7c83", "#9a6700", "#bf3989")

# geometry shared by the timeline and the charts, so their time axes line up
_LEFT, _WIDTH, _RIGHT = 120, 880, 40
_CHAR_W = 6.4  # about one character of 11px text


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _valid_text(valid: Any, interrupted: bool = False, not_judged: str | None = None) -> str:
    """A check's word; in an interrupted run a check that did not pass was never judged whole;
    one declared for other servers (``NamedResult.not_judged``) was not judged either."""
    if (interrupted and valid is not True) or not_judged:
        return NOT_JUDGED
    return "PASS" if valid is True else "FAIL" if valid is False else "UNKNOWN"


def _severity(check: NamedResult) -> int:
    return 0 if check.valid is False else 2 if check.valid is True else 1


def _by_severity(checks: Iterable[NamedResult]) -> list[NamedResult]:
    """Failed checks first, then unknown, then passed; in scenario order within each."""
    return sorted(checks, key=lambda c: (_severity(c), c.index))


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}"
    "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d0d7de;padding:4px 8px;"
    "text-align:left;vertical-align:top}th{background:#f6f8fa}.badge{color:#fff;padding:2px 10px;"
    "border-radius:10px;font-weight:600}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap}"
    "svg text{font:11px system-ui,sans-serif}svg text.lane{font-weight:600}"
    f"tr.fail td{{background:{swatch('fail').light}}}tr.unknown td{{background:{swatch('unknown').light}}}"
    f"tr.neutral td{{background:{swatch('skip').light};color:#57606a}}"
    f".why{{border-left:4px solid {swatch('fail').strong};padding:4px 10px;margin:8px 0 16px;background:#fff5f5}}"
    f".why.warn{{border-color:{swatch('xfail').strong};background:{swatch('xfail').light}}}"
    f".why.neutral{{border-color:{swatch('skip').strong};background:{swatch('skip').light}}}"
    ".caveat{color:#57606a;font-size:13px;margin:-8px 0 16px;padding:0 14px}"
    ".back{font-size:13px;margin:0 0 -8px}"
    ".next{border-left:4px solid #0969da;padding:4px 10px;margin:8px 0 16px;background:#f6f8fa}"
    ".verdict{color:#fff;padding:1px 8px;border-radius:10px;font-weight:600;white-space:nowrap}"
    "td.word{font-weight:600;white-space:nowrap}"
    # reflow: figures scale to the page (scrolling only themselves below ~640 px), tables wrap
    ".fig{overflow-x:auto;max-width:100%}.fig svg{width:100%;height:auto;min-width:640px}"
    "td{overflow-wrap:break-word}td pre,td code{word-break:break-all}table{max-width:100%}"
    "pre.tail{background:#f6f8fa;padding:6px 8px;max-height:24em;overflow:auto;word-break:break-all}"
    "h1,h2,h3,p,li,summary{overflow-wrap:anywhere}"  # a long unbroken name wraps rather than widen the page
    "@media (max-width:700px){body{margin:8px}}"
    ".why li{margin:2px 0}.note{color:#57606a;margin:4px 0}"
    ".legend{list-style:none;padding:0;margin:4px 0 20px;display:flex;flex-wrap:wrap;gap:4px 18px;font-size:12px}"
    ".legend li{display:flex;align-items:center;gap:6px}"
    "figure.metric{margin:6px 0}figcaption{font-size:12px}.key{margin-left:12px;display:inline-flex;"
    "align-items:center;gap:4px}"
)
