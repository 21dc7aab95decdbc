"""Inventories: the machines a scenario's logical hosts run on when they are reached over ssh.

An inventory is a YAML file (``mxchaos run --inventory FILE``, ``pytest --mxchaos-inventory
FILE``; ``mxchaos lab up --inventory-out FILE`` writes one)::

    defaults:                      # optional: merged under every machine (env maps merge too)
      user: root
      identity_file: keys/id_ed25519        # relative paths are relative to this file
      known_hosts: {policy: strict, file: known_hosts}   # or a bare policy: accept-new | off
      python: /opt/mxchaos/.venv/bin/python # or venv: /opt/mxchaos/.venv
      repo: /opt/mxchaos                    # the project checkout there (put on PYTHONPATH)
      work_dir: /srv/mxchaos/work           # per-run folders go under it (default ~/.cache/mxchaos/work);
                                            # the login's, 0700, no symlink, parent writable by no one else
    machines:
      gpu-a:
        address: 10.0.0.11                  # where ssh reaches it (the management network)
        port: 22
        data: {address: 10.1.0.11, device: ens1f0}  # NIXL/gRPC traffic; network faults act here
        transport: rdma                     # rdma | ucx-tcp-any | ucx-tcp-cuda | ucx-tcp
        accelerator: {kind: cuda, device: 0}
        env: {UCX_RC_TIMEOUT: 1s}
        sudo: true                          # network faults run their commands with sudo -n
      gpu-b: {address: 10.0.0.12, data: {address: 10.1.0.12, device: ens1f0}}
    bind: {ctl: gpu-a}                      # optional: scenario host -> machine

**Binding** (``bind_hosts``): each logical host of a scenario (its ``hosts:``, in the order
written; a scenario without ``hosts:`` has the one host ``local``) goes to, in this order of
preference: the machine ``bind:`` names for it; the machine of the same name; else the next
machine, in inventory order, that no other host of the scenario got. Only an explicit ``bind:``
puts two hosts on one machine. A scenario with more hosts than can be bound is an error naming
the host. The scenario file is the same one that runs on ``netns`` hosts: only the binding changes.

Bad input raises ``InventoryInvalid`` listing every problem with the file, line, key path and
rule, like a scenario file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError, model_validator

from harness.errors import HarnessError, Issue
from harness.locate import duplicate_keys, expansion_problem, issue_from_pydantic, locate, yaml_problem
from harness.spec import Duration, Name, Strict, custom_error

__all__ = [
    "Accelerator",
    "DataPlane",
    "Inventory",
    "InventoryInvalid",
    "KnownHosts",
    "Machine",
    "SrunPlace",
    "bind_hosts",
    "load_inventory",
    "parse_inventory",
]

MAX_BYTES = 1 << 20
MAX_NODES = 100_000  # YAML nodes after alias expansion (the scenario loader's bound)
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})$")
_DEVICE_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # IFNAMSIZ is 16 with the NUL
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TRANSPORTS = ("rdma", "ucx-tcp-any", "ucx-tcp-cuda", "ucx-tcp")


class InventoryInvalid(HarnessError):
    """An inventory file is not valid; carries every issue (file, line, key path, rule)."""

    def __init__(self, file: str | Path, issues: Sequence[Issue]) -> None:
        self.file = str(file)
        self.issues = list(issues)
        count = len(self.issues)
        head = f"{self.file}: invalid inventory ({count} problem{'s' if count != 1 else ''})"
        super().__init__("\n".join([head] + ["  " + issue.render(self.file) for issue in self.issues]))


def _address(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOSTNAME_RE.match(value) or ".." in value:
        raise custom_error("address", "an address must be an IP address or a host name (letters, digits, '.', '-')")
    return value


def _device(value: Any) -> Any:
    if isinstance(value, str) and not _DEVICE_RE.match(value):
        raise custom_error("device", "a network device name is 1-15 characters of letters, digits and . _ : @ -")
    return value


def _absolute(value: Any) -> Any:
    if isinstance(value, str) and not value.startswith("/"):
        raise custom_error("absolute", "a path on the remote machine must be absolute (start with /)")
    return value


def _env_map(value: Any) -> Any:
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
                raise custom_error("env", f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            out[key] = ("1" if item else "0") if isinstance(item, bool) else str(item) if isinstance(item, int | float) else item
        return out
    return value


Address = Annotated[str, BeforeValidator(_address)]
Device = Annotated[str, BeforeValidator(_device)]
RemotePath = Annotated[str, BeforeValidator(_absolute)]


def _work_dir(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("~/"):
        return value
    if isinstance(value, str) and not value.startswith("/"):
        raise custom_error("absolute", "a work dir is absolute (start with /) or under the login's home (start with ~/)")
    return value


WorkDir = Annotated[str, BeforeValidator(_work_dir)]
DEFAULT_WORK_DIR = "~/.cache/mxchaos/work"


def _yaml_off(value: Any) -> Any:
    return "off" if value is False else value  # YAML 1.1 reads a bare off as false


class KnownHosts(Strict):
    """How the machine's host key is checked: ``strict`` (it must be in ``file``, or in the
    user's known_hosts when no file is given), ``accept-new`` (learned on first contact, into
    ``file`` when given), ``off`` (never checked: throwaway labs only)."""

    policy: Annotated[Literal["strict", "accept-new", "off"], BeforeValidator(_yaml_off)] = "strict"
    file: Path | None = None

    @model_validator(mode="after")
    def _off_has_no_file(self) -> KnownHosts:
        if self.policy == "off" and self.file is not None:
            raise custom_error("known_hosts", "policy off checks no file; drop file or choose strict / accept-new")
        return self


def _known_hosts_shorthand(value: Any) -> Any:
    return {"policy": _yaml_off(value)} if isinstance(value, str | bool) else value


class DataPlane(Strict):
    """Where the machine's NIXL/gRPC traffic goes (default: its ssh address) and the network
    device network faults act on (default: none, so network faults are skipped there)."""

    address: Address | None = None
    device: Device | None = None


class Accelerator(Strict):
    kind: Literal["cpu", "cuda"] = "cpu"
    device: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _device_for_cuda(self) -> Accelerator:
        if self.kind == "cpu" and self.device is not None:
            raise custom_error("accelerator", "a device id is for kind cuda only")
        return self


def _accelerator_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


class MachineFields(Strict):
    """Everything of a machine but its address: what ``defaults:`` may set."""

    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")] | None = None
    identity_file: Path | None = None
    known_hosts: Annotated[KnownHosts, BeforeValidator(_known_hosts_shorthand)] = KnownHosts()
    python: str | None = None  # default python3 (or the venv's)
    venv: RemotePath | None = None
    repo: RemotePath | None = None
    # made and checked there when a host opens (``harness.hosts.ssh_remote.WORKDIR``: the login's,
    # 0700, no symlink on the way, its parent writable by no one else); never a shared temp dir
    work_dir: WorkDir = DEFAULT_WORK_DIR
    data: DataPlane = DataPlane()
    transport: Literal["rdma", "ucx-tcp-any", "ucx-tcp-cuda", "ucx-tcp"] | None = None
    accelerator: Annotated[Accelerator, BeforeValidator(_accelerator_shorthand)] = Accelerator()
    env: Annotated[dict[str, str], BeforeValidator(_env_map)] = Field(default_factory=dict)
    sudo: bool = False
    connect_timeout: Duration = 5.0
    # how its processes are started: over ssh, or as steps of the SLURM job that holds it
    # (``harness.hosts.srun``; only for a node of an allocation, which sets ``srun``)
    reach: Literal["ssh", "srun"] = "ssh"

    @model_validator(mode="after")
    def _python_or_venv(self) -> MachineFields:
        if self.python is not None and self.venv is not None:
            raise custom_error("python", "give python or venv, not both (venv means <venv>/bin/python)")
        return self

    @property
    def interpreter(self) -> str:
        """The remote Python that runs mxref."""
        if self.venv is not None:
            return f"{self.venv.rstrip('/')}/bin/python"
        return self.python or "python3"


class SrunPlace(Strict):
    """The job step a ``reach: srun`` machine's commands run in: a running job and one of its nodes."""

    job: Annotated[str, Field(pattern=r"^[0-9]{1,10}(_[0-9]{1,10})?$")]
    node: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    conf: Path | None = None  # the slurm.conf the srun client here reads (default: its own rule)


