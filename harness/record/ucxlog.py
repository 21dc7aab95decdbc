"""What UCX says it built: the endpoint configurations in a process's log (UCX_LOG_LEVEL=info).

With ``UCX_LOG_LEVEL=info`` UCX logs one line per endpoint configuration it creates, naming the
transport and device of each lane::

    ucp_worker.c:1997 UCX  INFO    reader-1-666295aa intra-node cfg#1 rma_am(tcp/lo)  amo_am(tcp/lo)  am(tcp/lo)  ka(tcp/lo)

``self`` configurations are a worker's loopback to itself; ``intra-node`` and ``inter-node``
ones are its endpoints to peers. A READ goes over the ``rma`` lanes, or ``rma_am`` (RMA emulated
over active messages) when no transport of the endpoint does RMA itself. ``endpoints`` parses
those lines (the process's own writes since ``offset``: one incarnation), and the runner records
them as a ``ucx_endpoints`` entry when the process exits (``harness.engine.processes``), which the
``transport`` check judges. This is UCX's account of what it chose, not mxref's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["LINE", "READ_LANES", "endpoints", "parse_line", "read_transports"]

LINE = re.compile(r"UCX\s+INFO\s+(?P<worker>\S+)\s+(?P<scope>self|intra-node|inter-node)\s+cfg#(?P<cfg>\d+)\s+(?P<lanes>.*)$")
_LANE = re.compile(r"(?P<op>[a-z_]+)\((?P<tls>[^)]*)\)")
READ_LANES = ("rma", "rma_am")
MAX_BYTES = 4 << 20  # a log is read from its incarnation's start, at most this much


def parse_line(line: str) -> dict[str, Any] | None:
    """One endpoint configuration line: worker, scope, cfg and lanes (op -> ["tl/dev", ...])."""
    found = LINE.search(line)
    if found is None:
        return None
    lanes: dict[str, list[str]] = {}
    for lane in _LANE.finditer(found.group("lanes")):
        lanes.setdefault(lane.group("op"), []).extend(lane.group("tls").split())
    return {"worker": found.group("worker"), "scope": found.group("scope"), "cfg": int(found.group("cfg")),
            "lanes": lanes}


def endpoints(log: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The endpoint configurations UCX logged in ``log`` from byte ``offset`` on (each once)."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read(MAX_BYTES).decode(errors="replace")
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is not None and parsed not in out:
            out.append(parsed)
    return out


def read_transports(endpoint: dict[str, Any]) -> list[str]:
    """The transports (``tcp``, ``rc_mlx5`` ...) of an endpoint's READ lanes: ``rma``, else ``rma_am``."""
    lanes = endpoint.get("lanes", {})
    chosen = lanes.get("rma") or lanes.get("rma_am") or []
    return sorted({tl.split("/", 1)[0] for tl in chosen})
