"""The per-subject environment: built once with the pinned client, reused until its inputs change.

pip is faked (``FakePip`` records the steps); the real build (torch and its CUDA libraries,
about 3 GB of wheels) is exercised by the subject's integration test where the env is cached.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.subjects.envs import SUBJECTS, ensure_subject_env, inputs_hash, subject_env_dir

MX = SUBJECTS["modelexpress"]


class FakePip:
    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("")
        if "wheel" in argv and "--wheel-dir" in argv:  # the native extension's build: a wheel appears
            (Path(argv[argv.index("--wheel-dir") + 1]) / "mxref_native-0.1.0-cp311-abi3-linux_x86_64.whl").write_text("")
        if self.fail and any(self.fail in a for a in argv):
            return subprocess.CompletedProcess(argv, 1, "", "ERROR: No matching distribution found for torch>=2.6.0\n")
        return subprocess.CompletedProcess(argv, 0, "", "")


def _repo(tmp_path: Path, deps: str = "numpy", readme: str = "") -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "pyproject.toml").write_text(f"# {readme}\n[project]\nname='x'\ndependencies=['{deps}']\n")
    return repo


def test_the_env_holds_nixl_the_project_and_the_pinned_client(tmp_path: Path) -> None:
    repo, root, pip = _repo(tmp_path), tmp_path / "cache", FakePip()
    env = ensure_subject_env(MX, repo, root=root, run=pip)
    assert env.ok and not env.cached and env.path == root / "envs" / "subject-modelexpress-0.7.0"
    assert env.version == "modelexpress==0.7.0"
    steps = [" ".join(c) for c in pip.calls]
    assert any("--no-deps nixl-cu12==1.5.1 nixl-cu13==1.5.1 nixl==1.5.1" in s for s in steps)
    assert any(s.endswith("--disable-pip-version-check numpy") for s in steps)  # the project's dependencies
    assert not any(" -e " in s for s in steps)  # not the project: runs put their own checkout on PYTHONPATH
    assert any(s.endswith("modelexpress[metrics]==0.7.0") for s in steps)
    assert "import torch, nixl._api, modelexpress" in pip.calls[-4][-1]
    assert pip.calls[-1][-2:] == ["-c", "import mxref_native"]  # the checkout's native extension, as in a matrix env
    assert (env.path / ".mxchaos-native").is_file()
    assert (env.path / ".mxchaos-subject-stamp").read_text().startswith(inputs_hash(MX, repo))


def test_it_is_reused_until_the_project_dependencies_change(tmp_path: Path) -> None:
    repo, root, pip = _repo(tmp_path), tmp_path / "cache", FakePip()
    ensure_subject_env(MX, repo, root=root, run=pip)
    n = len(pip.calls)
    _repo(tmp_path, readme="a comment, not a dependency")
    again = ensure_subject_env(MX, repo, root=root, run=pip)
    assert again.ok and again.cached and len(pip.calls) == n
    _repo(tmp_path, deps="numpy>=2")
    rebuilt = ensure_subject_env(MX, repo, root=root, run=pip)
    assert rebuilt.ok and not rebuilt.cached and len(pip.calls) == 2 * n - 1  # the native wheel: cached


def test_a_failed_build_is_remembered_with_its_reason(tmp_path: Path) -> None:
    repo, root, pip = _repo(tmp_path), tmp_path / "cache", FakePip(fail="modelexpress[metrics]")
    env = ensure_subject_env(MX, repo, root=root, run=pip)
    assert env.error == "subject: ERROR: No matching distribution found for torch>=2.6.0"
    n = len(pip.calls)
    again = ensure_subject_env(MX, repo, root=root, run=pip)
    assert again.error == env.error and again.cached and len(pip.calls) == n
    ensure_subject_env(MX, repo, root=root, run=pip, rebuild=True)
    assert len(pip.calls) > n


def test_mxref_needs_no_env_of_its_own(tmp_path: Path) -> None:
    env = ensure_subject_env(SUBJECTS["mxref"], _repo(tmp_path), root=tmp_path, run=FakePip())
    assert not env.ok and "project's own environment" in (env.error or "")
    assert not subject_env_dir(SUBJECTS["mxref"], tmp_path).exists()
