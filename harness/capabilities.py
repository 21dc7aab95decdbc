"""Capabilities: what this machine lets a fault do, probed before a run starts.

A fault kind declares ``requires`` (``Fault.requires``, e.g. ``("root", "ss")``). A
scenario whose faults need a capability this machine lacks is not run: its verdict is
``skip``, with the missing capabilities named (``mxchaos run``; ``pytest.skip`` in the
plugin). Validation does not probe: a file is valid even where it cannot run.

Capabilities::

    root        the effective uid is 0
    toxiproxy   ``toxiproxy-server`` next to this Python (``<venv>/bin``) or on PATH
    netns       root, and ``ip`` (iproute2) on PATH
    <subject>-env  a subject's environment is built (``harness.subjects``: ``modelexpress-env``)
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

from pydantic import BaseModel

__all__ = [
    "ENV_MISSING",
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


# Capabilities that are not simply a program on PATH.
PROBES: dict[str, Callable[[], bool]] = {
    "root": _root,
    "toxiproxy": lambda: toxiproxy_server() is not None,
    "netns": _netns,
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
    netns_hosts = [name for name, spec in getattr(scenario, "hosts", {}).items() if spec.kind == "netns"]
    if netns_hosts:  # the runner puts each in a network namespace of its own
        needs["root"] = [f"hosts ({', '.join(netns_hosts)})"]
        needs["netns"] = [f"hosts ({', '.join(netns_hosts)})"]
    default = getattr(scenario, "subject", "mxref")
    for name, spec in getattr(scenario, "processes", {}).items():  # each subject but mxref has an env of its own
        subject = getattr(spec, "subject", None) or (default if getattr(spec, "role", "") in ("source", "reader") else "mxref")
        if subject != "mxref":
            needs.setdefault(f"{subject}-env", []).append(f"{name} (subject {subject})")
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
    parts = [f"{cap} (for {', '.join(needs[cap])})" for cap in lacking]
    return lacking, "this machine lacks " + "; ".join(parts)
