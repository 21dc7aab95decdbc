"""The machine's load, recorded with every run (``harness.record.load``) and shown beside failures."""

from __future__ import annotations

from harness.record.load import load_sample, load_text, oversubscribed, run_load
from harness.record.timeline import History


def test_a_sample_has_the_load_the_cpus_and_the_load_per_cpu() -> None:
    sample = load_sample()
    assert sample["cpus"] >= 1 and sample["load1"] >= 0
    assert abs(sample["per_cpu"] - sample["load1"] / sample["cpus"]) < 0.01
    assert sample["cpu_pressure"] is None or 0 <= sample["cpu_pressure"] <= 100


def test_a_run_on_an_oversubscribed_machine_says_so_and_a_quiet_one_does_not() -> None:
    busy = {"load1": 7.5, "load5": 6.0, "load15": 3.0, "cpus": 2, "per_cpu": 3.75, "cpu_pressure": 88.0}
    calm = {"load1": 0.4, "load5": 0.3, "load15": 0.2, "cpus": 2, "per_cpu": 0.2, "cpu_pressure": None}
    h = History.build([(0.0, "invoke", "harness", "run", {"load": calm}), (4.0, "info", "harness", "teardown", {"load": busy})])
    assert oversubscribed(h)
    assert run_load(h) == ("at start load 0.4 on 2 CPUs (0.2 per CPU); "
                           "at teardown load 7.5 on 2 CPUs (3.75 per CPU; CPU pressure 88%)")
    quiet = History.build([(0.0, "invoke", "harness", "run", {"load": calm}), (4.0, "info", "harness", "teardown", {"load": calm})])
    assert not oversubscribed(quiet)
    assert run_load(History.build([(0.0, "invoke", "harness", "run", {})])) == ""  # a run from before loads were recorded
    assert load_text(None) == ""
