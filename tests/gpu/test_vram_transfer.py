"""GPU memory over real NIXL between two processes of one host (skipped without CUDA).

What a hardware host must show: a READ from one process's VRAM into another's
completes with every tensor's checksum intact, on UCX over TCP with cuda_copy
staging and on whatever UCX picks by default (cuda_ipc on one host); and what a
frozen source does to each: TCP needs the source to make progress (the READ
times out at its budget), while a same-host cuda_ipc copy may not (as cma on
the CPU). Figures are printed and written to $MXCHAOS_GPU_REPORT when set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported at run time only after the UCX environment is set
    from mxref.transfer.manager import NixlTransferManager

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device", allow_module_level=True)

pytestmark = pytest.mark.gpu

PEER = Path(__file__).with_name("vram_peer.py")
REPORT: dict[str, object] = {}


def _report(key: str, value: object) -> None:
    REPORT[key] = value
    print(f"[gpu] {key}: {json.dumps(value)}")
    path = os.environ.get("MXCHAOS_GPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(REPORT, indent=2))


@pytest.fixture(params=["ucx-tcp-cuda", "default"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _profile_env(transport: str) -> dict[str, str]:
    """This environment without any UCX_* variable, plus the profile's: one run's profile
    must not leak into the next (UCX reads its variables when an agent is created)."""
    from mxref import config

    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env.update(config.TRANSPORT_PROFILES[transport])
    return env


def _start_peer(transport: str, tensors: int, mib: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    from mxref.process import free_port, read_json_line

    env = _profile_env(transport)
    proc = subprocess.Popen(
        [sys.executable, str(PEER), "--transport", transport, "--tensors", str(tensors), "--tensor-mib", str(mib),
         "--port", str(free_port())],
        stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        return proc, read_json_line(proc.stdout, 120, "the VRAM peer")
    except BaseException:
        proc.kill()
        raise


def _reader(transport: str, info: dict[str, Any]) -> tuple[NixlTransferManager, Any, list[SimpleNamespace]]:
    env = _profile_env(transport)
    os.environ.clear()
    os.environ.update(env)
    from mxref.accelerators import get_backend
    from mxref.model import TensorSpec
    from mxref.process import free_port
    from mxref.transfer.manager import LocalTensor, NixlTransferManager

    cuda = get_backend("cuda")
    specs = [TensorSpec(t["name"], (t["size"] // 2,), t["dtype"]) for t in info["tensors"]]
    arena = cuda.allocate(specs, 0)
    arena.fill(0)
    mgr = NixlTransferManager(f"vram-rd-{os.getpid()}-{time.monotonic_ns()}", 0, cuda)
    mgr.create_agent(free_port(), progress_thread=False)
    mgr.register_tensors([LocalTensor(s.name, a, n, s.dtype, 0) for s, (a, n) in zip(arena.specs, arena.regions())])
    mgr.fetch_remote_and_wait(info["agent"], "127.0.0.1", info["port"], 30)
    remote = [SimpleNamespace(name=t["name"], addr=t["addr"], size=t["size"], device_id=0, dtype=t["dtype"])
              for t in info["tensors"]]
    return mgr, arena, remote


@pytest.mark.timeout(300)
def test_vram_read_is_fast_and_intact(transport: str) -> None:
    peer, info = _start_peer(transport, tensors=16, mib=64)  # 1 GiB
    try:
        mgr, arena, remote = _reader(transport, info)
        rates = []
        for _ in range(3):
            arena.fill(0)
            t0 = time.perf_counter()
            nbytes, count, result = mgr.receive_from_source(b"", remote, 60.0, info["agent"], require_exact_match=True)
            rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
        assert result == "complete" and count == 16
        assert arena.checksums() == info["checksums"]
        mgr.shutdown()
        _report(f"vram_read_gbps[{transport}]", [round(r, 2) for r in rates])
    finally:
        peer.kill()
        peer.wait(10)


@pytest.mark.timeout(300)
def test_frozen_vram_source(transport: str) -> None:
    """Records whether a frozen source wedges the READ (timeout) or not (same-host copy)."""
    from mxref.errors import TransferTimeout

    peer, info = _start_peer(transport, tensors=4, mib=64)
    try:
        mgr, arena, remote = _reader(transport, info)
        mgr.receive_from_source(b"", remote, 30.0, info["agent"])  # warm connection
        os.killpg(peer.pid, signal.SIGSTOP)
        arena.fill(0)
        t0 = time.perf_counter()
        try:
            mgr.receive_from_source(b"", remote, 3.0, info["agent"])
            outcome = "completed while frozen"
        except TransferTimeout:
            outcome = "timed out"
        seconds = time.perf_counter() - t0
        os.killpg(peer.pid, signal.SIGCONT)
        _report(f"frozen_source[{transport}]", {"outcome": outcome, "seconds": round(seconds, 3),
                                                "healthy_after": mgr.is_healthy()})
        if outcome == "timed out":
            assert 3.0 <= seconds < 6.0
            assert not mgr.is_healthy()
        mgr.shutdown()
    finally:
        try:
            os.killpg(peer.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        peer.kill()
        peer.wait(10)
