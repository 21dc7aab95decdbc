"""Which store a scenario's servers use: ``with_store`` puts every server on a Redis store.

A scenario says ``store: redis`` (or ``mxchaos run --store redis`` / pytest ``--mxchaos-store
redis`` says it for every scenario, without editing the files): every server without its own
``store`` gets the scenario's ``redis`` process, and when the scenario has none a redis process
named ``store`` is added. Nothing else changes: the runner starts a server's redis process
before the server when no step has (``harness.engine.runner``), so the steps stay as written, and
faults may target ``store`` like any process. ``memory`` (the default) changes nothing.
"""

from __future__ import annotations

from harness.scenario.document import Scenario
from harness.scenario.models import RedisProcess, ServerProcess

__all__ = ["ADDED_STORE", "STORES", "with_store"]

STORES = ("memory", "redis")
ADDED_STORE = "store"
"""The name of the redis process ``with_store`` adds to a scenario that has none."""


def with_store(sc: Scenario, store: str | None) -> Scenario:
    """``sc`` on ``store`` (None: the scenario's own ``store`` key); ``ValueError`` naming the
    value when it is not a store, or when ``store`` is taken as a name by another process."""
    kind = store if store is not None else sc.store
    if kind not in STORES:
        raise ValueError(f"store {kind!r}: expected one of {', '.join(STORES)}")
    if kind == "memory":
        return sc
    processes = dict(sc.processes)
    redis_names = [name for name, spec in processes.items() if isinstance(spec, RedisProcess)]
    if redis_names:
        target = redis_names[0]
    else:
        if ADDED_STORE in processes:
            raise ValueError(f"scenario {sc.name}: cannot add a redis process named {ADDED_STORE!r}: "
                             f"the {processes[ADDED_STORE].role} process has that name")
        target = ADDED_STORE
        processes[target] = RedisProcess(role="redis")
    for name, spec in sc.processes.items():
        if isinstance(spec, ServerProcess) and spec.store is None:
            via = sc.proxies.get(spec.store_via) if spec.store_via is not None else None
            processes[name] = spec.model_copy(update={"store": via.upstream if via is not None else target})
    return sc.model_copy(update={"processes": processes, "store": "redis"})
