"""An arena's tensors as the transfer manager registers them (``LocalTensor``: name, address,
size, dtype, device): a source registers what it serves, a reader what it lands."""

from __future__ import annotations

from mxref.model import Arena
from mxref.transfer.manager import LocalTensor


def local_tensors(arena: Arena, device_id: int = 0) -> list[LocalTensor]:
    return [
        LocalTensor(name=s.name, addr=addr, size=size, dtype=s.dtype, device_id=device_id)
        for s, (addr, size) in zip(arena.specs, arena.regions())
    ]
