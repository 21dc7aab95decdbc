"""Deaths said as a person reads them (``harness.record.deaths``): signal names for negative exit
codes, the processes that died by a signal the harness did not send, a log's last lines."""

from __future__ import annotations

from pathlib import Path

from harness.record.deaths import deaths, log_tail, name_signals, signal_name
from harness.record.timeline import History


def test_a_negative_exit_code_is_named_by_its_signal() -> None:
    assert signal_name(-6) == "SIGABRT" and signal_name(-9) == "SIGKILL" and signal_name(-11) == "SIGSEGV"
    assert signal_name(0) is None and signal_name(1) is None and signal_name(None) is None
    assert signal_name(-200) is None  # no such signal: said as a number


def test_each_negative_code_in_a_line_gets_its_name_once() -> None:
    assert name_signals("reader-1 exited -6, expected 0") == "reader-1 exited -6 (SIGABRT), expected 0"
    assert name_signals("source-1 rc -9; reader-1 rc=-11") == "source-1 rc -9 (SIGKILL); reader-1 rc=-11 (SIGSEGV)"
    once = name_signals("reader-1 exited -6, expected 0")
    assert name_signals(once) == once
    assert name_signals("reader-1 exited 3, expected 0") == "reader-1 exited 3, expected 0"
    assert name_signals("a window of -6 s") == "a window of -6 s"  # only an exit code is named


def test_deaths_are_the_exits_by_signal_the_harness_did_not_cause_by_stopping() -> None:
    history = History.build([
        (1.0, "info", "reader-1", "process_exit", {"rc": -6, "signal": "SIGABRT", "stopped_by_harness": False}),
        (2.0, "info", "source-1", "process_exit", {"rc": -15, "stopped_by_harness": True}),
        (3.0, "info", "server", "process_exit", {"rc": 0, "stopped_by_harness": False}),
        (4.0, "info", "source-2", "process_exit", {"rc": -11, "stopped_by_harness": False}),
    ])
    assert [(d.process, d.signal, d.t) for d in deaths(history)] == [("reader-1", "SIGABRT", 1.0),
                                                                      ("source-2", "SIGSEGV", 4.0)]


def test_a_log_tail_is_its_last_lines_and_a_missing_log_is_empty(tmp_path: Path) -> None:
    log = tmp_path / "reader-1.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert log_tail(log, 3) == "line 997\nline 998\nline 999"
    assert len(log_tail(log, 1000, max_chars=100)) <= 100 and log_tail(log, 1000, max_chars=100).endswith("line 999")
    assert log_tail(tmp_path / "absent.log") == ""
