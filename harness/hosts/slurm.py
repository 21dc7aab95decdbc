"""SLURM's client side, as the harness reads it: the controller, a job, its nodes.

Every question goes to SLURM's own client (``scontrol``), bounded in time, with the
configuration the caller names (``SLURM_CONF``; SLURM's default ``/etc/slurm/slurm.conf``
otherwise). Nothing here keeps state or writes a file.

- ``ping``: the controller answers, or ``SlurmUnavailable`` naming it (its host, address and
  port, read from the configuration file) and what the client said: the environment is broken
  (exit 4), before anything is started.
- ``job``: a job's record (``scontrol -o show job``): its state, its user and its node list;
  ``hostnames`` expands a node list (``scontrol show hostnames``, which needs no controller);
  ``nodes``: each node's record (``scontrol -o show node``: ``NodeAddr``, ``NodeHostName``).
- ``parse_record``: one line of ``scontrol -o`` output (``Key=value`` words; a value may hold
  spaces, as ``OS=Linux 6.1 #1 SMP``) -> a dict; ``read_conf``: a ``slurm.conf``'s keys (the
  last of a repeated key wins; ``NodeName`` and ``PartitionName`` lines are not read here).

What SLURM returns is input from elsewhere: a node name or address that is not a host name or
an IP address is refused (``SlurmError``) before it reaches an ssh command line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

__all__ = [
    "DEFAULT_CONF", "Job", "SlurmError", "SlurmUnavailable", "conf_path", "controller", "hostnames", "job", "nodes",
    "parse_record", "ping", "read_conf", "valid_job_id", "valid_node",
]

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
TIMEOUT_S = 15.0  # a controller that does not answer: scontrol itself gives up within MessageTimeout x 2
MAX_OUTPUT = 1 << 20
_KEY_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_:]*)=(.*)$")
_NODE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,62})$")
_JOB_RE = re.compile(r"^[0-9]{1,10}(_[0-9]{1,10})?$")


class SlurmError(HarnessError):
    """SLURM said something the harness cannot use (a job that is no allocation, a hostile node name)."""


class SlurmUnavailable(SlurmError):
    """SLURM cannot be asked: no client installed, or the controller does not answer (environment
    broken, exit 4)."""


def conf_path(env: Mapping[str, str] | None = None) -> Path:
    """The configuration a SLURM client here reads: ``$SLURM_CONF``, else SLURM's default."""
    value = (os.environ if env is None else env).get("SLURM_CONF")
    return Path(value) if value else DEFAULT_CONF


def read_conf(text: str) -> dict[str, str]:
    """A slurm.conf's ``Key=value`` lines, keys lower-cased (comments and blank lines skipped;
    node and partition lines left out)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        match = _KEY_RE.match(line)
        if match is None:
            continue
        key = match.group(1).lower()
        if key in ("nodename", "partitionname", "nodeset", "downnodes", "frontendname"):
            continue
        out[key] = match.group(2).strip()
    return out


def controller(conf: Path) -> str:
    """The controller a client of ``conf`` calls, as ``host(address):port`` (what the file
    says; ``conf`` unread: the path itself)."""
    try:
        keys = read_conf(conf.read_text(errors="replace")[:MAX_OUTPUT])
    except OSError as exc:
        return f"the controller of {conf} (unreadable: {exc.strerror or exc})"
    host = keys.get("slurmctldhost") or keys.get("controlmachine") or "?"
    if "controladdr" in keys and "(" not in host:
        host = f"{host}({keys['controladdr']})"
    return f"{host}:{keys.get('slurmctldport', '6817')}"


def _scontrol(args: Sequence[str], conf: Path, *, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("scontrol")
    if exe is None:
        raise SlurmUnavailable("SLURM: no `scontrol` here (install the slurm-client package)")
    if not conf.is_file():  # scontrol would retry for a minute
        raise SlurmUnavailable(f"SLURM: no configuration at {conf} (set $SLURM_CONF, or conf: in the inventory file)")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, errors="replace", timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"SLURM: `scontrol {' '.join(args)}` did not return within {timeout:g}s "
                               f"(controller {controller(conf)}, {conf})") from None
    if len(done.stdout) > MAX_OUTPUT:
        raise SlurmError(f"SLURM: `scontrol {' '.join(args)}` printed over {MAX_OUTPUT} bytes")
    return done


def _said(done: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (done.stderr + "\n" + done.stdout).splitlines() if ln.strip() and not ln.startswith("*")]
    return lines[0] if lines else f"rc {done.returncode}, no output"


def ping(conf: Path | None = None) -> str:
    """The controller's line (``Slurmctld(primary) at H is UP``) when it answers; else
    ``SlurmUnavailable`` naming it."""
    conf = conf or conf_path()
    done = _scontrol(["ping"], conf)
    text = done.stdout.strip()
    if done.returncode == 0 and " is UP" in text:
        return text.splitlines()[0]
    raise SlurmUnavailable(f"SLURM: the controller {controller(conf)} does not answer ({conf}): {_said(done)}")


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol -o show ...`` line -> its ``Key=value`` pairs (a word without ``=`` goes on
    with the value before it: ``OS=Linux 6.1 #1 SMP``)."""
    out: dict[str, str] = {}
    last: str | None = None
    for word in line.split():
        match = _KEY_RE.match(word)
        if match is not None:
            last = match.group(1)
            out[last] = match.group(2)
        elif last is not None:
            out[last] = f"{out[last]} {word}"
    return out


