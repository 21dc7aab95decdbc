"""The run's toxiproxy server and the proxies made on it.

Only a scenario with ``proxies`` gets one: a ``toxiproxy-server`` on loopback, its API port
leased (``harness.machine.ports``) for as long as it runs, in its own session with the run's
``MXCHAOS_RUN_ID``, logging to ``procs/toxiproxy.log``. A proxy is created (listen port chosen
by toxiproxy and read back) once its upstream server's address is known, and re-pointed when
that server comes back on another port. ``stop`` resets and deletes the run's proxies and stops
the server; every API call is bounded.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import toxiproxy as toxi
from harness.errors import HarnessError
from harness.hosts.base import Host, Proc, make_host
from harness.machine.ports import PortLease, lease_port
from harness.record.timeline import Timeline
from harness.scenario import capabilities

__all__ = ["ProxyView", "RunProxies"]


@dataclass(frozen=True)
class ProxyView:
    """A created proxy (satisfies ``harness.faults.ProxyView``)."""

    name: str  # the scenario's name for it
    proxy: str  # its name in toxiproxy (``<run id>.<name>``)
    api: str
    listen: str
    upstream: str


@dataclass
class _Server:
    host: Host
    proc: Proc
    lease: PortLease  # held while the server runs: no other harness is handed its API port
    api: toxi.ToxiproxyAPI
    proxies: dict[str, ProxyView] = field(default_factory=dict)  # scenario proxy name -> created
    exit_recorded: bool = False
    stopping: bool = False


class RunProxies:
    """The toxiproxy side of one run (thread-safe: parallel branches may create proxies)."""

    def __init__(self, run_id: str, run_dir: Path, timeline: Timeline) -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self.timeline = timeline
        self._server: _Server | None = None
        self._lock = threading.Lock()  # one creation per proxy, even from parallel branches
        self.harness_ports: set[int] = set()  # API and listen ports (for the leak scan)

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def host(self) -> Host | None:
        return self._server.host if self._server is not None else None

    def start(self, env: dict[str, str], deadline: float, grace: float) -> dict[str, Any]:
        """Start the server; waits until its API answers (bounded by ``deadline``). A server
        that exits at once (its port taken after all) is retried on a new port."""
        binary = capabilities.toxiproxy_server()
        if binary is None:
            raise HarnessError("the scenario has proxies, and no toxiproxy-server is installed (.venv/bin or PATH)")
        host = make_host("harness", "local")
        log_path = self.run_dir / "procs" / "toxiproxy.log"
        env = {**env, "LOG_LEVEL": env.get("LOG_LEVEL", "info")}
        for attempt in range(1, 4):
            lease = lease_port(host.address)
            # -proxy-metrics: each proxy's bytes on /metrics, what a toxic's witness reads
            argv = [binary, "-host", host.address, "-port", str(lease.port), "-proxy-metrics"]
            self.timeline.append("invoke", "harness", "toxiproxy", {"argv": argv, "attempt": attempt})
            started = time.monotonic()
            try:
                proc = host.spawn(argv, env=env, cwd=self.run_dir, log_path=log_path)
            except HarnessError as exc:
                lease.release()
                self.timeline.append("fail", "harness", "toxiproxy", {"error": str(exc)})
                raise
            server = _Server(host, proc, lease, toxi.ToxiproxyAPI(f"http://{host.address}:{lease.port}"))
            self._server = server
            version, error = _await_api(server, deadline)
            if version is not None:
                self.harness_ports.add(lease.port)
                value = {"pid": proc.pid, "api": server.api.url, "version": version,
                         "seconds": round(time.monotonic() - started, 3), "log": "procs/toxiproxy.log"}
                self.timeline.append("ok", "harness", "toxiproxy", value)
                return {"api": server.api.url, "pid": proc.pid}
            server.stopping = True
            stopped = proc.stop(grace)
            lease.release()
            self._server = None
            self.timeline.append("fail", "harness", "toxiproxy", {"pid": proc.pid, "rc": stopped.rc, "error": error})
            if not stopped.already_exited or time.monotonic() > deadline:
                raise HarnessError(f"toxiproxy-server: {error}; see procs/toxiproxy.log")
        raise HarnessError("toxiproxy-server exited at start 3 times; see procs/toxiproxy.log")

    def view(self, name: str) -> ProxyView | None:
        """The proxy ``name`` if it was created."""
        server = self._server
        return server.proxies.get(name) if server is not None else None

    def ensure(self, name: str, upstream: str, listen_host: str | None = None) -> ProxyView:
        """The scenario proxy ``name`` forwarding to ``upstream`` (``host:port``): created on
        first use (listening on ``listen_host``, default the server's own address, port chosen by
        toxiproxy), re-pointed when the upstream moved."""
        with self._lock:
            server = self._server
            if server is None:
                raise HarnessError(f"proxy {name}: the run's toxiproxy server is not running")
            have = server.proxies.get(name)
            if have is not None and have.upstream == upstream:
                return have
            proxy = toxi.proxy_name(self.run_id, name)
            base = {"proxy": name, "name": proxy, "upstream": upstream}
            self.timeline.append("invoke", "harness", "proxy", base)
            try:
                if have is None:
                    info = server.api.create_proxy(proxy, upstream, listen=f"{listen_host or server.host.address}:0")
                else:
                    info = server.api.update_proxy(proxy, upstream=upstream)
            except toxi.ToxiproxyError as exc:
                self.timeline.append("fail", "harness", "proxy", {**base, "error": str(exc)})
                raise HarnessError(f"proxy {name}: {exc}") from None
            listen = str(info.get("listen", ""))
            view = ProxyView(name, proxy, server.api.url, listen, upstream)
            server.proxies[name] = view
            port = listen.rpartition(":")[2]
            if port.isdigit():
                self.harness_ports.add(int(port))
            self.timeline.append("ok", "harness", "proxy", {**base, "listen": listen, "updated": have is not None})
            return view

    def check_exit(self) -> None:
        """Record the server's death if it dies before teardown (its proxies go with it)."""
        server = self._server
        if server is None or server.exit_recorded or server.stopping:
            return
        rc = server.proc.poll()
        if rc is not None:
            server.exit_recorded = True
            self.timeline.append("info", "harness", "toxiproxy_exit", {"pid": server.proc.pid, "rc": rc})

    def stop(self, grace: float) -> None:
        """Teardown (after the processes stopped): reset, delete the run's proxies, stop the
        server (TERM, grace, KILL), release its port."""
        server = self._server
        if server is None:
            return
        value: dict[str, Any] = {"pid": server.proc.pid, "removed": []}
        if server.proc.poll() is None:
            api = toxi.ToxiproxyAPI(server.api.url, timeout=2.0)
            try:
                api.reset()
                for view in server.proxies.values():
                    if api.delete_proxy(view.proxy):
                        value["removed"].append(view.proxy)
            except toxi.ToxiproxyError as exc:
                value["error"] = str(exc)
        server.stopping = True
        result = server.proc.stop(grace)
        server.lease.release()
        value.update(rc=result.rc, escalated=result.escalated, already_exited=result.already_exited)
        self.timeline.append("ok", "harness", "toxiproxy_stop", value)

    def leak_probes(self) -> list[tuple[Host, int]]:
        """(host, port) of every port the harness's proxies held (the leak scan checks them)."""
        host = self.host
        return [(host, port) for port in sorted(self.harness_ports)] if host is not None else []


def _await_api(server: _Server, deadline: float) -> tuple[str | None, str]:
    """(its version, "") once the API answers; (None, why) when it exits or the deadline passes."""
    while True:
        try:
            return server.api.version(), ""
        except toxi.ToxiproxyError as exc:
            error = str(exc)
        rc = server.proc.poll()
        if rc is not None:
            return None, f"exited (rc {rc}) before its API answered ({error})"
        if time.monotonic() > deadline:
            return None, f"its API did not answer in time (budgets.step): {error}"
        time.sleep(0.05)
