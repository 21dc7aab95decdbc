"""Shared fixtures.

``mock_accelerator_backend_cls`` mirrors the fixture a ModelExpress test expects:
an accelerator that claims device memory but needs no device, so manager code
that selects a device runs on a CPU-only machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = [
    "fixtures.metadata_stack",  # the metadata server tests' fixtures (grpc_impl, stack)
    "fixtures.reader_world",  # the reader flow tests' (world, checkpoint, h)
]


class MockAcceleratorBackend:
    name = "mock"
    mem_type = "VRAM"

    def __init__(self) -> None:
        self.devices: list[int] = []
        self.synchronized = 0

    def set_device(self, device_id: int) -> None:
        self.devices.append(device_id)

    def synchronize(self) -> None:
        self.synchronized += 1

    def supports_rdma_p2p(self) -> bool:
        return True


@pytest.fixture
def mock_accelerator_backend_cls() -> type[MockAcceleratorBackend]:
    return MockAcceleratorBackend


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Undo what a test left in ``os.environ``: code run in-process (e.g. ``mxref`` main, which
    applies a UCX transport profile) must not leak into the processes later tests start."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _results_root_of_its_own(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run without ``--out`` writes under the results root (``harness.record.results``), the
    checkout's ``runs/`` by default: each test gets a root of its own, so none writes into the
    checkout or finds another's runs (a test that names the root sets it again)."""
    from harness.record.results import RESULTS_ENV

    monkeypatch.setenv(RESULTS_ENV, str(tmp_path_factory.mktemp("results")))
