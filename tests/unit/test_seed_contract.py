"""Run ModelExpress's own peer-lifecycle test (docs/contract.md#transfer-manager) against mxref's manager.

The seed is NVIDIA's code and is never committed here: when the shared seeds
folder sits next to the repository (``SEEDS`` below), it is copied into a
temporary directory at test time with only its import target rewritten
(``modelexpress.nixl_transfer`` -> ``mxref.transfer.manager``) and the package
header line above its source dropped, then run by a separate pytest with this
repository's ``conftest.py`` (for ``mock_accelerator_backend_cls``). CI clones
have no seeds folder: the test skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO.parent / "shared" / "seeds"


def _seed_file() -> Path | None:
    found = sorted(SEEDS.glob("000_*.txt")) if SEEDS.is_dir() else []
    return found[0] if found else None


def rewrite(text: str) -> str:
    """The seed as a runnable test module for mxref."""
    lines = text.splitlines(keepends=True)
    # The seed files start with a "<package> <version>" line and a blank line before the source.
    if lines and re.fullmatch(r"[A-Za-z0-9_.-]+ \d[\w.+-]*\s*", lines[0]):
        lines = lines[1:]
    body = "".join(lines)
    rewritten = body.replace("from modelexpress.nixl_transfer import", "from mxref.transfer.manager import")
    rewritten = rewritten.replace('"modelexpress.nixl_transfer.atexit.', '"mxref.transfer.manager.atexit.')
    assert "modelexpress.nixl_transfer" not in rewritten, "an import of the seed was not rewritten"
    return rewritten


def test_rewrite_changes_only_the_import() -> None:
    text = (
        "modelexpress-client 0.7.0\n\n# header\nfrom modelexpress.nixl_transfer import NixlTransferManager\n"
        'x = patch("modelexpress.nixl_transfer.atexit.register")\n'
    )
    assert rewrite(text) == (
        "\n# header\nfrom mxref.transfer.manager import NixlTransferManager\n"
        'x = patch("mxref.transfer.manager.atexit.register")\n'
    )


@pytest.mark.skipif(_seed_file() is None, reason=f"no ModelExpress peer-lifecycle test in {SEEDS} (CI clones do not carry the seeds)")
def test_seed_000_passes_against_mxref(tmp_path: Path) -> None:
    seed = _seed_file()
    assert seed is not None
    work = tmp_path / "seed000"
    work.mkdir()
    test_file = work / "test_seed_000_peer_lifecycle.py"
    test_file.write_text(rewrite(seed.read_text()))
    shutil.copy(REPO / "tests" / "conftest.py", work / "conftest.py")
    (work / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:mxchaos", "-q",
         "--rootdir", str(work), "-c", str(work / "pytest.ini"), str(test_file)],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report[-4000:]
    summary = report.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, summary
