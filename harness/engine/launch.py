"""Command lines: a pure function from a scenario process to the argv and env it starts with.

This is the mxref command-line contract in one place: which flags each role gets from the
scenario (model, transport, options, events and metrics), what a process on a netns host binds
and advertises, how a restarted server keeps its port, where a reader finds its checkpoint and
writes its result, which of the run's credentials (``mxref.pki``) it gets as
``--tls-*``/``--token-file`` flags, and what every child carries in its environment
(``MXCHAOS_RUN_ID`` and the harness's pid/start time, so ``mxchaos cleanup`` can tell whose it is). Nothing here waits or
starts anything: the runner resolves endpoints first and hands them in.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.machine import procscan
from harness.scenario import (
    PLACEHOLDER_RE,
    PLACEHOLDERS,
    CommandProcess,
    MxrefProcess,
    ReaderProcess,
    RedisProcess,
    Scenario,
    ServerProcess,
    SourceProcess,
)
from harness.subjects import subject_launcher
from harness.subjects.mx_server import server_of_subject, serverd_argv
from mxref.pki import RunCredentials

__all__ = [
    "HarnessIdentity",
    "Placement",
    "base_env",
    "credential_flags",
    "fill",
    "launcher",
    "prepare_argv",
    "process_argv",
    "process_env",
    "redis_argv",
]


@dataclass(frozen=True)
class HarnessIdentity:
    """Who started a process: the run id, and the harness's pid and start time."""

    run_id: str
    pid: int
    start: int | None


@dataclass(frozen=True)
class Placement:
    """Where one incarnation of a process runs and what the runner already knows for it."""

    run_dir: Path
    events_path: Path | None
    log_path: Path
    host_address: str
    in_netns: bool  # bind and advertise the namespace's address, not loopback
    incarnation: int  # the one about to start
    server_address: str | None = None  # host:port (or the proxy's listen address) of its server
    checkpoint: Path | None = None  # the checkpoint the run prepared (readers)
    last_grpc_port: int | None = None  # a restarted server binds its previous port again
    credentials: RunCredentials | None = None  # the run's CA, certificate and token (security on)
    store_address: str | None = None  # host:port of a server's redis process (its ``store``)
    last_port: int | None = None  # a restarted redis binds its previous port again
    transport: str | None = None  # the host's transport profile (an inventory machine's), over the scenario's
    accelerator: tuple[str, int | None] | None = None  # the host's (kind, device id), unless the process sets its own


def fill(text: str, sc: Scenario, run_dir: Path, proc_dir: Path) -> str:
    """Replace the scenario placeholders (``{python}``, ``{run_dir}`` ...) in ``text``."""
    values = {
        "python": sys.executable,
        "run_dir": str(run_dir),
        "proc_dir": str(proc_dir),
        "scenario_dir": str(sc.directory),
        "seed": str(sc.seed),
    }
    assert set(values) == set(PLACEHOLDERS), "launch.fill and scenario.PLACEHOLDERS disagree"
    return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def launcher(sc: Scenario, spec: MxrefProcess, run_dir: Path) -> list[str]:
    """How mxref is started (``{python} -m mxref`` unless the process or scenario says otherwise);
    a source or reader of another subject runs its adapter (``harness.subjects``)."""
    if spec.launcher is None and isinstance(spec, SourceProcess | ReaderProcess):
        played = subject_launcher(spec.subject or sc.subject)
        if played is not None:
            return played
    return mxref_launcher(sc, spec, run_dir)


def mxref_launcher(sc: Scenario, spec: MxrefProcess, run_dir: Path) -> list[str]:
    """The process's (else the scenario's) mxref launcher, whoever the subject."""
    return [fill(part, sc, run_dir, run_dir / "procs") for part in (spec.launcher or sc.launcher)]


def base_env(environ: Mapping[str, str], who: HarnessIdentity, name: str) -> dict[str, str]:
    """The environment every child of a run starts from."""
    env = dict(environ)
    env.pop(procscan.ENV_RUN_ID, None)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
            procscan.ENV_RUN_ID: who.run_id,
            procscan.ENV_PROC: name,
            procscan.ENV_HARNESS_PID: str(who.pid),
            procscan.ENV_HARNESS_START: str(who.start or ""),
        }
    )
    return env


def process_env(sc: Scenario, name: str, base: Mapping[str, str], where: Placement) -> dict[str, str]:
    """``base`` plus the scenario's and the process's own ``env`` (placeholders filled)."""
    env = dict(base)
    for key, value in {**sc.env, **sc.processes[name].env}.items():
        env[key] = fill(value, sc, where.run_dir, where.log_path.parent)
    return env