class Machine(MachineFields):
    address: Address
    srun: SrunPlace | None = None  # set for the nodes of a SLURM allocation (``harness.hosts.allocation``)

    @model_validator(mode="after")
    def _srun_needs_a_job(self) -> Machine:
        if self.reach == "srun" and self.srun is None:
            raise custom_error("reach", "reach: srun runs commands as steps of a SLURM job: it is for the nodes of an "
                               "allocation (an inventory with slurm:, or --inventory slurm:), or give srun: {job, node}")
        return self

    @property
    def data_address(self) -> str:
        return self.data.address or self.address

    @property
    def target(self) -> str:
        """``user@address`` (or the address) as ssh takes it."""
        return f"{self.user}@{self.address}" if self.user else self.address


class Inventory(Strict):
    machines: Annotated[dict[Name, Machine], Field(min_length=1)]
    bind: dict[Name, Name] = Field(default_factory=dict)
    path: Path | None = Field(default=None, exclude=True)  # set by the loader, never in the file


def _resolve(path: Path | None, base: Path) -> Path | None:
    if path is None:
        return None
    path = path.expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def parse_inventory(text: str, file: str | Path = "<string>") -> Inventory:
    """Parse and validate an inventory's text; ``InventoryInvalid`` lists every problem."""
    label = str(file)
    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise InventoryInvalid(label, [Issue("", f"over the {MAX_BYTES} byte limit of an inventory file")])
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        bomb = expansion_problem(root, MAX_NODES, "write the inventory out instead") if root is not None else None
        if bomb is not None:
            raise InventoryInvalid(label, [bomb])
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryInvalid(label, [yaml_problem(exc)]) from None
    if root is None or not isinstance(data, dict):
        raise InventoryInvalid(label, [Issue("", "an inventory is a mapping with machines: (and optional defaults:, bind:)")])
    issues = duplicate_keys(root)
    if issues:
        raise InventoryInvalid(label, issues)
    allowed = {"defaults", "machines", "bind"}
    issues = [locate(root, (key,), f"unknown key (allowed: {', '.join(sorted(allowed))})") for key in data if key not in allowed]
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        issues.append(locate(root, ("defaults",), "defaults must be a mapping of machine keys"))
        defaults = {}
    elif "address" in defaults:
        issues.append(locate(root, ("defaults", "address"), "every machine has its own address; it cannot be a default"))
    else:
        try:
            MachineFields.model_validate(defaults)
        except ValidationError as exc:
            issues += [issue_from_pydantic({**e, "loc": ("defaults", *e["loc"])}, root) for e in exc.errors()]
    machines = data.get("machines")
    merged: Any = {}
    if isinstance(machines, dict):
        for name, spec in machines.items():
            if isinstance(spec, dict):
                env = {**(defaults.get("env") or {}), **(spec.get("env") or {})}
                merged[name] = {**defaults, **spec, **({"env": env} if env else {})}
            else:
                merged[name] = spec
    else:
        merged = machines  # the model reports what is wrong with it
    if issues:
        raise InventoryInvalid(label, issues)
    try:
        inventory = Inventory.model_validate({"machines": merged, "bind": data.get("bind") or {}})
    except ValidationError as exc:
        raise InventoryInvalid(label, [issue_from_pydantic(e, root) for e in exc.errors()]) from None
    unknown = [locate(root, ("bind", host), f"no machine named {machine!r} (machines: {', '.join(inventory.machines)})")
               for host, machine in inventory.bind.items() if machine not in inventory.machines]
    if unknown:
        raise InventoryInvalid(label, unknown)
    base = Path(label).resolve().parent if label != "<string>" else Path.cwd()
    resolved = {
        name: m.model_copy(update={
            "identity_file": _resolve(m.identity_file, base),
            "known_hosts": m.known_hosts.model_copy(update={"file": _resolve(m.known_hosts.file, base)}),
        })
        for name, m in inventory.machines.items()
    }
    return inventory.model_copy(update={"machines": resolved, "path": Path(label) if label != "<string>" else None})


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file (``InventoryInvalid`` names the file on any problem)."""
    file = Path(path)
    try:
        text = file.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InventoryInvalid(file, [Issue("", f"cannot read the file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError:
        raise InventoryInvalid(file, [Issue("", "not UTF-8 text; an inventory file is YAML text")]) from None
    return parse_inventory(text, file)


def bind_hosts(hosts: Sequence[str], inventory: Inventory, *, scenario: str = "the scenario") -> dict[str, str]:
    """Scenario host -> machine name, by the rule in the module docstring; ``HarnessError``
    naming the host when one cannot be bound."""
    bound: dict[str, str] = {}
    for host in hosts:
        if host in inventory.bind:
            bound[host] = inventory.bind[host]
        elif host in inventory.machines:
            bound[host] = host
    spare = [m for m in inventory.machines if m not in bound.values()]
    for host in hosts:
        if host in bound:
            continue
        if not spare:
            where = f" ({inventory.path})" if inventory.path else ""
            raise HarnessError(
                f"{scenario}: host {host!r} cannot be bound: the inventory{where} has {len(inventory.machines)} "
                f"machine(s) and every one is taken; add a machine or a bind: entry for {host!r}"
            )
        bound[host] = spare.pop(0)
    return bound
