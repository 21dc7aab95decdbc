"""Style of the HTML report: the colours and what each stands for, the geometry the timeline
and the charts share (so their time axes line up), escaping, check ordering and the CSS.

Every other module of ``harness.htmlreport`` draws with these tables; this one imports none of them.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from harness.checks import NamedResult

_GREEN, _RED, _AMBER, _PURPLE, _BLUE, _ORANGE, _VIOLET, _GREY = (
    "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#0969da", "#bc4c00", "#6639ba", "#6e7781",
)
_CHECK_COLORS: dict[object, str] = {True: _GREEN, False: _RED, "unknown": _AMBER}
_VERDICT_COLORS = {
    "pass": _GREEN,
    "fail": _RED,
    "unknown": _AMBER,
    "hang": _PURPLE,
    "error": _GREY,
    "xfail": _ORANGE,
    "xpass": _BLUE,
    "skip": _GREY,
}
# a scenario's cell over its --repeat N runs (harness.rates.CELLS)
_CELL_COLORS = {
    "PASS": _GREEN, "FLAKY": _RED, "FAIL": _RED, "UNKNOWN": _AMBER, "ERROR": _GREY, "HANG": _PURPLE, "SKIP": _GREY,
    "REPRODUCED": _ORANGE, "FIXED?": _BLUE, "NOT_REPRODUCED": _BLUE,
}
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


def _valid_text(valid: Any) -> str:
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
    "tr.fail td{background:#ffebe9}tr.unknown td{background:#fff8c5}"
    ".why{border-left:4px solid #cf222e;padding:4px 10px;margin:8px 0 16px;background:#fff5f5}"
    ".why li{margin:2px 0}.note{color:#57606a;margin:4px 0}"
    ".legend{list-style:none;padding:0;margin:4px 0 20px;display:flex;flex-wrap:wrap;gap:4px 18px;font-size:12px}"
    ".legend li{display:flex;align-items:center;gap:6px}"
    "figure.metric{margin:6px 0}figcaption{font-size:12px}.key{margin-left:12px;display:inline-flex;"
    "align-items:center;gap:4px}"
)
