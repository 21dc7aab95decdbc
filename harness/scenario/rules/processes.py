"""Cross-reference rules of the processes, hosts and proxies sections: hosts exist and
do not mix kinds, sources and readers have a server (directly or through a proxy), a proxy
leads to a server, a server's store is a redis process, placeholders are known, who plays
the scenario is among its ``subjects``."""

from __future__ import annotations

from collections.abc import Sequence

from harness.locate import Loc
from harness.scenario.document import SUBJECT_NAMES
from harness.scenario.models import (
    PLACEHOLDER_RE,
    PLACEHOLDERS,
    CommandProcess,
    MxrefProcess,
    ReaderProcess,
    ServerProcess,
    SourceProcess,
)
from harness.scenario.rules.context import Context

__all__ = ["check_processes", "unknown_placeholders"]


def unknown_placeholders(texts: Sequence[str]) -> list[str]:
    return [m.group(0) for text in texts for m in PLACEHOLDER_RE.finditer(text) if m.group(1) not in PLACEHOLDERS]


def _known_placeholders() -> str:
    return ", ".join("{" + p + "}" for p in PLACEHOLDERS)


def check_processes(cx: Context) -> None:
    sc = cx.sc
    procs = sc.processes
    for name, proxy in sc.proxies.items():
        cx.need_process(("proxies", name, "upstream"), proxy.upstream, ("server", "redis"), "server or redis process")

    host_names = list(sc.hosts)
    kinds = {spec.kind for spec in sc.hosts.values()}
    if "netns" in kinds and len(kinds) > 1:
        others = [n for n, h in sc.hosts.items() if h.kind != "netns"]
        cx.add(("hosts",), f"netns hosts cannot be mixed with other kinds ({', '.join(others)}): a process "
               "in a namespace cannot reach one on this machine's loopback")
    rdma_hosts = [n for n, h in sc.hosts.items() if h.requires is not None and h.requires.transport == "rdma"]
    if rdma_hosts and sc.transport not in (None, "rdma", "default") and "transport" not in cx.broken:
        cx.add(("transport",), f"hosts {', '.join(rdma_hosts)} require transport rdma, but the scenario's transport is "
               f"{sc.transport!r} (TCP): use rdma (or leave it out: the inventory's machine gives its own)")
    servers = [n for n, p in procs.items() if p.role == "server"]
    _check_subjects(cx)
    for name, spec in procs.items():
        loc: Loc = ("processes", name)
        if spec.host is not None and spec.host not in sc.hosts and not cx.unknown("hosts", spec.host):
            cx.add((*loc, "host"), f"no host named {spec.host!r} (hosts: {', '.join(host_names)})")
        if spec.host is None and len(host_names) > 1:
            cx.add((*loc, "host"), f"required when the scenario has several hosts ({', '.join(host_names)})")
        if isinstance(spec, ServerProcess):
            _check_store(cx, loc, spec)
        if isinstance(spec, SourceProcess | ReaderProcess):
            _check_server(cx, loc, spec, servers)
            _check_hardware(cx, loc, spec)
            if spec.credentials != "run" and not sc.security.tls and "security" not in cx.broken:
                cx.add((*loc, "credentials"), f"{spec.credentials!r} withholds credentials the run does not have: "
                       "set security: {tls: true, token: true}")
        texts: list[str] = list(spec.env.values())
        if isinstance(spec, CommandProcess):
            texts += list(spec.argv)
        elif isinstance(spec, MxrefProcess):
            texts += list(spec.launcher or ()) + list(spec.extra_args)
        for bad in unknown_placeholders(texts):
            cx.add(loc, f"unknown placeholder {bad} (known: {_known_placeholders()})")
    if "launcher" not in cx.broken and "env" not in cx.broken:
        for bad in unknown_placeholders([*sc.launcher, *sc.env.values()]):
            cx.add(("launcher",), f"unknown placeholder {bad} (known: {_known_placeholders()})")


def _check_subjects(cx: Context) -> None:
    """Who plays the scenario (its ``subject``, a process's own) is among its ``subjects``."""
    sc = cx.sc
    if "subjects" in cx.broken:
        return
    allowed = ", ".join(sc.subjects)
    left_out = [s for s in SUBJECT_NAMES if s not in sc.subjects]
    if left_out and not sc.subjects_note.strip() and "subjects_note" not in cx.broken:
        cx.add(("subjects",), f"say why {', '.join(left_out)} cannot play this scenario in subjects_note "
               "(what of mxref's it is staged with)")
    if "subject" not in cx.broken and sc.subject not in sc.subjects:
        cx.add(("subject",), f"{sc.subject!r} is not among the scenario's subjects ({allowed})")
    for name, spec in sc.processes.items():
        own = getattr(spec, "subject", None)
        if own is not None and spec.role != "server" and own not in sc.subjects:  # subjects: who plays clients
            cx.add(("processes", name, "subject"), f"{own!r} is not among the scenario's subjects ({allowed})")
    _check_servers(cx)


