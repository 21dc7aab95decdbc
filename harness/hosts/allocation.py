"""Inventories from a SLURM allocation: ``--inventory slurm:`` and inventory files with ``slurm:``.

Inside ``salloc`` / ``sbatch`` the machines a run needs are the nodes SLURM gave the job; the
inventory is built from them rather than written by hand::

    mxchaos run --inventory slurm: SCENARIO          # the job this runs in ($SLURM_JOB_ID)
    mxchaos run --inventory slurm:1234 SCENARIO      # a job given by id (yours, running)
    mxchaos run --inventory slurm+srun:1234 SCENARIO # the same, every node reached through srun, not ssh
    mxchaos run --inventory slurm+srun:alloc.yaml SC # the file below, every node reached through srun
    mxchaos run --inventory alloc.yaml SCENARIO      # a file with slurm: (below)

An inventory file with a ``slurm:`` key instead of ``machines:`` (``mxchaos lab up --slurm``
writes one) says what SLURM cannot: how to reach and use a node::

    defaults: {user: root, identity_file: id_ed25519, python: /opt/mxchaos/.venv/bin/python, ...}
    slurm:
      job: 1234                 # optional; default $SLURM_JOB_ID
      conf: /etc/slurm/slurm.conf   # optional; default $SLURM_CONF, else SLURM's default
      nodes:                    # optional, per SLURM node name: any machine key but address
        gpu07: {data: {address: 10.1.0.7, device: ens1f0}, reach: srun}
    bind: {ctl: gpu07}          # optional, as in any inventory

``reach: srun`` (on a node, or in ``defaults:`` for all of them) starts that node's processes as
steps of the job (``srun --overlap --jobid J -w NODE``, ``harness.hosts.srun``) where ssh into the
nodes is refused; the default, ``reach: ssh``, goes over ssh. ``slurm+srun:[JOBID]`` is ``slurm:[JOBID]``
with ``reach: srun`` for every node (no file needed: nothing of ssh is used); ``slurm+srun:FILE`` is
the file's allocation with ``reach: srun`` for every node whatever the file says (a file gives what
SLURM cannot, such as each node's data device for the network faults).

The machines are the job's nodes in SLURM's order (``scontrol show job``'s node list, expanded
by ``scontrol show hostnames``), each at the address ``scontrol show node`` gives (``NodeAddr``),
with ``defaults:`` and its ``nodes:`` entry; the result is validated as any inventory
(``harness.hosts.inventory.parse_inventory``: bad input names the file, key and rule) and the
scenario's hosts are bound to them by the same rule. ``slurm:`` alone (no file) uses this
harness's Python and checkout on every node: a shared file system at the same path, as SLURM
sites have for home directories; give a file where the nodes differ.

Before any of it, the controller must answer (``harness.hosts.slurm.ping``): one that does not
is ``SlurmUnavailable`` (exit 4, environment broken) naming it. A job that is not running, or
not the caller's, is ``SlurmUnavailable`` too (no allocation to run on); one that does not exist,
or a spelling that is not a job id, is invalid input (``InventoryInvalid``, exit 2).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from harness.errors import Issue
from harness.hosts import slurm
from harness.hosts.inventory import Inventory, InventoryInvalid, load_inventory, parse_inventory

__all__ = ["PREFIX", "SRUN_PREFIX", "from_allocation", "open_inventory", "parse_spec", "spec_reach"]

PREFIX = "slurm:"
SRUN_PREFIX = "slurm+srun:"  # the same allocation, every node reached through srun (reach: srun)
_REACH_OF = {PREFIX: "ssh", SRUN_PREFIX: "srun"}
REPO = Path(__file__).resolve().parents[2]
_SLURM_KEYS = {"job", "conf", "nodes"}


def spec_reach(spec: str | Path) -> str | None:
    """How an allocation spec reaches its nodes (``slurm:`` ssh, ``slurm+srun:`` srun); None when
    ``spec`` is no allocation spec (a file)."""
    text = str(spec)
    return next((reach for prefix, reach in _REACH_OF.items() if text.startswith(prefix)), None)


def _file_of(spec: str) -> Path | None:
    """``slurm+srun:FILE`` -> FILE (a path: it has a ``/`` or a ``.``); None otherwise."""
    rest = spec[len(SRUN_PREFIX):].strip() if spec.startswith(SRUN_PREFIX) else ""
    return Path(rest) if ("/" in rest or "." in rest) else None


def parse_spec(spec: str) -> str | None:
    """``slurm:`` / ``slurm+srun:`` -> None (the job this runs in), ``slurm:1234`` -> ``1234``;
    InventoryInvalid for anything else after the prefix (``slurm+srun:FILE`` is read by ``open_inventory``)."""
    prefix = next((p for p in _REACH_OF if spec.startswith(p)), PREFIX)
    rest = spec[len(prefix):].strip()
    if not rest:
        return None
    try:
        return slurm.valid_job_id(rest)
    except slurm.SlurmError as exc:
        raise InventoryInvalid(spec, [Issue("", str(exc))]) from None


def _job_id(given: str | None, label: str) -> str:
    if given is not None:
        return given
    env = os.environ.get("SLURM_JOB_ID", "")
    if not env:
        raise InventoryInvalid(label, [Issue("", "not inside a SLURM allocation ($SLURM_JOB_ID is not set): run it "
                                                 "inside salloc / sbatch, or name the job (slurm:JOBID, or job: in the file)")])
    try:
        return slurm.valid_job_id(env)
    except slurm.SlurmError as exc:
        raise InventoryInvalid(label, [Issue("", f"$SLURM_JOB_ID: {exc}")]) from None


def from_allocation(job_id: str | None = None, *, conf: Path | None = None, defaults: dict[str, Any] | None = None,
                    nodes: dict[str, Any] | None = None, bind: dict[str, Any] | None = None,
                    label: str = PREFIX, reach: str | None = None) -> Inventory:
    """The inventory of a running job's nodes (see the module); ``label`` names the source in errors;
    ``reach``: every node reached so, whatever ``defaults`` and ``nodes`` say."""
    conf = conf or slurm.conf_path()
    slurm.ping(conf)  # before anything: a controller that does not answer names itself (exit 4)
    jid = _job_id(job_id, label)
    try:
        job = slurm.job(jid, conf)
    except slurm.SlurmUnavailable:
        raise
    except slurm.SlurmError as exc:
        raise InventoryInvalid(label, [Issue("", str(exc))]) from None
    if job.state != "RUNNING":
        raise slurm.SlurmUnavailable(f"SLURM: job {job.id} is {job.state}, not RUNNING: no allocation to run on "
                                     f"(controller {slurm.controller(conf)})")
    if job.uid is not None and job.uid != os.geteuid():
        raise slurm.SlurmUnavailable(f"SLURM: job {job.id} is uid {job.uid}'s, not ours (uid {os.geteuid()})")
    if not job.nodes:
        raise slurm.SlurmUnavailable(f"SLURM: job {job.id} holds no nodes")
    addresses = slurm.nodes(job.nodes, conf)
    extra = dict(nodes or {})  # may describe the whole cluster: only the job's nodes are used
    machines: dict[str, Any] = {}
    for name in job.nodes:
        entry = extra.get(name) or {}
        machine = {**(defaults or {}), **(entry if isinstance(entry, dict) else {}), "address": addresses[name]}
        if reach is not None:
            machine["reach"] = reach
        if machine.get("reach") == "srun":  # its commands run as steps of this job on it (harness.hosts.srun)
            machine["srun"] = {"job": job.id, "node": name, "conf": str(conf)}
        machines[name] = machine
    doc = {"machines": machines, **({"bind": bind} if bind else {})}
    return parse_inventory(yaml.safe_dump(doc, sort_keys=False), label)


def _read_file(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # load_inventory says what is wrong with it


def open_inventory(spec: str | Path) -> Inventory:
    """What ``--inventory SPEC`` means: ``slurm:[JOBID]`` or ``slurm+srun:[JOBID]``, a file with
    ``slurm:``, or an inventory file."""
    text = str(spec)
    reach = spec_reach(text)
    forced = _file_of(text)
    if forced is not None:
        return _from_file(forced, reach="srun")
    if reach is not None:
        return from_allocation(parse_spec(text), defaults={"python": sys.executable, "repo": str(REPO), "reach": reach},
                               label=f"{text} (the SLURM allocation)")
    return _from_file(Path(spec))


def _from_file(path: Path, reach: str | None = None) -> Inventory:
    """An inventory file: with ``slurm:`` the allocation it names (``reach``: every node so), else
    its ``machines:``; ``slurm+srun:FILE`` needs the former."""
    data = _read_file(path)
    if not (isinstance(data, dict) and "slurm" in data):
        if reach is not None:
            raise InventoryInvalid(path, [Issue("slurm", f"{SRUN_PREFIX}FILE is for an inventory of a SLURM allocation "
                                                         "(a file with slurm:); give reach: srun per machine instead")])
        return load_inventory(path)
    issues = []
    if "machines" in data:
        issues.append(Issue("machines", "an inventory has machines: or slurm: (the allocation's nodes), not both"))
    section = data.get("slurm") or {}
    if not isinstance(section, dict):
        issues.append(Issue("slurm", "slurm: is a mapping (job:, conf:, nodes:)"))
        section = {}
    issues += [Issue(f"slurm.{key}", f"unknown key (allowed: {', '.join(sorted(_SLURM_KEYS))})") for key in section
               if key not in _SLURM_KEYS]
    job = section.get("job")
    if job is not None and not isinstance(job, int | str):
        issues.append(Issue("slurm.job", "a job id (digits)"))
    conf = section.get("conf")
    if conf is not None and not isinstance(conf, str):
        issues.append(Issue("slurm.conf", "the path of a slurm.conf"))
    nodes = section.get("nodes") or {}
    if not isinstance(nodes, dict) or any(not isinstance(v, dict) or "address" in v or "srun" in v for v in nodes.values()):
        issues.append(Issue("slurm.nodes", "node name -> machine keys (not address, nor srun: SLURM gives them; "
                                           "reach: srun says to use them)"))
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        issues.append(Issue("defaults", "defaults must be a mapping of machine keys"))
    if issues:
        raise InventoryInvalid(path, issues)
    try:
        jid = slurm.valid_job_id(str(job)) if job is not None else None
    except slurm.SlurmError as exc:
        raise InventoryInvalid(path, [Issue("slurm.job", str(exc))]) from None
    base = path.resolve().parent
    conf_path = (base / conf) if conf else None
    return from_allocation(jid, conf=conf_path, defaults=defaults, nodes=nodes, bind=data.get("bind"), label=str(path),
                           reach=reach)
