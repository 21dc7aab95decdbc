"""The NIXL resource audit: what one agent made and what it gave back.

A failed attempt ends by dropping its agent, which releases whatever the attempt forgot
(transfer handles, prepared descriptor lists, registrations, loaded peers) without a word.
``AuditedAgent`` wraps a NIXL agent and counts, per resource, every successful call that makes
one and every one that releases it; ``NixlAudit`` holds the counts (``open`` = made -
released). A call that raises made or released nothing.

The manager (``mxref.transfer.manager``) puts the counts on ``transfer_timeout`` and
``transfer_error`` (``handles_open``, ``dlists_open``, as the reader reports them), and emits a
``nixl_audit`` event (the balance) when it drops the agent: any ``open`` left there is a leak
that the drop hid. The ``nixl_balance`` check judges these. Metrics:
``mxref_nixl_resources_total{resource, op}`` (op: made | released) and
``mxref_nixl_resources_open{resource}`` (the process's sum over its agents).
"""

from __future__ import annotations

import threading
from typing import Any

from mxref.metrics import NixlFamilies

RESOURCES = ("handles", "dlists", "registrations", "remote_agents")


class NixlAudit:
    """Counts of one agent's resources, made and released."""

    def __init__(self, metrics: NixlFamilies | None = None) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self.made = dict.fromkeys(RESOURCES, 0)
        self.released = dict.fromkeys(RESOURCES, 0)
        self._peers: set[str] = set()  # remote agents loaded now (a name loaded twice is one)

    def count(self, resource: str, op: str, n: int = 1) -> None:
        with self._lock:
            (self.made if op == "made" else self.released)[resource] += n
        if self._metrics is not None:
            self._metrics.resources.labels(resource, op).inc(n)
            self._metrics.resources_open.labels(resource).inc(n if op == "made" else -n)

    def peer_loaded(self, name: str) -> None:
        with self._lock:
            new = name not in self._peers
            self._peers.add(name)
        if new:
            self.count("remote_agents", "made")

    def peer_removed(self, name: str) -> None:
        with self._lock:
            known = name in self._peers
            self._peers.discard(name)
        if known:
            self.count("remote_agents", "released")

    def open(self) -> dict[str, int]:
        with self._lock:
            return {r: self.made[r] - self.released[r] for r in RESOURCES}

    def open_fields(self) -> dict[str, int]:
        """``handles_open``, ``dlists_open``, ...: the fields of a failure event."""
        return {f"{r}_open": n for r, n in self.open().items()}

    def balance(self) -> dict[str, Any]:
        """The ``nixl_audit`` event's fields (without the agent's name)."""
        with self._lock:
            made, released = dict(self.made), dict(self.released)
        opened = {r: made[r] - released[r] for r in RESOURCES}
        return {"made": made, "released": released, "open": opened, "balanced": not any(opened.values())}


class AuditedAgent:
    """A NIXL agent whose resource calls are counted in ``audit``; everything else passes through."""

    def __init__(self, agent: Any, audit: NixlAudit) -> None:
        self._agent = agent
        self.audit = audit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def _made(self, resource: str, value: Any) -> Any:
        self.audit.count(resource, "made")
        return value

    def initialize_xfer(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("handles", self._agent.initialize_xfer(*args, **kwargs))

    def make_prepped_xfer(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("handles", self._agent.make_prepped_xfer(*args, **kwargs))

    def release_xfer_handle(self, handle: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._agent.release_xfer_handle(handle, *args, **kwargs)
        self.audit.count("handles", "released")
        return out

    def prep_xfer_dlist(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("dlists", self._agent.prep_xfer_dlist(*args, **kwargs))

    def release_dlist_handle(self, handle: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._agent.release_dlist_handle(handle, *args, **kwargs)
        self.audit.count("dlists", "released")
        return out

    def register_memory(self, *args: Any, **kwargs: Any) -> Any:
        return self._made("registrations", self._agent.register_memory(*args, **kwargs))

    def deregister_memory(self, *args: Any, **kwargs: Any) -> Any:
        out = self._agent.deregister_memory(*args, **kwargs)
        self.audit.count("registrations", "released")
        return out

    def add_remote_agent(self, metadata: bytes) -> Any:
        added = self._agent.add_remote_agent(metadata)
        self.audit.peer_loaded(added.decode() if isinstance(added, bytes) else str(added))
        return added

    def check_remote_metadata(self, name: str, *args: Any, **kwargs: Any) -> Any:
        loaded = self._agent.check_remote_metadata(name, *args, **kwargs)
        if loaded:
            self.audit.peer_loaded(name)
        return loaded

    def remove_remote_agent(self, name: str) -> Any:
        out = self._agent.remove_remote_agent(name)
        self.audit.peer_removed(name)
        return out
