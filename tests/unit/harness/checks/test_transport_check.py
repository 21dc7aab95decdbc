"""UCX's endpoint lines (harness.record.ucxlog) and the transport check that judges them: the READ
lanes (rma, else rma_am) of peer endpoints only, allow and forbid, unknown without a log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.checks.transport import TransportParams
from harness.record import ucxlog
from harness.record.timeline import History

TCP = ("[1796266008.703930] [vm:5107 :2]      ucp_worker.c:1997 UCX  INFO    reader-1-666295aa intra-node cfg#1 "
       "rma_am(tcp/lo)  amo_am(tcp/lo)  am(tcp/lo cma/memory)  ka(tcp/lo)")
SELF = "[1] [vm:1 :1] ucp_worker.c:1997 UCX  INFO    reader-1-666295aa self cfg#0 rma_am(tcp/lo)  am(tcp/lo)"
RDMA = "ucp_worker.c:1997 UCX  INFO    r-1 inter-node cfg#2 rma(rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_1:1)  am(rc_mlx5/mlx5_0:1)"


def test_endpoint_lines_parse_into_lanes_and_read_transports(tmp_path: Path) -> None:
    tcp = ucxlog.parse_line(TCP)
    assert tcp == {"worker": "reader-1-666295aa", "scope": "intra-node", "cfg": 1, "lanes": {
        "rma_am": ["tcp/lo"], "amo_am": ["tcp/lo"], "am": ["tcp/lo", "cma/memory"], "ka": ["tcp/lo"]}}
    assert ucxlog.read_transports(tcp) == ["tcp"]  # rma emulated over am: the am lane named for rma_am
    rdma = ucxlog.parse_line(RDMA)
    assert rdma is not None and ucxlog.read_transports(rdma) == ["rc_mlx5"]
    assert ucxlog.parse_line("2026 NIXL INFO Backend UCX was instantiated") is None
    log = tmp_path / "r.log"
    log.write_text(f"{RDMA}\nnoise\n{SELF}\n{TCP}\n{TCP}\n")
    assert [e["scope"] for e in ucxlog.endpoints(log)] == ["inter-node", "self", "intra-node"]  # each once
    assert [e["scope"] for e in ucxlog.endpoints(log, offset=len(RDMA) + 1)] == ["self", "intra-node"]  # one incarnation


def judge(params: dict[str, Any], *lines: str) -> checks.NamedResult:
    found = [e for e in (ucxlog.parse_line(line) for line in lines) if e is not None]
    rows = [(1.0, "info", "reader-1", "ucx_endpoints", {"incarnation": 1, "endpoints": found})] if found else []
    return evaluate(0, "transport", TransportParams.model_validate({"process": "reader-1", **params}),
                    History.build(rows), RunFacts())


def test_the_check_judges_peer_endpoints_against_allow_and_forbid() -> None:
    assert judge({"allow": ["tcp"]}, SELF, TCP).valid is True
    over_tcp = judge({"allow": ["rc_mlx5", "dc_mlx5"]}, SELF, TCP)
    assert over_tcp.valid is False and over_tcp.summary.startswith("reader-1: READ lanes over tcp")
    assert judge({"forbid": ["tcp"]}, TCP).valid is False
    assert judge({"forbid": ["tcp"]}, SELF, RDMA).valid is True  # the self loopback is not a peer
    unknown = judge({"allow": ["tcp"]}, SELF)
    assert unknown.valid == "unknown" and "UCX_LOG_LEVEL: info" in unknown.summary


@pytest.mark.parametrize(("params", "says"), [
    ({}, "give allow"),
    ({"allow": ["tcp"], "forbid": ["tcp"]}, "tcp both allowed and forbidden"),
])
def test_bad_transport_checks_are_refused(params: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        TransportParams.model_validate({"process": "reader-1", **params})
    assert says in str(err.value)
