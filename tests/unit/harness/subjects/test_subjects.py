"""Who plays the sources and readers (``harness.subjects``): the scenario key and its per-process
override, the command each role gets, the capability a missing subject environment is, and
what ``versions.json`` records."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.engine import launch
from harness.errors import ScenarioInvalid
from harness.scenario import Scenario, capabilities, parse_scenario
from harness.subjects import ADAPTER_MODULE, REPO, subject_versions, subjects_of
from harness.subjects.envs import SUBJECTS, subject_env_dir

MIXED = """\
name: mixed
subject: {default}
processes:
  server: {{role: server}}
  source-1: {{role: source}}
  reader-mx: {{role: reader, subject: modelexpress}}
  reader-ref: {{role: reader, subject: mxref}}
steps:
  - start: [server, source-1, reader-mx, reader-ref]
"""


def load(default: str = "mxref") -> Scenario:
    return parse_scenario(textwrap.dedent(MIXED.format(default=default)), "x.yaml")


def place(tmp_path: Path, name: str) -> launch.Placement:
    return launch.Placement(run_dir=tmp_path, events_path=tmp_path / f"{name}.jsonl", log_path=tmp_path / f"{name}.log",
                            host_address="127.0.0.1", in_netns=False, incarnation=1, server_address="127.0.0.1:1")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MXCHAOS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_each_source_and_reader_is_started_by_its_subject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    sc = load()
    mx_python = str(subject_env_dir(SUBJECTS["modelexpress"]) / "bin" / "python")
    reader_mx = launch.process_argv(sc, "reader-mx", place(tmp_path, "reader-mx"))
    # the subject's env python, with this checkout on PYTHONPATH (the env holds no copy of the project)
    assert reader_mx[:6] == ["env", f"PYTHONPATH={REPO}", mx_python, "-m", ADAPTER_MODULE, "reader"]
    assert "--server" in reader_mx and "--transport" in reader_mx  # the same flags an mxref reader gets
    for name in ("server", "source-1", "reader-ref"):
        argv = launch.process_argv(sc, name, place(tmp_path, name))
        assert argv[1:3] == ["-m", "mxref"], (name, argv)
    # the run's checkpoint is always written by mxref, whoever reads it
    assert launch.prepare_argv(sc, "reader-mx", tmp_path, tmp_path / "ck.safetensors")[1:4] == ["-m", "mxref", "prepare"]


def test_a_given_pythonpath_goes_before_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # mxchaos mutate runs the selection with its mutated copy of mxref (the adapter too) first on PYTHONPATH
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'scratch'}:")
    argv = launch.process_argv(load(), "reader-mx", place(tmp_path, "reader-mx"))
    assert argv[:2] == ["env", f"PYTHONPATH={tmp_path / 'scratch'}:{REPO}"]


def test_the_scenario_default_and_the_cli_override(tmp_path: Path) -> None:
    sc = load("modelexpress")
    assert launch.process_argv(sc, "source-1", place(tmp_path, "source-1"))[3:5] == ["-m", ADAPTER_MODULE]
    assert launch.process_argv(sc, "reader-ref", place(tmp_path, "reader-ref"))[1:3] == ["-m", "mxref"]
    back = sc.with_subject("mxref")
    assert launch.process_argv(back, "source-1", place(tmp_path, "source-1"))[1:3] == ["-m", "mxref"]
    assert subjects_of(sc) == {"modelexpress", "mxref"} and subjects_of(back) == {"modelexpress", "mxref"}


def test_an_unknown_subject_names_the_key() -> None:
    with pytest.raises(ScenarioInvalid) as caught:
        parse_scenario(textwrap.dedent(MIXED.format(default="vllm")), "x.yaml")
    assert "subject" in caught.value.render()


def test_a_subject_without_its_environment_is_a_missing_capability() -> None:
    needs = capabilities.scenario_requirements(load())
    assert needs["modelexpress-env"] == ["reader-mx (subject modelexpress)"]
    lacking, why = capabilities.describe_missing(needs)
    assert lacking == ["modelexpress-env"] and "reader-mx (subject modelexpress)" in why
    assert "modelexpress-env" not in capabilities.scenario_requirements(load().with_subject("mxref").model_copy(
        update={"processes": {k: v for k, v in load().processes.items() if k != "reader-mx"}}))


def test_versions_record_who_played(cache: Path) -> None:
    versions = subject_versions(load())
    assert versions["modelexpress"]["version"] == "0.7.0"
    assert versions["modelexpress"]["requirements"] == ["modelexpress[metrics]==0.7.0"]
    assert versions["modelexpress"]["environment"].startswith(str(cache))
    assert versions["mxref"]["version"] == "this repository"
