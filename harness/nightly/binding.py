"""Where a night's scenarios run: a binding decides, per scenario, whether it can run here and
runs it.

``binding_for(inventory)`` is the one place the night chooses a binding:

* no inventory: ``HereBinding``: the scenario's ``local`` and ``netns`` hosts on this machine,
  as ``mxchaos run`` runs them; a scenario needing a capability this machine lacks
  (``harness.scenario.capabilities``) is skipped with that reason, before anything starts.
* ``--inventory FILE``: ``inventory_binding(FILE)``: ``InventoryBinding``, the scenario's
  logical hosts bound to the inventory's machines by ``harness.hosts.inventory.bind_hosts`` (``bind:``,
  then the same name, then the next free machine); a scenario with more hosts than machines is
  skipped naming the host. The runner gets the inventory and runs the hosts over ssh
  (``harness.hosts.ssh``); what a bound host lacks (probed over ssh at the run's start) is the run's
  own SKIP, naming the host and the lack. An invalid inventory is ``InventoryError`` naming the
  file, the key and the rule (exit 2) before anything runs.

``inventory_summary`` describes the file for ``nightly.json`` without depending on its schema
(path, size, sha256 and, when it is a YAML mapping, the machine names under ``machines:``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from harness.judge.verdict import RunResult
from harness.record.timeline import Entry
from harness.scenario import Scenario, capabilities

__all__ = ["Binding", "Bound", "HereBinding", "InventoryBinding", "InventoryError", "binding_for",
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

    def prepare(self, scenarios: Sequence[Scenario], runs_dir: Path, repeat: int, seed: int | None) -> None:
        """Before the night's loop: a binding that runs elsewhere runs them all now (``harness.nightly.slurm``)."""

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult: ...


class HereBinding:
    """This machine: ``local`` hosts as processes, ``netns`` hosts in namespaces (root)."""

    name = "here"

    def bind(self, scenario: Scenario) -> Bound:
        hosts: dict[str, str] = {name: str(spec.kind) for name, spec in scenario.hosts.items()}
        lacking, why = capabilities.describe_missing(capabilities.scenario_requirements(scenario))
        return Bound(hosts, scenario.not_playable() or (why if lacking else None))

    def prepare(self, scenarios: Sequence[Scenario], runs_dir: Path, repeat: int, seed: int | None) -> None:
        """Nothing: each run happens when the night asks for it."""

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult:
        from harness.engine.play import run_scenario  # the night writes and trims the folder itself

        return run_scenario(scenario, out_dir, observers=observers, write=False)


class InventoryBinding:
    """An inventory's machines, over ssh: each logical host on the machine ``bind_hosts`` picks."""

    name = "inventory"

    def __init__(self, path: Path) -> None:
        from harness.hosts.inventory import InventoryInvalid, load_inventory

        self.path = path
        try:
            self.inventory = load_inventory(path)
        except InventoryInvalid as bad:
            raise InventoryError(str(bad)) from None

    def bind(self, scenario: Scenario) -> Bound:
        from harness.errors import HarnessError
        from harness.hosts.inventory import bind_hosts

        try:
            return Bound(bind_hosts(list(scenario.hosts), self.inventory, scenario=scenario.name))
        except HarnessError as exc:
            return Bound({name: "unbound" for name in scenario.hosts}, str(exc))

    def prepare(self, scenarios: Sequence[Scenario], runs_dir: Path, repeat: int, seed: int | None) -> None:
        """Nothing: each run happens when the night asks for it."""

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult:
        from harness.engine.play import run_scenario

        return run_scenario(scenario, out_dir, observers=observers, inventory=self.inventory, write=False)


def inventory_binding(path: Path) -> Binding:
    """The binding for ``--inventory PATH`` (see the module)."""
    return InventoryBinding(path)


def binding_for(inventory: Path | None) -> Binding:
    return HereBinding() if inventory is None else inventory_binding(inventory)


def inventory_summary(path: Path) -> dict[str, Any]:
    """``{path, bytes, sha256, machines}`` of an inventory file; InventoryError naming the file
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
        raise InventoryError(f"--inventory {path}: the inventory must be a YAML mapping (e.g. machines: {{name: {{address: ...}}}})")
    machines = doc.get("machines")
    names = sorted(str(k) for k in machines) if isinstance(machines, dict) else []
    return {"path": str(path.resolve()), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "machines": names}
