"""Where a night's scenarios run: a binding decides, per scenario, whether it can run here and
runs it.

``binding_for(inventory)`` is the one place the night chooses a binding:

* no inventory: ``HereBinding``: the scenario's ``local`` and ``netns`` hosts on this machine,
  as ``mxchaos run`` runs them; a scenario needing a capability this machine lacks
  (``harness.capabilities``) is skipped with that reason, before anything starts.
* ``--inventory FILE``: ``inventory_binding(FILE)``. This build has no ssh hosts yet (issue 9
  item 1), so it returns ``UnboundInventory``, which binds no scenario and says why; the
  night then ends with "no scenario can be bound" (exit 2). To wire the ssh hosts, make
  ``inventory_binding`` return a binding whose ``bind`` maps a scenario's logical hosts onto
  the inventory (or says which host it cannot bind) and whose ``run`` hands the inventory to
  the runner; nothing else in ``harness.nightly`` changes.

``inventory_summary`` describes the file for ``nightly.json`` without depending on its schema
(path, size, sha256 and, when it is a YAML mapping, the names under ``hosts:``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from harness import capabilities
from harness.scenario import Scenario
from harness.timeline import Entry
from harness.verdict import RunResult

__all__ = ["Binding", "Bound", "HereBinding", "InventoryError", "UnboundInventory", "binding_for",
           "inventory_binding", "inventory_summary"]

Observer = Callable[[Entry], None]


class InventoryError(ValueError):
    """``--inventory FILE`` is missing, unreadable or not a YAML mapping (the message names the file)."""


@dataclass(frozen=True)
class Bound:
    """A scenario's hosts as bound (logical host -> where it runs); ``skip`` says why it cannot
    run here (None: it can)."""

    hosts: dict[str, str] = field(default_factory=dict)
    skip: str | None = None


class Binding(Protocol):
    """Decides where a scenario runs, and runs one repeat of it there."""

    name: str

    def bind(self, scenario: Scenario) -> Bound: ...

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult: ...


class HereBinding:
    """This machine: ``local`` hosts as processes, ``netns`` hosts in namespaces (root)."""

    name = "here"

    def bind(self, scenario: Scenario) -> Bound:
        hosts: dict[str, str] = {name: str(spec.kind) for name, spec in scenario.hosts.items()}
        lacking, why = capabilities.describe_missing(capabilities.scenario_requirements(scenario))
        return Bound(hosts, scenario.not_playable() or (why if lacking else None))

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult:
        from harness.runner import Runner  # the runner is heavy; the parser must not need it

        return Runner(scenario, out_dir=out_dir, observers=observers).run()


class UnboundInventory:
    """An inventory this build cannot bind hosts to: every scenario is skipped, saying why."""

    name = "inventory"

    def __init__(self, path: Path) -> None:
        self.path = path

    def bind(self, scenario: Scenario) -> Bound:
        hosts = {name: "unbound" for name in scenario.hosts}
        why = (f"--inventory {self.path}: this harness has no ssh hosts to bind {scenario.name}'s hosts "
               f"({', '.join(scenario.hosts) or 'none'}) to (issue 9 item 1); run without --inventory for "
               "this machine's local and netns hosts")
        return Bound(hosts, why)

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult:
        raise RuntimeError(f"{scenario.name}: cannot run on an unbound inventory ({self.path})")


def inventory_binding(path: Path) -> Binding:
    """The binding for ``--inventory PATH``: the hook where the ssh hosts are wired (see the module)."""
    return UnboundInventory(path)


def binding_for(inventory: Path | None) -> Binding:
    return HereBinding() if inventory is None else inventory_binding(inventory)


def inventory_summary(path: Path) -> dict[str, Any]:
    """``{path, bytes, sha256, hosts}`` of an inventory file; InventoryError naming the file
    and the rule when it is missing, unreadable or not a YAML mapping."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError(f"--inventory {path}: no such file") from None
    except IsADirectoryError:
        raise InventoryError(f"--inventory {path}: a folder; give the inventory file (YAML)") from None
    except OSError as exc:
        raise InventoryError(f"--inventory {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InventoryError(f"--inventory {path}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise InventoryError(f"--inventory {path}: the inventory must be a YAML mapping (e.g. hosts: {{name: {{address: ...}}}})")
    hosts = doc.get("hosts")
    names = sorted(str(k) for k in hosts) if isinstance(hosts, dict) else []
    return {"path": str(path.resolve()), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "hosts": names}
