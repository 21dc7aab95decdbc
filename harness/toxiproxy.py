"""A small, bounded client of toxiproxy's HTTP API, and how a run names and records its proxies.

The runner starts one ``toxiproxy-server`` per run that has ``proxies`` and creates them
through this client; the ``toxic`` and ``proxy_down`` faults (``harness/faults/toxiproxy.py``)
change them through it, and their ``sweep`` finds a crashed run's API in its ledger entry.

Why not the ``toxiproxy-python`` package: its API host and port are class attributes shared
by every caller in the process, and its requests carry no timeout. Here every client has
its own URL and every call a deadline (``timeout``), so no wait is unbounded.

Every proxy of a run is named ``<run id>.<scenario proxy name>`` (``proxy_name``), so a
leftover is attributable to its run and ``mxchaos cleanup`` removes only that run's.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from harness.errors import HarnessError

__all__ = ["API_TIMEOUT_S", "ToxiproxyAPI", "ToxiproxyError", "proxy_name", "proxy_prefix", "recorded_api"]

API_TIMEOUT_S = 5.0


class ToxiproxyError(HarnessError):
    """A toxiproxy API call failed: ``status`` is the HTTP status (404: no such proxy or
    toxic), or None when the API did not answer at all."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def proxy_prefix(run_id: str) -> str:
    return f"{run_id}."


def proxy_name(run_id: str, name: str) -> str:
    """The toxiproxy-side name of the scenario proxy ``name`` in run ``run_id``."""
    return proxy_prefix(run_id) + name


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@dataclass(frozen=True)
class ToxiproxyAPI:
    """``url``: ``http://127.0.0.1:PORT``; each call waits at most ``timeout`` seconds."""

    url: str
    timeout: float = API_TIMEOUT_S

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = ""
            with contextlib.suppress(Exception):
                detail = str(json.loads(exc.read()).get("error", ""))
            raise ToxiproxyError(
                f"{method} {path}: HTTP {exc.code}" + (f": {detail}" if detail else ""), exc.code
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ToxiproxyError(f"{method} {path}: toxiproxy at {self.url} did not answer: {reason}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def version(self) -> str:
        return str(self._call("GET", "/version")).strip()

    def proxies(self) -> dict[str, dict[str, Any]]:
        return dict(self._call("GET", "/proxies") or {})

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> dict[str, Any]:
        """Create (enabled); the answer's ``listen`` carries the port the kernel chose."""
        return dict(self._call("POST", "/proxies", {"name": name, "upstream": upstream, "listen": listen, "enabled": True}))

    def update_proxy(self, name: str, **fields: Any) -> dict[str, Any]:
        """Change ``enabled`` / ``upstream`` / ``listen`` of an existing proxy."""
        return dict(self._call("POST", f"/proxies/{_quote(name)}", fields))

    def delete_proxy(self, name: str) -> bool:
        """True when it existed (False: already gone)."""
        return self._delete(f"/proxies/{_quote(name)}")

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._call("GET", f"/proxies/{_quote(proxy)}/toxics") or [])

    def add_toxic(self, proxy: str, toxic: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", f"/proxies/{_quote(proxy)}/toxics", toxic))

    def remove_toxic(self, proxy: str, toxic: str) -> bool:
        """True when it existed (False: the toxic, or its proxy, is already gone)."""
        return self._delete(f"/proxies/{_quote(proxy)}/toxics/{_quote(toxic)}")

    def _delete(self, path: str) -> bool:
        """DELETE ``path``; False when it was already gone (404), so heals stay idempotent."""
        try:
            self._call("DELETE", path)
        except ToxiproxyError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")


def recorded_api(run_id: str) -> str | None:
    """The toxiproxy API URL a run recorded in its ledger entry (None: none, or no entry)."""
    from harness.runner import ledger_dir  # lazily: the runner imports the fault registry, which imports this

    try:
        info = json.loads((ledger_dir() / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return None
    record = info.get("toxiproxy") if isinstance(info, dict) else None
    url = record.get("api") if isinstance(record, dict) else None
    return url if isinstance(url, str) else None
