"""The runner against real processes (the fake mxref in tests/fixtures/fakeproc.py): process
faults, heals, stop escalation, restarts, hang detection with stacks, leak detection, and
that nothing of a run survives it."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from harness.engine.runner import Runner
from harness.judge.verdict import RunResult
from harness.machine import procscan
from harness.record.timeline import History
from harness.reports.report import write_run_folder
from harness.scenario import load_scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAKE = FIXTURES / "fakeproc.py"


def scenario_file(tmp_path: Path, body: str, name: str = "t") -> Path:
    head = textwrap.dedent(
        f"""\
        name: {name}
        launcher: ["{{python}}", "{FAKE}"]
        scrape: {{interval: 200ms}}
        """
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(head + textwrap.dedent(body))
    return path


def run(tmp_path: Path, body: str, name: str = "t") -> RunResult:
    sc = load_scenario(scenario_file(tmp_path, body, name))
    result = Runner(sc, out_dir=tmp_path / "runs", install_signal_handlers=False).run()
    write_run_folder(result)
    left = [p for p in procscan.scan() if p.run_id == result.run_id]
    assert left == [], f"the run left processes behind: {left}"
    return result


def verdicts(result: RunResult) -> dict[str, object]:
    return {c.name: c.valid for c in result.checks}


def test_fake_smoke_scenario_passes_and_writes_its_folder(tmp_path: Path) -> None:
    sc = load_scenario(FIXTURES / "scenarios" / "fake_smoke.yaml")
    result = Runner(sc, out_dir=tmp_path / "runs", install_signal_handlers=False).run()
    folder = write_run_folder(result)
    assert result.verdict == "pass", [(c.name, c.summary) for c in result.checks]
    history = History.from_jsonl(folder / "timeline.jsonl")
    assert history.first(actor="reader-1", f="load_done") is not None
    assert (folder / "procs" / "reader-1.events.jsonl").stat().st_size > 0
    argv = history.first(actor="reader-1", f="start", type="ok").value["argv"]  # type: ignore[union-attr]
    checkpoint = Path(argv[argv.index("--checkpoint") + 1])
    assert checkpoint.is_file() and folder not in checkpoint.parents, "the checkpoint comes from the cache"
    assert not list(folder.rglob("*.safetensors")), "no checkpoint is copied into the run folder"
    assert (folder.parent / "latest").resolve() == folder


# indented like the scenario bodies below, which are dedented as a whole
SERVER_SOURCE = """\
        budgets: {step: 10s, run: 40s, stop_grace: 2s, progress: 20s}
        processes:
          server: {role: server}
          source-1: {role: source}
"""


def test_kill_with_any_signal_is_recorded_with_the_exit(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
        steps:
          - start: [server, source-1]
          - await: {process: source-1, event: status_change, where: {status: READY}}
          - fault: {kind: kill, target: source-1, signal: SIGKILL}
          - await: {process: source-1, exit: true, code: KILL, within: 5s}
        checks:
          - exit_codes: {expect: {source-1: KILL}, by_itself: [source-1]}
          - nothing_leaked: {}
        """,
    )
    assert result.verdict == "pass", verdicts(result)
    exit_entry = result.history.first(actor="source-1", f="process_exit")
    assert exit_entry is not None and exit_entry.get("signal") == "SIGKILL" and exit_entry.get("rc") == -9
    (window,) = result.history.fault_windows()
    assert window.kind == "kill" and window.end is not None and window.value["signal"] == "SIGKILL"


def test_pause_stops_heartbeats_for_the_window_and_heal_resumes_them(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
        steps:
          - start: [server, source-1]
          - await: {process: source-1, event: heartbeat}
          - fault: {kind: pause, target: source-1, name: freeze}
          - sleep: 1s
          - heal: freeze
          - await: {process: source-1, event: heartbeat, since: step, within: 5s}
        checks:
          - count: {process: source-1, event: heartbeat, min: 2}
        """,
    )
    assert result.verdict == "pass", (result.reason, verdicts(result))
    (window,) = result.history.fault_windows()
    assert window.end is not None and window.end - window.start >= 0.9
    heal_sent = result.history.first(actor="nemesis", f="heal", type="invoke")
    assert heal_sent is not None
    inside = [e for e in result.history.select(actor="source-1", f="heartbeat") if window.start + 0.3 < e.t < heal_sent.t]
    assert inside == [], "a SIGSTOPped source emitted heartbeats"
    heal = result.history.last(actor="nemesis", f="heal", type="ok")
    assert heal is not None and heal.get("resumed") is True


def test_a_duration_heals_automatically_and_teardown_heals_what_is_left(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
        steps:
          - start: [server, source-1]
          - await: {process: source-1, event: heartbeat}
          - fault: {kind: pause, target: source-1, name: short, duration: 300ms}
          - sleep: 800ms
          - fault: {kind: pause, target: source-1, name: forever}
        """,
    )
    heals = {e.get("fault"): e.get("reason") for e in result.history.select(actor="nemesis", f="heal", type="ok")}
    assert heals == {"short": "duration", "forever": "teardown"}
    stop = result.history.last(actor="source-1", f="stop", type="ok")
    assert stop is not None and stop.get("escalated") is False  # resumed first, so TERM worked


