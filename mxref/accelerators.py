"""Where a process keeps its tensors: host memory (DRAM) or a CUDA device (VRAM).

One small interface, ``AcceleratorBackend``; the NIXL manager and the reader use
nothing else, so a CPU-only machine runs the same code paths as a GPU host.
"""

from __future__ import annotations

from typing import Protocol


class AcceleratorBackend(Protocol):
    name: str  # "cpu" | "cuda" | ... (ModelExpress's accelerator string; "" = unknown)
    mem_type: str  # NIXL memory type: "DRAM" | "VRAM"

    def set_device(self, device_id: int) -> None: ...

    def synchronize(self) -> None: ...

    def supports_rdma_p2p(self) -> bool: ...


class CpuBackend:
    """Host memory. NIXL's UCX backend moves it over TCP (or RDMA with registered host memory)."""

    name = "cpu"
    mem_type = "DRAM"

    def set_device(self, device_id: int) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def supports_rdma_p2p(self) -> bool:
        return True


class CudaBackend:
    """CUDA device memory through torch (imported only when this backend is chosen)."""

    name = "cuda"
    mem_type = "VRAM"

    def __init__(self) -> None:
        import torch  # noqa: F401  (fails loudly when torch or CUDA is missing)

        if not torch.cuda.is_available():
            raise RuntimeError("accelerator 'cuda' requested but torch.cuda.is_available() is False")
        self._torch = torch

    def set_device(self, device_id: int) -> None:
        self._torch.cuda.set_device(device_id)

    def synchronize(self) -> None:
        # GPUDirect writes bypass torch streams: make them visible before use.
        self._torch.cuda.synchronize()

    def supports_rdma_p2p(self) -> bool:
        return True


BACKENDS = {"cpu": CpuBackend, "cuda": CudaBackend}


def get_backend(name: str) -> AcceleratorBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown accelerator {name!r} (known: {', '.join(BACKENDS)})") from None
    return factory()


def compatible(target: str, source: str) -> bool:
    """Same family always; an empty value means unknown and is accepted (checked again later)."""
    return not target or not source or target == source
