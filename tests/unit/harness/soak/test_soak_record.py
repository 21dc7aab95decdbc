"""The soak's record, summary, probe and page on made-up samples: a torn line is skipped, a resume
goes on from the record, the audit is not believed when it did not keep up with the loads the
harness counted, sockets are found by their inodes, and the page names the growth."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness.soak.page import render_page
from harness.soak.probe import proc_sample, tcp_sockets
from harness.soak.record import SAMPLES, Record, read_samples
from harness.soak.verdict import summarize


def sample(transfers: int, process: str, role: str, values: dict[str, float], segment: int = 0, loads: int = 0,
           made: dict[str, float] | None = None) -> dict[str, Any]:
    return {"segment": segment, "transfers": transfers, "failed": 0, "elapsed_s": transfers / 10, "process": process,
            "role": role, "pid": 1, "loads": loads, "values": values, "made": made or {}}


def write(out: Path, docs: list[dict[str, Any]], torn: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / SAMPLES).write_text("".join(json.dumps(d) + "\n" for d in docs) + torn)


def test_a_torn_last_line_is_skipped_and_a_resume_goes_on_from_the_record(tmp_path: Path) -> None:
    write(tmp_path, [sample(t, "reader-1", "reader", {"fds": 5}) for t in (0, 20, 40)], torn='{"segment": 0, "tra')
    assert [s.transfers for s in read_samples(tmp_path)] == [0, 20, 40]
    with pytest.raises(FileExistsError, match="--resume"):
        Record(tmp_path, resume=False)
    record = Record(tmp_path, resume=True)
    try:
        assert (record.segment, record.start_transfers, record.start_elapsed) == (1, 40, 4.0)
    finally:
        record.close()


def test_a_line_that_is_not_a_sample_is_named(tmp_path: Path) -> None:
    write(tmp_path, [{"segment": 0}])
    with pytest.raises(ValueError, match=r"samples.jsonl: sample 1: not a soak sample"):
        read_samples(tmp_path)


def leaky_reader(audit_made: float) -> list[dict[str, Any]]:
    docs = []
    for i in range(20):
        t = 20 * i
        docs.append(sample(t, "reader-1", "reader", {"fds": 5 + t, "nixl_registrations_open": 0.0}, loads=t,
                           made={"handles": audit_made * t, "registrations": audit_made * t}))
        docs.append(sample(t, "source-1", "source", {"fds": 18, "nixl_registrations_open": 1.0}))
        docs.append(sample(t, "server", "server", {"fds": 11, "nixl_registrations_open": 0.0}))
    return docs


def test_the_summary_names_the_growing_resource_with_its_rate(tmp_path: Path) -> None:
    write(tmp_path, leaky_reader(audit_made=1.0))
    summary = summarize(read_samples(tmp_path), warmup=40)
    assert summary["verdict"] == "grows" and summary["transfers"] == 380
    [growth] = summary["growths"]
    assert (growth["process"], growth["resource"]) == ("reader-1", "fds")
    assert growth["slope"]["per_1000"] == pytest.approx(1000) and growth["detected_at"] <= 2000
    assert summary["series"]["source-1"]["fds"]["verdict"] == "flat"
    assert "nixl_registrations_open" not in summary["series"]["server"]  # a server has no NIXL
    assert summary["audit_crosscheck"]["reader-1"]["trusted"] is True
    page = render_page(summary, read_samples(tmp_path))
    assert "reader-1 fds grows +1000.0 per 1000 transfers" in page and page.count("<svg") == 2


def test_an_audit_that_did_not_keep_up_with_the_loads_is_not_judged(tmp_path: Path) -> None:
    write(tmp_path, leaky_reader(audit_made=0.0))  # loads counted, the audit made nothing: it does not see them
    summary = summarize(read_samples(tmp_path), warmup=40)
    assert summary["audit_crosscheck"]["reader-1"]["trusted"] is False
    assert summary["series"]["reader-1"]["nixl_registrations_open"]["verdict"] == "unknown"
    assert summary["series"]["source-1"]["nixl_registrations_open"]["verdict"] == "flat"


def test_an_error_is_the_verdict_whatever_the_slopes(tmp_path: Path) -> None:
    write(tmp_path, leaky_reader(1.0))
    assert summarize(read_samples(tmp_path), 40, error="source-1 exited (1)")["verdict"] == "error"


def fake_proc(root: Path, pid: int, sockets: dict[str, str]) -> None:
    """/proc/<pid> with a descriptor per socket inode (and one file), and net/tcp rows: inode -> state."""
    fd = root / str(pid) / "fd"
    fd.mkdir(parents=True)
    for i, inode in enumerate(sockets):
        os.symlink(f"socket:[{inode}]", fd / str(i + 3))
    os.symlink("/dev/null", fd / "0")
    (root / str(pid) / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = [f"   {i}: 0100007F:B62D 0100007F:DC10 {state} 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1"
            for i, (inode, state) in enumerate(sockets.items())]
    rows.append("  99: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 999 1")  # not ours
    (root / str(pid) / "net" / "tcp").write_text(head + "\n".join(rows) + "\n")
    (root / str(pid) / "status").write_text("Name:\tpython\nState:\tS (sleeping)\nThreads:\t7\nVmRSS:\t  1234 kB\n")


def test_sockets_are_the_process_s_by_inode_with_their_states(tmp_path: Path) -> None:
    fake_proc(tmp_path, 42, {"101": "01", "102": "08", "103": "08", "104": "0A"})
    assert tcp_sockets(42, tmp_path) == (4, 1, 2)
    assert proc_sample(42, tmp_path) == {"fds": 5.0, "rss_kib": 1234.0, "threads": 7.0, "tcp": 4.0,
                                         "tcp_established": 1.0, "tcp_close_wait": 2.0}
