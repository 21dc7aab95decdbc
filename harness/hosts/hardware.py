"""What hardware a host has (GPUs, RDMA devices, the RDMA port behind a network device): one
shell probe, run here or on an ssh host, its parsed answer, and what a host's ``requires`` lacks."""

from __future__ import annotations

import shlex
import subprocess

from pydantic import BaseModel

__all__ = ["HARDWARE_PROBE", "Hardware", "hardware_lacks", "hardware_probe", "local_hardware", "parse_hardware"]

# The hardware a host has, as one shell line (run here, or on an ssh host by SshHost.capabilities):
# GPUs (nvidia-smi -L, else /dev/nvidia<N>), RDMA devices (/sys/class/infiniband, else
# ibv_devices) and, given a network device, the RDMA devices behind it (its RoCE/IB port).
HARDWARE_PROBE = (
    "n=0; command -v nvidia-smi >/dev/null 2>&1 && n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); "
    "[ \"$n\" -gt 0 ] 2>/dev/null || n=$(ls /dev 2>/dev/null | grep -c '^nvidia[0-9][0-9]*$'); "
    "echo \"hw-cuda-gpus $n\"; "
    "r=$(ls /sys/class/infiniband 2>/dev/null | tr '\\n' ' '); "
    "[ -n \"$r\" ] || r=$(ibv_devices 2>/dev/null | awk 'NR>2 {print $1}' | tr '\\n' ' '); "
    "echo \"hw-rdma-devices $r\""
)


def hardware_probe(device: str | None = None) -> str:
    """``HARDWARE_PROBE``, plus the RDMA devices behind network device ``device`` when given."""
    if device is None:
        return HARDWARE_PROBE
    quoted = shlex.quote(f"/sys/class/net/{device}/device/infiniband")
    return HARDWARE_PROBE + f"; echo \"hw-rdma-netdev $(ls {quoted} 2>/dev/null | tr '\\n' ' ')\""


class Hardware(BaseModel):
    """What ``HARDWARE_PROBE`` found: the GPU count, the RDMA devices, and those behind the
    probed network device (None: not probed)."""

    gpus: int = 0
    rdma: tuple[str, ...] = ()
    netdev_rdma: tuple[str, ...] | None = None


def parse_hardware(output: str) -> Hardware:
    """The ``hw-*`` lines of the probe's output (other lines are ignored)."""
    gpus = 0
    rdma: tuple[str, ...] = ()
    netdev_found: tuple[str, ...] | None = None
    for line in output.splitlines():
        key, _, rest = line.strip().partition(" ")
        if key == "hw-cuda-gpus":
            gpus = int(rest) if rest.strip().isdigit() else 0
        elif key == "hw-rdma-devices":
            rdma = tuple(rest.split())
        elif key == "hw-rdma-netdev":
            netdev_found = tuple(rest.split())
    return Hardware(gpus=gpus, rdma=rdma, netdev_rdma=netdev_found)


def local_hardware() -> Hardware:
    try:
        done = subprocess.run(["sh", "-c", HARDWARE_PROBE], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return Hardware()
    return parse_hardware(done.stdout)


def hardware_lacks(
    requires: BaseModel, hw: Hardware, *, accelerator: str, device: int | None, transport: str | None,
    data_device: str | None = None, netdev_needed: bool = False,
) -> list[str]:
    """What a machine lacks of a host's ``requires`` (``HostRequires``): each lack says whether
    the inventory does not declare it, the probe did not find it, or both. ``netdev_needed``: a
    network fault acts on ``data_device``, so it must carry the RDMA traffic (an RDMA port's
    netdev), or the fault would not touch it."""
    lacks: list[str] = []
    if getattr(requires, "accelerator", None) == "cuda":
        why = []
        if accelerator != "cuda":
            why.append(f"the inventory declares accelerator {accelerator} (give accelerator: {{kind: cuda, device: N}})")
        if hw.gpus == 0:
            why.append("probed: nvidia-smi -L lists no GPU and there is no /dev/nvidia<N>")
        elif device is not None and device >= hw.gpus:
            why.append(f"probed: cuda device {device} declared, {hw.gpus} GPU(s) found")
        if why:
            lacks.append("no cuda: " + "; ".join(why))
    if getattr(requires, "transport", None) == "rdma":
        why = []
        if transport != "rdma":
            why.append(f"the inventory declares transport {transport or 'none'} (give transport: rdma)")
        if not hw.rdma:
            why.append("probed: no /sys/class/infiniband device and ibv_devices lists none")
        elif netdev_needed and data_device and not hw.netdev_rdma:
            why.append(f"probed: data device {data_device} has no RDMA device behind it (a network fault there "
                       f"would not touch RDMA traffic; RDMA devices: {', '.join(hw.rdma)})")
        if why:
            lacks.append("no rdma: " + "; ".join(why))
    return lacks
