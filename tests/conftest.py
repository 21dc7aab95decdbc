"""Shared fixtures.

``mock_accelerator_backend_cls`` mirrors the fixture a ModelExpress test expects:
an accelerator that claims device memory but needs no device, so manager code
that selects a device runs on a CPU-only machine.
"""

from __future__ import annotations

import pytest


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