def _check_servers(cx: Context) -> None:
    """Who plays the scenario's servers (a server's ``subject``) is among its ``servers``."""
    sc = cx.sc
    if "servers" in cx.broken:
        return
    left_out = [s for s in SUBJECT_NAMES if s not in sc.servers]
    if left_out and not sc.servers_note.strip() and "servers_note" not in cx.broken:
        cx.add(("servers",), f"say why a {', '.join(left_out)} server cannot play this scenario in servers_note "
               "(what of mxref's server it is staged with, or what the real server lacks)")
    for name, spec in sc.processes.items():
        own = getattr(spec, "subject", None)
        if spec.role == "server" and own is not None and own not in sc.servers:
            cx.add(("processes", name, "subject"), f"{own!r} is not among the scenario's servers ({', '.join(sc.servers)})")


def _check_store(cx: Context, loc: Loc, spec: ServerProcess) -> None:
    """A server's ``store`` is a redis process; its ``store_via`` a proxy leading to that store."""
    if spec.store is not None:
        cx.need_process((*loc, "store"), spec.store, ("redis",), "redis process")
    elif spec.subject not in (None, "mxref"):
        cx.add((*loc, "subject"), f"a {spec.subject} server keeps its records only in Redis: give it a store "
               "(the scenario's store: redis, or store: a redis process)")
    if spec.subject not in (None, "mxref") and cx.sc.security.tls and "security" not in cx.broken:
        cx.add((*loc, "subject"), f"a {spec.subject} server is not staged with the run's TLS and token "
               "(its security is Kubernetes service-account review): drop security or the server's subject")
    if spec.store_via is None or not cx.need_proxy((*loc, "store_via"), spec.store_via):
        return
    upstream = cx.sc.proxies[spec.store_via].upstream
    if spec.store is None:
        cx.add((*loc, "store_via"), "the server has no store to reach through a proxy: set store (a redis "
               "process) or the scenario's store: redis")
    elif upstream != spec.store:
        cx.add((*loc, "store_via"), f"proxy {spec.store_via!r} leads to {upstream!r}, not to this server's store {spec.store!r}")


def _check_server(cx: Context, loc: Loc, spec: SourceProcess | ReaderProcess, servers: list[str]) -> None:
    sc = cx.sc
    if spec.server is not None:
        cx.need_process((*loc, "server"), spec.server, ("server",), "server process")
    if spec.server_via is not None and cx.need_proxy((*loc, "server_via"), spec.server_via):
        upstream = sc.proxies[spec.server_via].upstream
        if upstream in sc.processes and sc.processes[upstream].role == "redis":  # (any other role: the proxy is reported)
            cx.add((*loc, "server_via"), f"proxy {spec.server_via!r} leads to the redis "
                   f"{upstream!r}, not to a server")
        if spec.server is not None and spec.server != upstream:
            cx.add((*loc, "server_via"), f"proxy {spec.server_via!r} leads to {upstream!r}, "
                   f"not to this {spec.role}'s server {spec.server!r}")
    named = spec.server is not None or spec.server_via is not None  # the proxy names its server
    if named or cx.broken_names.get("processes") or "processes" in cx.broken:
        return  # a server may be among the processes that did not validate
    if not servers:
        cx.add(loc, f"a {spec.role} needs a server process, and the scenario defines none")
    elif len(servers) > 1:
        cx.add((*loc, "server"), f"required: several servers ({', '.join(servers)})")


def _check_hardware(cx: Context, loc: Loc, spec: SourceProcess | ReaderProcess) -> None:
    """A source or reader on a host that requires hardware does not contradict it: no
    ``accelerator: cpu`` on a cuda host."""
    sc = cx.sc
    host = spec.host or next(iter(sc.hosts), None)
    needs = sc.hosts[host].requires if host is not None and host in sc.hosts else None
    if needs is None:
        return
    if needs.accelerator == "cuda" and spec.options.accelerator == "cpu":
        cx.add((*loc, "options", "accelerator"), f"host {host!r} requires accelerator cuda: its {spec.role}s hold "
               "VRAM (leave accelerator out, or set cuda)")
