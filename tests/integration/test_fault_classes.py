"""The fault classes of the disk, clock, system-call and transport kinds, each against real mxref
processes: its scenario passes, and a planted regression of mxref (``MXREF_SIMULATED_BUG`` in
the process's environment) makes the same scenario FAIL on a check that is not a time bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.runner import Runner
from harness.judge.verdict import RunResult
from harness.machine import procscan
from harness.reports.report import write_run_folder
from harness.scenario import capabilities, load_scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def run(path: Path, tmp_path: Path, bug: dict[str, str] | None = None,
        options: dict[str, dict[str, object]] | None = None, env: dict[str, dict[str, str]] | None = None) -> RunResult:
    """Run scenario ``path``; ``bug``: process name -> the simulated bug planted in it
    (``MXREF_SIMULATED_BUG``); ``options``: process name -> options it runs with instead;
    ``env``: process name -> environment variables added to its own."""
    sc = load_scenario(path)
    procs = dict(sc.processes)
    added = {name: {"MXREF_SIMULATED_BUG": which} for name, which in (bug or {}).items()}
    for name, more in (env or {}).items():
        added.setdefault(name, {}).update(more)
    for name, more in added.items():
        spec = procs[name]
        procs[name] = spec.model_copy(update={"env": {**spec.env, **more}})
    for name, changed in (options or {}).items():
        spec = procs[name]
        opts = spec.options.model_copy(update=changed)  # type: ignore[union-attr]
        procs[name] = spec.model_copy(update={"options": opts})
    sc = sc.model_copy(update={"processes": procs})
    result = Runner(sc, out_dir=tmp_path / "runs", install_signal_handlers=False).run()
    write_run_folder(result)
    assert [p for p in procscan.scan() if p.run_id == result.run_id] == [], "the run left processes behind"
    return result


def failed(result: RunResult) -> dict[str, str]:
    return {c.name: c.summary for c in result.checks if c.valid is False}


def needs(*caps: str) -> pytest.MarkDecorator:
    lacking = capabilities.missing(caps)
    return pytest.mark.skipif(bool(lacking), reason=f"this machine lacks {', '.join(lacking)}")


def fuse_mounts() -> list[str]:
    from harness.faults.disk import FSNAME, mounts_named

    return mounts_named(FSNAME)


@needs("root", "fuse")
def test_disk_eio_passes_and_catches_a_mapped_checkpoint_read(tmp_path: Path) -> None:
    path = SCENARIOS / "disk_fallback_eio.yaml"
    good = run(path, tmp_path / "good")
    assert good.verdict == "pass", failed(good)
    bad = run(path, tmp_path / "bad", {"reader-1": "mapped_checkpoint"})
    assert bad.verdict == "fail"
    assert {"it failed clearly", "exit_codes"} <= set(failed(bad)), failed(bad)
    assert "exited -7" in failed(bad)["exit_codes"]  # SIGBUS
    assert fuse_mounts() == []



@needs("root", "strace")
@pytest.mark.alone  # a crawl judged by stall detection: a neighbour's load would move it
def test_syscall_crawl_judges_by_behaviour_and_catches_a_reader_without_progress_detection(tmp_path: Path) -> None:
    path = SCENARIOS / "incidents" / "nixl2047_reader_recv_crawls.yaml"
    good = run(path, tmp_path / "good")
    # passed (xpass: the known defect did not show), or the known defect (the reader's deadline checks slip behind progress calls blocked
    # in the kernel) on exactly the check it is about
    assert good.verdict == "xpass" or (good.verdict == "xfail" and "the READ was called a stall by progress"
                                      in failed(good)), (good.verdict, failed(good))
    # the regression: one READ handle bounded only by its budget (no stall deadline), 10 s here:
    # it can never call a stall, whatever the timing
    bad = run(path, tmp_path / "bad", options={"reader-1": {"read_chunk_mib": 0.0, "transfer_timeout": 10.0}})
    assert bad.verdict == "xfail"  # the checks failed (a known-defect scenario says xfail)
    assert "the READ was called a stall by progress" in failed(bad), failed(bad)


def test_transport_check_passes_over_tcp_and_catches_an_rdma_deployment_running_over_tcp(tmp_path: Path) -> None:
    from harness.checks import RunFacts, evaluate
    from harness.checks.transport import TransportParams

    good = run(SCENARIOS / "transport_is_tcp.yaml", tmp_path)
    assert good.verdict == "pass", failed(good)
    # the same real run judged as an RDMA deployment would be (the field case: a backend meant
    # for RDMA that silently ran over TCP): the check sees the READ lanes over tcp and fails
    rdma = TransportParams(process="reader-1", allow=("rc_mlx5", "rc_verbs", "dc_mlx5", "srd"))
    judged = evaluate(0, "transport", rdma, good.history, RunFacts())
    assert judged.valid is False, judged
    assert "READ lanes over tcp" in judged.summary
    # and with UCX's transport list widened on both peers, this machine (no shared-memory
    # transport under UCX_NET_DEVICES) still reads over tcp: the check says so, not what was asked
    widened = {"UCX_TLS": "all", "UCX_NET_DEVICES": "all"}
    wide = run(SCENARIOS / "transport_is_tcp.yaml", tmp_path / "wide", env={"reader-1": widened, "source-1": widened})
    assert wide.verdict == "pass", failed(wide)


@needs("root", "unshare", "timens")
def test_clock_replica_booted_earlier_passes_and_catches_monotonic_stamps_in_a_shared_store(tmp_path: Path) -> None:
    path = SCENARIOS / "clock_replica_booted_earlier.yaml"
    good = run(path, tmp_path / "good")
    assert good.verdict == "pass", failed(good)
    started = next(e for e in good.history if e.actor == "server-b" and e.f == "start" and e.type == "ok")
    assert started.value["clocks"] == {"monotonic_s": 259200.0, "boottime_s": 259200.0}
    # the replica's events sit where they happened, none set aside by the stamp bounds
    assert not [e for e in good.history if e.actor == "server-b" and "clock_rejected" in e.value]
    # the regression: servers that stamp records with their monotonic clock; alone, or as replicas
    # on one host, that works; here the replica takes server-a's stamps for three days old
    bad = run(path, tmp_path / "bad", {"server-a": "monotonic_stamps", "server-b": "monotonic_stamps"})
    assert bad.verdict == "fail"
    assert {"the replica offered reader-1 both live sources", "the replica's reaper marked no live source STALE"} <= set(
        failed(bad)), failed(bad)


@needs("faketime")
def test_clock_replica_wall_behind_passes_and_catches_a_server_that_distrusts_future_stamps(tmp_path: Path) -> None:
    path = SCENARIOS / "clock_replica_wall_behind.yaml"
    good = run(path, tmp_path / "good")
    assert good.verdict == "pass", failed(good)
    started = next(e for e in good.history if e.actor == "server-b" and e.f == "start" and e.type == "ok")
    assert started.value["clocks"]["realtime_s"] == -2.0
    # the regression: a server that leaves a stamp from its future out of READY listings; right on
    # one machine, it hides every source heartbeating through a replica whose clock is ahead
    bad = run(path, tmp_path / "bad", {"server-b": "future_stamps"})
    assert bad.verdict == "fail"
    assert "the replica offered reader-1 both live sources" in failed(bad), failed(bad)
