"""``matrix.html``: one self-contained page (inline CSS, no script) of a ``matrix.json``.

Top to bottom: the headlines (a known defect expected but not reproduced on a version, or
reproduced where it is not listed), the changes against ``--baseline`` (regressions first),
then the table: a header row per column with the NIXL / UCX versions its runs loaded (and
the raw READ GB/s), a row per scenario; each cell its verdict (coloured), the failure rate,
the timings, expected vs observed for a known defect, and links to its run folders
(relative to the page, so the output folder can be moved as a whole).
"""

from __future__ import annotations

import html
from typing import Any

from harness.record.baseline import where
from harness.record.saved import MatrixCell, MatrixDoc
from harness.reports.htmlreport.palette import swatch

__all__ = ["render_matrix"]


CSS = """
body{font:14px system-ui,sans-serif;margin:16px;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #999;padding:4px 6px;vertical-align:top}
th{background:#f2f2f2;text-align:left}.v{font-weight:bold;text-transform:uppercase}
.small{font-size:12px;color:#444}.headline{background:#fff1a8;border:2px solid #d4a000;padding:6px 10px;margin:6px 0}
.reg{color:#a00000;font-weight:bold}.unexp{outline:3px solid #d4a000;outline-offset:-3px}
a{color:#0645ad}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any, unit: str = "") -> str | None:
    return f"{value:g}{unit}" if isinstance(value, int | float) else None


def _cell(cell: MatrixCell) -> str:
    verdict = cell.verdict
    defect = cell.defect
    unexpected = bool(defect and defect.headline)
    look = swatch(verdict)  # the palette every page shares: a colour and a glyph, never colour alone
    parts = [f'<div class="v" style="color:{look.strong}"><span aria-hidden="true">{look.glyph}</span> {_e(verdict)}</div>']
    if cell.error:
        parts.append(f'<div class="small">{_e(cell.error)}</div>')
    k, n = cell.failed()
    if n:
        tally = ", ".join(f"{v} {key}" for key, v in cell.verdicts.items())
        parts.append(f'<div class="small">failed {k}/{n} ({_e(tally)})</div>')
    rate = cell.rate
    if rate is not None and "k" in rate:
        bound = f" bound {cell.bound:.3g}" if cell.bound is not None else ""
        parts.append(f'<div class="small">rate {rate["k"]}/{rate["n"]}{bound}</div>')
    timings = [
        ("run", _num(cell.seconds, "s")), ("detect", _num(cell.detection_s, "s")),
        ("recover", _num(cell.recovery_s, "s")), ("fallback", _num(cell.fallback_s, "s")),
        ("READ", _num(cell.read_gbps, " GB/s")), ("/raw", _num(cell.read_ratio)),
    ]
    shown = [f"{k} {v}" for k, v in timings if v]
    if shown:
        parts.append(f'<div class="small">{_e(" · ".join(shown))}</div>')
    if defect:
        exp = "expected" if defect.expected else "not listed"
        parts.append(f'<div class="small">defect {exp}; {_e(defect.observed)}</div>')
    links = [
        f'<a href="{_e(r.link or r.run_dir)}/report.html">{i + 1}:{_e(r.verdict)}</a>'
        for i, r in enumerate(cell.runs)
    ]
    if links:
        parts.append(f'<div class="small">runs {" ".join(links)}</div>')
    return f'<td style="background:{look.light}"{" class=unexp" if unexpected else ""}>{"".join(parts)}</td>'


def render_matrix(matrix: MatrixDoc) -> str:
    cols = matrix.columns
    rows: list[str] = []
    out = [f"<!doctype html><html><head><meta charset=utf-8><title>mxchaos matrix</title><style>{CSS}</style></head><body>",
           f"<h1>mxchaos matrix</h1><p class=small>{_e(matrix.created)}; {matrix.repeat} "
           f"run(s) per cell; verdict = the worst of the cell's runs; failed k/n = runs ending error, hang, fail, "
           "unknown or xfail</p>"]
    for h in matrix.headlines:
        out.append(f'<div class="headline"><b>{_e(h.scenario)}</b> @ {_e(h.column)}: {_e(h.text)}</div>')
    if matrix.baseline_changes is not None:
        changes = sorted(matrix.baseline_changes, key=lambda c: not c.regression)
        out.append(f"<h2>Changes against the baseline ({len(changes)})</h2>")
        if changes:
            out.append("<ul>")
            for c in changes:
                cls = ' class="reg"' if c.regression else ""
                out.append(f"<li{cls}>{_e(where(c))}: {_e(c.text)}</li>")
            out.append("</ul>")
        else:
            out.append("<p>none</p>")
    head = ["<tr><th>scenario</th>"]
    for col in cols:
        if col.available:
            loaded = (f"loaded NIXL {', '.join(col.loaded_nixl or ['?'])}; "
                      f"UCX {', '.join(col.loaded_ucx or ['?'])}")
            raws = [f"{int(n) / (1 << 20):g} MiB {_num(g, ' GB/s') or '?'}"
                    for n, g in sorted(col.raw_reads.items(), key=lambda kv: int(kv[0]))]
            raw = ", ".join(raws) if raws else _num(col.raw_read_gbps, " GB/s")
            loaded += f"; raw READ {raw}" if raw else (f"; {col.raw_read_error}" if col.raw_read_error else "")
        else:
            why = col.error or ""  # "not installable: ..." (an older matrix.json: the bare reason)
            loaded = why if why.startswith("not installable") else f"unavailable: {why}"
        head.append(f'<th>{_e(col.label)}<div class="small">{_e(loaded)}</div></th>')
    head.append("</tr>")
    for sc in matrix.scenarios:
        defect = sc.defect
        note = ""
        if defect:
            versions = ", ".join(defect.versions or []) or "every version (no defect_versions)"
            note = f'<div class="small">known defect on {_e(versions)}</div>'
        row = [f"<tr><th>{_e(sc.name)}{note}</th>"]
        for col in cols:
            row.append(_cell(matrix.cell(sc.name, col.id) or MatrixCell()))
        rows.append("".join(row) + "</tr>")
    out.append("<table>" + "".join(head) + "".join(rows) + "</table></body></html>")
    return "\n".join(out) + "\n"
