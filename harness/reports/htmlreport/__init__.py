"""The HTML report of one run (``report.html``): one self-contained page for a person.

Top to bottom: the verdict badge and why; the checks, failed first; the timeline (a lane
per process plus harness, nemesis and checks, on a time axis in seconds with round ticks,
and a legend for every mark and colour); step charts of the scraped metrics that matter,
on the same time axis; then steps, faults, processes, files and every event. Plain
HTML, CSS and inline SVG written here; no JavaScript. ``harness.reports.report`` writes the file.

The package, each module depending only on those above it:

    palette.py    the one verdict palette of every page: colours and a glyph per verdict
    style.py      colours and what they stand for, shared geometry, escaping, check order, CSS
    axis.py       ``nice_ticks``, the time axis, rows for overlapping spans
    lanes.py      what a lane shows, read from the history: attempts and their phases, the
                  server's view of each source, host faults, scrape gaps, the interrupt
    timeline.py   ``timeline_svg`` (the lanes) and ``legend_html``
    charts.py     ``MetricChart``, ``METRIC_CHARTS`` (which metrics are charted), ``metric_charts``
    page.py       ``render_html``: the whole page and its tables
"""

from __future__ import annotations

from harness.reports.htmlreport.axis import nice_ticks
from harness.reports.htmlreport.charts import METRIC_CHARTS, MetricChart, metric_charts
from harness.reports.htmlreport.page import render_html
from harness.reports.htmlreport.timeline import timeline_svg

__all__ = ["METRIC_CHARTS", "MetricChart", "metric_charts", "nice_ticks", "render_html", "timeline_svg"]
