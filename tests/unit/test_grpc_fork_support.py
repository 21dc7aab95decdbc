"""gRPC's fork support is off in every process of ours (mxref/__init__.py says why): a child
started beside live channels must not abort before its exec. The setting has to be in the
environment before grpc is imported, and children inherit it."""

from __future__ import annotations

import os
import subprocess
import sys


def _fork_support_after(imports: str, env_value: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    if env_value is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = env_value
    code = f"{imports}; import os, subprocess, sys; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT')); " \
           "print(subprocess.run([sys.executable, '-c', \"import os; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\"], " \
           "capture_output=True, text=True, check=True).stdout.strip())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=60)
    return out.stdout.strip()


def test_importing_mxref_or_the_harness_turns_it_off_for_the_process_and_its_children() -> None:
    assert _fork_support_after("import mxref.metadata.transport") == "0\n0"
    assert _fork_support_after("import harness.engine.runner") == "0\n0"


def test_a_callers_own_setting_is_kept() -> None:
    assert _fork_support_after("import harness", env_value="1") == "1\n1"
