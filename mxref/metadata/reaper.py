"""The reaper: a thread that every scan interval marks READY/INITIALIZING records STALE once older
than the heartbeat timeout and deletes STALE records older than the GC timeout (ages always count
from the last publish, status update or heartbeat; marking STALE does not restart the clock;
``mxref.metadata.query.reap_action`` is the rule)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mxref import config
from mxref.metadata.records import Key, ReapAction, Reaped
from mxref.metadata.store import SourceStore
from mxref.metrics import ServerFamilies

logger = logging.getLogger("mxref.metadata")


class Reaper:
    """Demotes silent workers to STALE and deletes long-STALE ones, every scan interval.

    ``scan_once()`` is the whole job (tests call it with an injected clock);
    ``start()``/``stop()`` run it on a daemon thread. A failing scan is logged
    and the next one runs as usual. Events come from the store's listener.
    """

    def __init__(self, store: SourceStore, timers: config.ServerTimers, *, metrics: ServerFamilies | None = None,
                 on_deleted: Callable[[Key], None] = lambda key: None) -> None:
        self._store = store
        self._timers = timers
        self._metrics = metrics
        self._on_deleted = on_deleted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mx-reaper", daemon=True)

    def scan_once(self) -> list[Reaped]:
        done = self._store.reap(self._timers)
        for item in done:
            if self._metrics is not None:
                self._metrics.reaper_actions.labels(item.action.value).inc()
            if item.action is ReapAction.DELETE:
                self._on_deleted(item.record.key)
        return done

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop scanning; true when the thread ended within ``timeout_s``."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._timers.reaper_scan_interval_s):
            try:
                self.scan_once()
            except Exception:
                logger.exception("reaper scan failed; retrying next interval")


# --- process --------------------------------------------------------------------
