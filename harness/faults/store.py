"""Store faults: ``store_wipe`` empties a ``redis`` process of the scenario (FLUSHALL).

The field incident it stages is ModelExpress #658: the metadata store is reset under a live
fleet, every record is gone at once, and the workers keep heartbeating ids the store no longer
knows. What must follow is the subject's business (sources publish again, readers fall back or
recover); the fault only wipes, through redis-py with a bounded timeout, and records how many
keys there were and how many FLUSHALL left (0 unless something wrote in between). Nothing to
heal: a wiped store stays wiped. The other faults on a store are the process faults (``pause``,
``kill``, ``restart``) on its redis process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import redis

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, register
from harness.record.witness import Witness
from harness.spec import Duration, Name, Target

__all__ = ["StoreWipe", "StoreWipeSpec"]


class StoreWipeSpec(FaultSpec):
    """FLUSHALL the redis process ``target`` (each Redis call bounded by ``timeout``)."""

    kind: Literal["store_wipe"]
    target: Name
    timeout: Duration = 5.0

    def process_refs(self) -> tuple[str, ...]:
        return (self.target,)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        spec = processes.get(self.target)
        role = getattr(spec, "role", None)
        if spec is not None and role != "redis":
            return (("target", f"{self.target!r} is a {role} process; store_wipe empties a redis process"),)
        return ()


@register
class StoreWipe(Fault[StoreWipeSpec, None]):
    kind = "store_wipe"
    Spec = StoreWipeSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        spec = self.spec
        listening = ctx.wait_event(spec.target, "listening", {"what": "redis"}, spec.timeout)
        address = ctx.locate(spec.target).address
        port = int(listening["port"])
        client = redis.Redis(host=address, port=port, socket_timeout=spec.timeout, socket_connect_timeout=spec.timeout)
        try:
            before = int(client.dbsize())
            client.flushall()
            after = int(client.dbsize())
        except redis.RedisError as exc:
            raise FaultError(f"store_wipe {spec.target} at {address}:{port}: {type(exc).__name__}: {exc}") from None
        finally:
            client.close()
        figures = {"keys_before": before, "keys_after": after}
        if before and after < before:
            witness = Witness.seen(f"{before} keys before, {after} after", **figures)
        else:  # an empty store wiped, or one whose keys stayed: nothing was taken away
            witness = Witness.none(f"{before} keys before, {after} after", **figures)
        return Injected(None, {"target": spec.target, "address": f"{address}:{port}",
                               "keys_removed": before, "keys_after": after, "witness": witness.to_json()})