def test_stop_escalates_to_kill_after_the_grace_period(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        """\
        budgets: {step: 10s, run: 30s}
        processes:
          server: {role: server, extra_args: [--fake-ignore-term]}
        steps:
          - start: server
          - await: {process: server, event: listening, where: {what: grpc}}
          - stop: {process: server, grace: 500ms}
        checks:
          - exit_codes: {expect: {server: KILL}}
        """,
    )
    assert result.verdict == "pass", verdicts(result)
    stop = result.history.last(actor="server", f="stop", type="ok")
    assert stop is not None and stop.get("escalated") is True and stop.get("rc") == -signal.SIGKILL


def test_restart_makes_a_new_incarnation_and_the_server_keeps_its_port(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
        steps:
          - start: server
          - await: {process: server, event: listening, where: {what: grpc}}
          - fault: {kind: restart, target: server, signal: KILL, delay: 200ms}
          - await: {process: server, event: listening, where: {what: grpc}}
          - start: source-1
          - await: {process: source-1, event: status_change, where: {status: READY}}
        """,
    )
    assert result.status == "completed", result.reason
    ports = [e.get("port") for e in result.history.select(actor="server", f="listening", where={"what": "grpc"})]
    assert len(ports) == 2 and ports[0] == ports[1]
    assert [i.incarnation for i in result.history.incarnations("server")] == [1, 2]
    assert result.history.incarnations("server")[0].rc == -9


def test_depart_kills_the_reader_right_after_it_loaded(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
          reader-1: {role: reader, options: {serve_after_load: true}}
        steps:
          - start: [server, source-1]
          - await: {process: source-1, event: status_change, where: {status: READY}}
          - start: reader-1
          - fault: {kind: depart, target: reader-1}
          - await: {process: reader-1, exit: true, within: 5s}
        checks:
          - loaded: {reader: reader-1, source: source-1}
          - exit_codes: {expect: {reader-1: KILL}}
        """,
    )
    assert result.verdict == "pass", (result.reason, verdicts(result))
    inject = result.history.last(actor="nemesis", f="inject", type="ok")
    assert inject is not None and inject.get("alive_at_kill") is True
    load = result.history.first(actor="reader-1", f="load_done")
    assert load is not None and 0 <= inject.t - load.t < 1.0


def test_a_silent_run_becomes_a_hang_with_stacks(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        """\
        budgets: {step: 20s, run: 30s, progress: 1500ms, stop_grace: 1s}
        processes:
          server: {role: server}
          reader-1: {role: reader, extra_args: [--fake-silent]}
        steps:
          - start: server
          - start: reader-1
          - await: {process: reader-1, event: load_done}
        checks:
          - loaded: {reader: reader-1}
        """,
    )
    assert result.verdict == "hang"
    assert result.status == "hang" and "no progress for 1.5s" in result.reason
    assert set(result.stacks) >= {"harness", "server", "reader-1"}
    harness_stacks = (result.run_dir / result.stacks["harness"]).read_text()
    assert "mxchaos-watchdog" in harness_stacks
    reader_stacks = (result.run_dir / result.stacks["reader-1"]).read_text()
    assert reader_stacks.startswith("# reader-1 pid")
    assert result.history.first(actor="harness", f="hang") is not None
    assert result.seconds < 15


def test_an_await_that_times_out_fails_the_step_and_still_reports(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
        steps:
          - start: server
          - await: {process: server, event: load_done, within: 500ms}
          - start: source-1
        checks:
          - count: {process: source-1, event: heartbeat, max: 0}
        """,
    )
    assert (result.verdict, result.status, result.failed_step) == ("fail", "step_failed", "2")
    assert result.reason == "server did not emit load_done in time"
    assert result.history.first(actor="source-1", f="start") is None  # later steps did not run
    assert "server" in result.stacks
    assert (result.run_dir / "report.html").is_file()


def test_a_process_that_escapes_its_group_is_reported_as_leaked_and_swept(tmp_path: Path) -> None:
    body = (
        SERVER_SOURCE.replace("source-1: {role: source}", "source-1: {role: source, extra_args: [--fake-spawn-child]}")
        + """\
        steps:
          - start: server
          - start: source-1
          - await: {process: source-1, event: heartbeat}
        checks:
          - nothing_leaked: {}
        """
    )
    result = run(tmp_path, body)
    (check,) = [c for c in result.checks if c.kind == "nothing_leaked"]  # beside the implicit nixl_balance
    assert check.valid is False and check.summary.startswith("1 process(es) alive")
    swept = result.history.first(actor="harness", f="swept")
    assert swept is not None and len(swept.get("pids")) == 1
    assert swept.get("alive") == []  # the sweep waited until what it killed was gone


def test_parallel_branches_run_concurrently_and_a_failing_branch_fails_the_step(tmp_path: Path) -> None:
    result = run(
        tmp_path,
        SERVER_SOURCE
        + """\
        steps:
          - start: server
          - parallel:
              - [{start: source-1}, {await: {process: source-1, event: heartbeat}}]
              - [{sleep: 300ms}, {mark: slept}]
          - parallel:
              - {sleep: 5s}
              - {await: {process: server, event: load_done, within: 300ms}}
        """,
    )
    assert result.status == "step_failed" and result.failed_step == "3.2.1"
    marks = result.history.select(actor="harness", f="mark")
    assert [m.get("mark") for m in marks] == ["slept"]
    assert result.seconds < 4  # the sleeping branch was woken, not waited for