def process_argv(sc: Scenario, name: str, where: Placement) -> list[str]:
    """The argv of process ``name``'s next incarnation."""
    spec = sc.processes[name]
    proc_dir = where.log_path.parent
    if isinstance(spec, CommandProcess):
        return [fill(part, sc, where.run_dir, proc_dir) for part in spec.argv]
    if isinstance(spec, RedisProcess):
        return redis_argv(name, spec, where)
    if where.events_path is None:
        raise ValueError(f"process {name}: an mxref process needs an events file")
    if isinstance(spec, ServerProcess) and server_of_subject(spec) != "mxref":
        return _mx_server_argv(name, spec, where, where.events_path)
    argv = [*launcher(sc, spec, where.run_dir), spec.role, "--name", name, "--events", str(where.events_path), "--metrics-port", "0"]
    if isinstance(spec, ServerProcess):
        options = spec.options
        if options.port == 0 and where.last_grpc_port:
            options = options.model_copy(update={"port": where.last_grpc_port})  # a restart keeps its address
        if where.in_netns and options.host is None:  # bind (and serve /metrics on) the namespace's address
            options = options.model_copy(update={"host": where.host_address})
        argv += options.argv()
        if spec.store is not None:
            if where.store_address is None:
                raise ValueError(f"process {name}: a server on store {spec.store!r} needs that redis process's address")
            argv += ["--store", f"redis://{where.store_address}/0"]
        if where.in_netns:
            argv += ["--metrics-host", where.host_address]
        argv += credential_flags(spec, where.credentials)
    else:
        if where.server_address is None:
            raise ValueError(f"process {name}: a {spec.role} needs its server's address")
        argv += ["--server", where.server_address]
        argv += sc.model.flags(sc.seed, sc.directory)
        argv += ["--transport", where.transport or sc.transport_of(name)]
        if where.in_netns:  # reachable from the other namespaces and from the harness (scrapes)
            argv += ["--metrics-host", where.host_address]
            if spec.options.advertise_host is None:
                argv += ["--advertise-host", where.host_address]
        if isinstance(spec, ReaderProcess):
            argv += _reader_options(sc, spec, where)
            argv += ["--result", str(where.log_path.with_suffix(f".result-{where.incarnation}.json"))]
        else:
            assert isinstance(spec, SourceProcess)
            argv += spec.options.argv()
        argv += credential_flags(spec, where.credentials)
        argv += _host_accelerator(spec, where)
    argv += [fill(part, sc, where.run_dir, proc_dir) for part in spec.extra_args]
    return argv


def _mx_server_argv(name: str, spec: ServerProcess, where: Placement, events_path: Path) -> list[str]:
    """A server the real ModelExpress binary plays (``harness.subjects.mx_server``): same port
    rules as mxref's (a restart binds its previous port), bound to the host's address."""
    port = spec.options.port or where.last_grpc_port or 0
    return serverd_argv(name, spec, events_path=events_path, proc_dir=where.log_path.parent,
                        host=spec.options.host or where.host_address, port=port, store_address=where.store_address)


def redis_argv(name: str, spec: RedisProcess, where: Placement) -> list[str]:
    """``harness.subjects.redisd``: redis-server on the host's address, its port (0: a free one; a
    restart: the previous one), its folder beside its log; events like an mxref process."""
    if where.events_path is None:
        raise ValueError(f"process {name}: a redis process needs an events file")
    port = spec.port or where.last_port or 0
    return [sys.executable, "-m", "harness.subjects.redisd", "--name", name, "--events", str(where.events_path),
            "--port", str(port), "--bind", where.host_address, "--dir", str(where.log_path.parent / f"{name}.redis")]


def _host_accelerator(spec: SourceProcess | ReaderProcess, where: Placement) -> list[str]:
    """``--accelerator``/``--device-id`` from the host's profile where the process names none
    (a process naming the host's own accelerator still gets the host's device id, unless it
    names its own)."""
    if where.accelerator is None:
        return []
    kind, device = where.accelerator
    named = spec.options.accelerator
    if named is not None and named != kind:
        return []
    flags = ["--accelerator", kind] if named is None else []
    if device is not None and spec.options.device_id is None:
        flags += ["--device-id", str(device)]
    return flags


def credential_flags(spec: MxrefProcess, creds: RunCredentials | None) -> list[str]:
    """The ``--tls-*``/``--token-file`` flags of one mxref process (paths, never the token).

    A server gets the certificate, key and token; a source or reader with ``credentials: run``
    the CA (to verify servers), the certificate and key (its WorkerService) and the token; a
    rogue only what its ``credentials`` says (``harness.scenario.Credentials``).
    """
    if creds is None or not creds.tls:
        return []
    assert creds.ca_cert is not None and creds.server_cert is not None and creds.server_key is not None
    serving = ["--tls-cert", str(creds.server_cert), "--tls-key", str(creds.server_key)]
    token = ["--token-file", str(creds.token)] if creds.token is not None else []
    if isinstance(spec, ServerProcess):
        return [*serving, *token]
    assert isinstance(spec, SourceProcess | ReaderProcess)
    ca = ["--tls-ca", str(creds.ca_cert)]
    if spec.credentials == "run":
        return [*ca, *serving, *token]
    if spec.credentials == "no_token":
        return ca
    if spec.credentials == "wrong_token":
        if creds.wrong_token is None:
            return ca  # the run has no token, so there is none to get wrong
        # it serves its WorkerService over TLS as an honest one does (a token without TLS stops an
        # mxref source at start): what it gets wrong is the token alone
        return [*ca, *serving, "--token-file", str(creds.wrong_token)]
    return []  # "none": plaintext


def _reader_options(sc: Scenario, spec: ReaderProcess, where: Placement) -> list[str]:
    options = spec.options
    updates: dict[str, Any] = {}
    if options.checkpoint is not None:
        updates["checkpoint"] = str((sc.directory / options.checkpoint).resolve())
    elif where.checkpoint is not None:
        updates["checkpoint"] = str(where.checkpoint)
    if options.selector_seed is None:
        updates["selector_seed"] = sc.seed
    return options.model_copy(update=updates).argv()


def prepare_argv(sc: Scenario, reader: str, run_dir: Path, checkpoint: Path) -> list[str]:
    """``mxref prepare``: write the scenario model's disk checkpoint to ``checkpoint``."""
    spec = sc.processes[reader]
    assert isinstance(spec, ReaderProcess)
    return [*mxref_launcher(sc, spec, run_dir), "prepare", "--checkpoint", str(checkpoint), *sc.model.flags(sc.seed, sc.directory)]
