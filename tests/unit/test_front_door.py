"""``mxref.front_door``: refusal events bounded per peer and second, peer addresses, the
open-files limit (a real child process under a low soft limit)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from mxref import front_door
from mxref.security import Refusal, RefusalReason

LIST = "/mxref.v1.P2pService/ListSources"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def events(clock: Clock) -> tuple[front_door.RefusalEvents, list[dict[str, Any]], dict[str, int]]:
    lines: list[dict[str, Any]] = []
    counted: dict[str, int] = {}

    def count(method: str, n: int) -> None:
        counted[method] = counted.get(method, 0) + n

    return front_door.RefusalEvents(lambda **f: lines.append(f), count, clock=clock), lines, counted


def test_a_flood_of_refusals_is_one_line_at_once_then_one_a_second_with_its_count() -> None:
    clock = Clock()
    agg, lines, counted = events(clock)
    for i in range(10_000):  # 10k refusals from 100 ports of one address over 2.5 s
        clock.now = 100.0 + i * 0.00025
        agg.report(Refusal(LIST, RefusalReason.MISSING_TOKEN, f"ipv4:10.0.0.7:{40000 + i % 100}"))
        agg.flush()
    clock.now += 5
    agg.flush()
    assert counted == {"ListSources": 10_000}  # the metric counts every call
    assert len(lines) <= 5  # the first at once, then one a second (2.5 s), then the rest
    assert lines[0] == {"peer": "ipv4:10.0.0.7", "method": "ListSources", "reason": "missing_token", "count": 1}
    assert sum(line["count"] for line in lines) == 10_000
    assert {line["peer"] for line in lines} == {"ipv4:10.0.0.7"}


def test_each_peer_method_and_reason_has_its_own_line_and_a_quiet_key_is_told_at_once() -> None:
    clock = Clock()
    agg, lines, _ = events(clock)
    agg.report(Refusal(LIST, RefusalReason.MISSING_TOKEN, "ipv4:10.0.0.1:1"))
    agg.report(Refusal(LIST, RefusalReason.WRONG_TOKEN, "ipv4:10.0.0.1:2"))
    agg.report(Refusal(LIST, RefusalReason.WRONG_TOKEN, "ipv6:%5B::1%5D:3", count=7))  # counted by the native server
    assert [(line["peer"], line["reason"], line["count"]) for line in lines] == [
        ("ipv4:10.0.0.1", "missing_token", 1), ("ipv4:10.0.0.1", "wrong_token", 1), ("ipv6:[::1]", "wrong_token", 7)]
    clock.now += 3
    agg.flush()
    agg.report(Refusal(LIST, RefusalReason.MISSING_TOKEN, "ipv4:10.0.0.1:9"))  # quiet for a while: at once
    assert lines[-1]["count"] == 1 and len(lines) == 4


def test_close_writes_what_is_pending_and_many_peers_fold_into_other() -> None:
    clock = Clock()
    lines: list[dict[str, Any]] = []
    agg = front_door.RefusalEvents(lambda **f: lines.append(f), lambda m, n: None, clock=clock, max_keys=3)
    for i in range(50):
        agg.report(Refusal(LIST, RefusalReason.MISSING_TOKEN, f"ipv4:10.0.1.{i}:5"))
    agg.close()
    peers = [line["peer"] for line in lines]
    assert len(set(peers)) == 4 and "other" in peers
    assert sum(line["count"] for line in lines) == 50


def test_peer_address_drops_the_port_only() -> None:
    assert front_door.peer_address("ipv4:127.0.0.1:5123") == "ipv4:127.0.0.1"
    assert front_door.peer_address("ipv4:127.0.0.1") == "ipv4:127.0.0.1"
    assert front_door.peer_address("ipv6:[::1]:5123") == "ipv6:[::1]"
    assert front_door.peer_address("ipv6:%5B::1%5D:5123") == "ipv6:[::1]"
    assert front_door.peer_address("ipv6:[::1]") == "ipv6:[::1]"
    assert front_door.peer_address("unix:/tmp/s") == "unix:/tmp/s"


def test_the_open_files_limit_goes_up_to_the_hard_limit() -> None:
    code = ("import resource; from mxref import front_door; "
            "print(front_door.raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run(["prlimit", "--nofile=64:256", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "(64, 256) (256, 256)"
