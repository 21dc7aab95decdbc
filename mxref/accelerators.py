"""Where a process keeps its tensors: host memory (DRAM) or a CUDA device (VRAM).

One small interface, ``AcceleratorBackend``; the NIXL manager and the reader use
nothing else, so a CPU-only machine runs the same code paths as a GPU host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from mxref.model import ALIGN, Arena, TensorSpec, checksum


class AcceleratorBackend(Protocol):
    name: str  # "cpu" | "cuda" | ... (ModelExpress's accelerator string; "" = unknown)
    mem_type: str  # NIXL memory type: "DRAM" | "VRAM"

    def set_device(self, device_id: int) -> None: ...

    def synchronize(self) -> None: ...

    def supports_rdma_p2p(self) -> bool: ...

    def allocate(self, specs: list[TensorSpec], device_id: int = 0, *, hurry: bool = False) -> Any:
        """An empty arena for ``specs`` in this backend's memory (same interface as ``Arena``);
        ``hurry``: a rollback waits for it, so no layout that costs time to set up (huge pages)."""
        ...

    def to_device(self, host: Arena, device_id: int = 0) -> Any:
        """The host arena's contents in this backend's memory (``host`` itself on the CPU)."""
        ...


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

    def allocate(self, specs: list[TensorSpec], device_id: int = 0, *, hurry: bool = False) -> Arena:
        # populated once, zero: a READ target needs no fill; huge pages unless in a hurry (their
        # compaction can cost seconds on a busy machine: mxref.model._populated_anonymous_map)
        return Arena(specs, zeroed_mapping=True, huge_pages=not hurry)

    def to_device(self, host: Arena, device_id: int = 0) -> Arena:
        return host


class CudaArena:
    """An ``Arena`` in device memory: one torch allocation, the host arena's layout.

    Checksums copy each tensor to the host first (integrity is checked on the bytes
    that landed, not on what we meant to write).
    """

    def __init__(self, specs: list[TensorSpec], device_id: int) -> None:
        # late: torch is optional (the torch extra), needed only for CUDA memory
        import torch

        layout = Arena.__new__(Arena)  # reuse the layout rule without allocating host memory
        layout.specs = list(specs)
        layout.offsets, off = [], 0

        for spec in layout.specs:
            layout.offsets.append(off)
            off += -(-spec.nbytes // ALIGN) * ALIGN
        self.specs = layout.specs
        self.offsets = layout.offsets
        self.nbytes = max(off, ALIGN)
        self.device_id = device_id
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=f"cuda:{device_id}")

    @property
    def addr(self) -> int:
        return int(self.buffer.data_ptr())

    def regions(self) -> list[tuple[int, int]]:
        return [(self.addr + off, spec.nbytes) for off, spec in zip(self.offsets, self.specs)]

    def _slice(self, i: int) -> Any:
        return self.buffer[self.offsets[i]:self.offsets[i] + self.specs[i].nbytes]

    def raw(self, i: int) -> Any:
        """Host copy of tensor ``i``'s bytes (numpy)."""
        return self._slice(i).cpu().numpy()

    def checksum(self, i: int) -> str:
        return checksum(self.raw(i))

    def checksums(self) -> list[str]:
        return [self.checksum(i) for i in range(len(self.specs))]

    def fill(self, value: int = 0) -> None:
        self.buffer.fill_(value)

    def copy_from(self, host: Arena) -> None:
        # late: torch is optional (the torch extra), needed only for CUDA memory
        import torch

        for i in range(len(self.specs)):
            self._slice(i).copy_(torch.from_numpy(host.raw(i)))
        torch.cuda.synchronize(self.device_id)

    def tensors(self) -> dict[str, Any]:
        return {s.name: self.raw(i).view(np.dtype(s.dtype)).reshape(s.shape) for i, s in enumerate(self.specs)}

    def release(self) -> None:
        # late: torch is optional (the torch extra), needed only for CUDA memory
        import torch

        self.buffer = torch.empty(0, dtype=torch.uint8, device=f"cuda:{self.device_id}")


class CudaBackend:
    """CUDA device memory through torch (imported only when this backend is chosen)."""

    name = "cuda"
    mem_type = "VRAM"

    def __init__(self) -> None:
        # late: torch is optional (the torch extra), needed only for CUDA memory
        import torch

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

    def allocate(self, specs: list[TensorSpec], device_id: int = 0, *, hurry: bool = False) -> CudaArena:
        return CudaArena(specs, device_id)

    def to_device(self, host: Arena, device_id: int = 0) -> CudaArena:
        arena = CudaArena(host.specs, device_id)
        arena.copy_from(host)
        host.release()
        return arena


BACKENDS: dict[str, Callable[[], AcceleratorBackend]] = {"cpu": CpuBackend, "cuda": CudaBackend}


def get_backend(name: str) -> AcceleratorBackend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown accelerator {name!r} (known: {', '.join(BACKENDS)})") from None
    return factory()


def compatible(target: str, source: str) -> bool:
    """Same family always; an empty value means unknown and is accepted (checked again later)."""
    return not target or not source or target == source
