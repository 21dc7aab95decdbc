"""Capabilities: what this machine lets a fault do, probed before a run starts.

A fault kind declares ``requires`` (``Fault.requires``, e.g. ``("root", "ss")``). A
scenario whose faults need a capability this machine lacks is not run: its verdict is
``skip``, with the missing capabilities named (``mxchaos run``; ``pytest.skip`` in the
plugin). Validation does not probe: a file is valid even where it cannot run.

Capabilities::

    root        the effective uid is 0
    toxiproxy   ``toxiproxy-server`` next to this Python (``<venv>/bin``) or on PATH
    netns       root, and ``ip`` (iproute2) on PATH
    fuse        ``/dev/fuse`` and libfuse 3 that mfusepy loads (``disk`` faults mount a FUSE layer)
    timens      the kernel has time namespaces (``/proc/self/ns/time``; ``clock`` faults start a process in one)
    faketime    libfaketime (Debian's ``faketime``: ``wall_clock`` faults preload it into a process)
    <subject>-env  a subject's environment is built (``harness.subjects``: ``modelexpress-env``)
    modelexpress-server  the real ModelExpress server is built (``harness.subjects.mx_server``;
                ``.ci/bootstrap`` builds it into the cache), for a ``server`` with ``subject: modelexpress``
    cuda        a GPU: ``nvidia-smi -L`` lists one, else a ``/dev/nvidia<N>`` exists (``HARDWARE_PROBE``)
    rdma        an RDMA device: ``/sys/class/infiniband/*``, else ``ibv_devices`` lists one
    inventory   never here: hosts that ``requires:`` hardware (``hosts: {a: {requires: {accelerator:
                cuda, transport: rdma}}}``) run only on an inventory's machines (``--inventory``),
                which ``harness.hosts.ssh.missing_on_ssh`` probes over ssh with the same ``HARDWARE_PROBE``
    <other>     a program of that name on PATH (``ss``, ``tc``, ``iptables`` ...)

``MXCHAOS_MISSING_CAPABILITIES=root,tc`` makes the listed capabilities count as missing,
to see what a machine without them would skip (and to test the skip path).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness.clocks import FAKETIME_LIBRARIES

__all__ = [
    "ENV_MISSING",
    "HARDWARE_PROBE",
    "Hardware",
    "hardware_lacks",
    "hardware_probe",
    "parse_hardware",
    "PROBES",
    "describe_missing",
    "have",
    "missing",
    "scenario_requirements",
    "toxiproxy_server",
]

ENV_MISSING = "MXCHAOS_MISSING_CAPABILITIES"


def _root() -> bool:
    return os.geteuid() == 0


def toxiproxy_server() -> str | None:
    """The ``toxiproxy-server`` binary: the one installed next to this Python, else PATH."""
    beside = Path(sys.prefix) / "bin" / "toxiproxy-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("toxiproxy-server")


def _netns() -> bool:
    return _root() and shutil.which("ip") is not None


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


def _local_hardware() -> Hardware:
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


def _fuse() -> bool:
    """``/dev/fuse``, and mfusepy finding libfuse (it loads the library on import)."""
    if not os.path.exists("/dev/fuse"):
        return False
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def _mx_server_built() -> bool:
    from harness.subjects.mx_server import server_binary

    return server_binary() is not None


# Capabilities that are not simply a program on PATH.
PROBES: dict[str, Callable[[], bool]] = {
    "root": _root,
    "fuse": _fuse,
    "timens": lambda: os.path.exists("/proc/self/ns/time"),  # time namespaces (Linux 5.6+): the clock fault
    "faketime": lambda: any(os.path.exists(path) for path in FAKETIME_LIBRARIES),  # the wall_clock fault
    "toxiproxy": lambda: toxiproxy_server() is not None,
    "netns": _netns,
    "cuda": lambda: _local_hardware().gpus > 0,
    "rdma": lambda: bool(_local_hardware().rdma),
    "inventory": lambda: False,  # hardware hosts are an inventory's machines (harness.hosts.ssh.missing_on_ssh)
    "modelexpress-server": _mx_server_built,
}



def _forced_missing() -> set[str]:
    raw = os.environ.get(ENV_MISSING, "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def have(capability: str) -> bool:
    """Whether this machine has ``capability`` (not cached: probes are cheap)."""
    if capability in _forced_missing():
        return False
    probe = PROBES.get(capability)
    if probe is not None:
        return bool(probe())
    if capability.endswith("-env"):  # a subject's environment (harness.subjects), built on first use
        from harness.subjects import env_ready
        from harness.subjects.envs import SUBJECTS

        subject = capability.removesuffix("-env")
        return subject in SUBJECTS and env_ready(subject)
    return shutil.which(capability) is not None


def missing(capabilities: Iterable[str]) -> list[str]:
    """The capabilities this machine lacks, in the order given, each once."""
    out: list[str] = []
    for capability in capabilities:
        if capability not in out and not have(capability):
            out.append(capability)
    return out


def scenario_requirements(scenario: BaseModel) -> dict[str, list[str]]:
    """Capability -> what of ``scenario`` needs it: its ``netns`` hosts (root, netns), its
    ``proxies`` (toxiproxy), its ``redis`` processes (redis-server), then its faults
    (``name (kind)``) in step order."""
    from harness import faults as fault_registry
    from harness.scenario import FaultStep, iter_steps

    needs: dict[str, list[str]] = {}
    hardware: dict[str, Any] = getattr(scenario, "hardware_hosts", dict)()
    if hardware:  # only an inventory's machines declare (and are probed for) hardware
        needs["inventory"] = [f"host {name} requires {req.describe()}" for name, req in hardware.items()]
    netns_hosts = [name for name, spec in getattr(scenario, "hosts", {}).items() if spec.kind == "netns"]
    if netns_hosts:  # the runner puts each in a network namespace of its own
        needs["root"] = [f"hosts ({', '.join(netns_hosts)})"]
        needs["netns"] = [f"hosts ({', '.join(netns_hosts)})"]
    default = getattr(scenario, "subject", "mxref")
    for name, spec in getattr(scenario, "processes", {}).items():  # each subject but mxref has an env of its own
        role = getattr(spec, "role", "")
        subject = getattr(spec, "subject", None) or (default if role in ("source", "reader") else "mxref")
        if subject != "mxref":  # a server: the subject's server binary (harness.subjects.mx_server)
            needs.setdefault(f"{subject}-server" if role == "server" else f"{subject}-env", []).append(
                f"{name} (subject {subject})")
    proxies = getattr(scenario, "proxies", None)
    if proxies:  # the runner starts a toxiproxy server for them, faults or not
        needs["toxiproxy"] = [f"proxies ({', '.join(proxies)})"]
    stores = [name for name, spec in getattr(scenario, "processes", {}).items() if getattr(spec, "role", None) == "redis"]
    if stores:  # a real redis-server each (harness.redisd)
        needs["redis-server"] = [f"processes ({', '.join(stores)})"]
    counter = 0
    for ref in iter_steps(scenario.steps):  # type: ignore[attr-defined]
        if not isinstance(ref.step, FaultStep):
            continue
        counter += 1
        spec = ref.step.fault
        label = f"{spec.name or f'{spec.kind}-{counter}'} ({spec.kind})"
        cls = fault_registry.REGISTRY.get(spec.kind)
        for capability in getattr(cls, "requires", ()):
            needs.setdefault(capability, []).append(label)
    return needs


def describe_missing(needs: Mapping[str, list[str]]) -> tuple[list[str], str]:
    """The missing capabilities of a requirement map and one line naming them and their faults
    (empty when nothing is missing)."""
    lacking = missing(needs)
    if not lacking:
        return [], ""
    parts = [f"{cap} (for {', '.join(needs[cap])})" for cap in lacking if cap != "inventory"]
    line = "this machine lacks " + "; ".join(parts) if parts else ""
    if "inventory" in lacking:
        hosts = "; ".join(needs["inventory"])
        line = "; ".join(filter(None, [
            f"needs an inventory with GPU/RDMA hosts (--inventory FILE; hardware is declared and probed there, "
            f"never assumed here): {hosts}", line]))
    return lacking, line