def valid_job_id(text: str) -> str:
    """A job id as SLURM writes one (``1234``, ``1234_5`` for an array task); SlurmError otherwise."""
    if not _JOB_RE.match(text):
        raise SlurmError(f"SLURM: {text!r} is not a job id (digits, or JOB_TASK for an array task)")
    return text


def valid_node(name: str, what: str = "node name") -> str:
    """A node name SLURM gave that may go on a command line; SlurmError otherwise."""
    if not _NODE_RE.match(name) or ".." in name:
        raise SlurmError(f"SLURM: {what} {name!r} is not a host name (letters, digits, '.', '-', '_'; at most 63)")
    return name


def _address(value: str, node: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return valid_node(value, f"the address of node {node}")


@dataclass(frozen=True)
class Job:
    """A job as ``scontrol -o show job`` says: id, state, its user's uid, its nodes (expanded)."""

    id: str
    state: str
    uid: int | None
    nodelist: str
    nodes: tuple[str, ...]


def job(job_id: str, conf: Path | None = None) -> Job:
    """The job's record (``SlurmUnavailable`` when the controller does not answer; ``SlurmError``
    when there is no such job)."""
    conf = conf or conf_path()
    valid_job_id(job_id)
    done = _scontrol(["-o", "show", "job", job_id], conf)
    if done.returncode != 0:
        said = _said(done)
        if "Invalid job id" in said:
            raise SlurmError(f"SLURM: no job {job_id} (controller {controller(conf)}): {said}")
        ping(conf)  # names the controller when that is what failed
        raise SlurmError(f"SLURM: `scontrol show job {job_id}` failed: {said}")
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if not lines:
        raise SlurmError(f"SLURM: no job {job_id}")
    record = parse_record(lines[0])
    user = re.search(r"\((\d+)\)$", record.get("UserId", ""))
    nodelist = record.get("NodeList", "(null)")
    names = hostnames(nodelist, conf) if nodelist not in ("", "(null)") else ()
    return Job(record.get("JobId", job_id), record.get("JobState", "UNKNOWN"), int(user.group(1)) if user else None,
               nodelist, tuple(names))


def hostnames(nodelist: str, conf: Path | None = None) -> tuple[str, ...]:
    """A node list (``h[1-3],gpu07``) expanded by SLURM's own rule, each name checked."""
    if len(nodelist) > 65536 or any(c.isspace() for c in nodelist):
        raise SlurmError(f"SLURM: {nodelist[:80]!r} is not a node list")
    done = _scontrol(["show", "hostnames", nodelist], conf or conf_path())
    if done.returncode != 0:
        raise SlurmError(f"SLURM: cannot expand the node list {nodelist!r}: {_said(done)}")
    return tuple(valid_node(name) for name in done.stdout.split())


def nodes(names: Sequence[str], conf: Path | None = None) -> dict[str, str]:
    """Node name -> the address SLURM reaches it at (``NodeAddr``, else ``NodeHostName``, else its
    name), for each of ``names``; SlurmError naming a node SLURM does not know."""
    conf = conf or conf_path()
    if not names:
        return {}
    done = _scontrol(["-o", "show", "node", ",".join(valid_node(n) for n in names)], conf)
    if done.returncode != 0:
        ping(conf)
        raise SlurmError(f"SLURM: `scontrol show node` failed: {_said(done)}")
    records = {r.get("NodeName", ""): r for r in map(parse_record, done.stdout.splitlines()) if r}
    out: dict[str, str] = {}
    for name in names:
        record = records.get(name)
        if record is None:
            raise SlurmError(f"SLURM: node {name} of the allocation is not in `scontrol show node` (controller {controller(conf)})")
        addr = next((record[k] for k in ("NodeAddr", "NodeHostName") if record.get(k) not in (None, "", "(null)")), name)
        out[name] = _address(addr, name)
    return out
