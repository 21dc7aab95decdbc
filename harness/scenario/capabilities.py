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
                which ``missing_on_ssh`` probes over ssh with the same ``HARDWARE_PROBE``
    <other>     a program of that name on PATH (``ss``, ``tc``, ``iptables`` ...)

``MXCHAOS_MISSING_CAPABILITIES=root,tc`` makes the listed capabilities count as missing,
to see what a machine without them would skip (and to test the skip path).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness import faults as fault_registry
from harness.errors import HarnessError, HostError
from harness.faults import Fault
from harness.hosts.clocks import FAKETIME_LIBRARIES
from harness.hosts.hardware import HARDWARE_PROBE, Hardware, hardware_lacks, hardware_probe, local_hardware, parse_hardware
from harness.hosts.inventory import Inventory, bind_hosts
from harness.hosts.ssh import SshHost
from harness.scenario.steps import FaultStep, iter_steps
from harness.subjects import env_ready
from harness.subjects.envs import SUBJECTS
from harness.subjects.mx_server import server_binary

__all__ = [
    "missing_on_ssh",
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


def _fuse() -> bool:
    """``/dev/fuse``, and mfusepy finding libfuse (it loads the library on import)."""
    if not os.path.exists("/dev/fuse"):
        return False
    try:
        import mfusepy  # noqa: F401  # late: importing it is the probe (it loads libfuse)
    except (ImportError, OSError):
        return False
    return True


def _mx_server_built() -> bool:
    return server_binary() is not None


# Capabilities that are not simply a program on PATH.
PROBES: dict[str, Callable[[], bool]] = {
    "root": _root,
    "fuse": _fuse,
    "timens": lambda: os.path.exists("/proc/self/ns/time"),  # time namespaces (Linux 5.6+): the clock fault
    "faketime": lambda: any(os.path.exists(path) for path in FAKETIME_LIBRARIES),  # the wall_clock fault
    "toxiproxy": lambda: toxiproxy_server() is not None,
    "netns": _netns,
    "cuda": lambda: local_hardware().gpus > 0,
    "rdma": lambda: bool(local_hardware().rdma),
    "inventory": lambda: False,  # hardware hosts are an inventory's machines (missing_on_ssh)
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
    if stores:  # a real redis-server each (harness.subjects.redisd)
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


LACK_WHY = {  # what a lack means, where its name alone does not say
    "root-login": "the ssh login is not uid 0; a process starts as the login, never through sudo",
    "unshare": "util-linux's unshare is not on its PATH",
    "timens": "no /proc/self/ns/time: a kernel without time namespaces (before 5.6)",
    "faketime": "no libfaketime in " + ", ".join(FAKETIME_LIBRARIES) + ": apt-get install faketime",
}


def _needed_on(sc: Any, spec: Any, cls: type[Fault[Any, Any]]) -> set[str] | None:
    """The scenario hosts a fault's ``ssh_needs`` are needed on (None: every host)."""
    target = getattr(spec, "target", None)
    if cls.needs_on_target_host and isinstance(target, str) and target in sc.processes:
        return {sc.host_of(target)}
    return None


def missing_on_ssh(sc: Any, inventory: Inventory, run_id: str, run_dir: Path) -> tuple[list[str], str]:
    """What the scenario needs that its bound ssh hosts lack (the run is then a SKIP naming the
    host and the lack): each host's capabilities are probed over ssh (``SshHost.capabilities``);
    toxiproxy proxies and faults without an ssh lever (``toxic``, ``proxy_down``) are lacking everywhere."""
    try:
        bound = bind_hosts(list(sc.hosts), inventory, scenario=sc.name)
    except HarnessError as exc:  # more hosts than machines: the inventory cannot run it
        return ["ssh-host"], str(exc)
    lacks: list[str] = []
    if getattr(sc, "proxies", None):
        lacks.append(f"proxies ({', '.join(sc.proxies)}): toxiproxy runs on the harness, not reachable from ssh hosts yet")
    wanted: dict[str, tuple[list[str], set[str] | None]] = {}  # fault -> (its needs, the hosts they are needed on; None: all)
    network = False  # a network fault: its commands act on the data device
    for ref in iter_steps(sc.steps):
        if not isinstance(ref.step, FaultStep):
            continue
        spec = ref.step.fault
        cls = fault_registry.REGISTRY.get(spec.kind)
        label = f"{spec.name or spec.kind} ({spec.kind})"
        if cls is not None and cls.ssh_needs is not None:
            wanted.setdefault(label, (list(cls.ssh_needs), _needed_on(sc, spec, cls)))
            network = network or not cls.needs_on_target_host
        elif cls is not None and cls.no_ssh_lever is not None:
            lacks.append(f"fault {label}: no lever on ssh hosts yet ({cls.no_ssh_lever})")
        elif cls is not None and (spec.host_kinds or {"netns", "iptables", "tc", "ss"} & set(cls.requires)):
            lacks.append(f"fault {label}: no lever on ssh hosts yet")
    hardware = sc.hardware_hosts()  # hosts that require a GPU / an RDMA NIC: declared and probed
    hardware_short = 0
    if wanted or hardware:
        for host, machine in bound.items():
            profile = inventory.machines[machine]
            probe = SshHost(host, machine, profile, f"{run_id}-probe", run_dir)
            try:
                have = probe.capabilities(hardware=host in hardware)
            except HostError as exc:
                lacks.append(str(exc))
                continue
            finally:
                probe.close_master()
            for label, (needs, on) in wanted.items():
                short = [n for n in needs if n not in have and (on is None or host in on)]
                if short:
                    lacks.append(f"fault {label}: host {host} (machine {machine}) lacks "
                                 + ", ".join(f"{n} ({LACK_WHY[n]})" if n in LACK_WHY else n for n in short))
            if host in hardware and probe.hardware is not None:
                acc = profile.accelerator
                short_hw = hardware_lacks(hardware[host], probe.hardware, accelerator=acc.kind, device=acc.device,
                                          transport=profile.transport, data_device=profile.data.device, netdev_needed=network)
                hardware_short += bool(short_hw)
                lacks += [f"host {host} (machine {machine}): {lack}" for lack in short_hw]
    kinds = ["ssh-host"] + (["hardware"] if hardware_short else [])
    return (kinds, "ssh hosts: " + "; ".join(lacks)) if lacks else ([], "")
