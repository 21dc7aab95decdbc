"""The ``store_wipe`` fault over the fake context and a fake Redis client: where it connects
(the target's host, the port of its ``listening what=redis`` event), what it records (the
keys FLUSHALL removed), a Redis error as a ``FaultError`` naming the address, and a target
that is not a redis process refused at validation."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from fixtures.fault_context import FakeContext

from harness.errors import FaultError
from harness.faults import make_fault
from harness.faults.store import StoreWipeSpec
from harness.scenario.models import RedisProcess, ServerProcess


class FakeRedis:
    """Keys, FLUSHALL, DBSIZE; records how it was built and whether it was closed."""

    made: list[FakeRedis] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.keys = 5
        self.closed = False
        self.error: redis.RedisError | None = None
        FakeRedis.made.append(self)

    def dbsize(self) -> int:
        if self.error is not None:
            raise self.error
        return self.keys

    def flushall(self) -> bool:
        self.keys = 0
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_redis(monkeypatch: pytest.MonkeyPatch) -> type[FakeRedis]:
    FakeRedis.made = []
    monkeypatch.setattr(redis, "Redis", FakeRedis)
    return FakeRedis


@pytest.fixture
def ctx() -> FakeContext:
    ctx = FakeContext()
    ctx.add_process("store", role="redis")
    ctx.events[("store", "listening")] = {"t": 0.5, "what": "redis", "port": 6390}
    return ctx


def test_store_wipe_flushes_the_redis_the_target_listens_on_and_records_the_keys(
    ctx: FakeContext, fake_redis: type[FakeRedis],
) -> None:
    fault = make_fault(StoreWipeSpec(kind="store_wipe", target="store", timeout=2.0), "wipe")
    injected = fault.inject(ctx)
    assert injected.token is None
    record = dict(injected.record)
    assert record.pop("witness") == {"effect": "seen", "why": "5 keys before, 0 after",
                                     "figures": {"keys_before": 5, "keys_after": 0}}
    assert record == {"target": "store", "address": "127.0.0.1:6390", "keys_removed": 5, "keys_after": 0}
    [client] = fake_redis.made
    assert client.kwargs == {"host": "127.0.0.1", "port": 6390, "socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    assert client.closed and client.keys == 0
    assert ctx.recorded("wait") == [("store", "listening", {"what": "redis"}, 2.0)]
    assert fault.heal(ctx, None) is None  # a wiped store stays wiped


def test_a_wipe_of_an_empty_store_is_no_effect(ctx: FakeContext, fake_redis: type[FakeRedis],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    class Empty(FakeRedis):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.keys = 0

    monkeypatch.setattr(redis, "Redis", Empty)
    injected = make_fault(StoreWipeSpec(kind="store_wipe", target="store"), "wipe").inject(ctx)
    assert injected.record["witness"]["effect"] == "none"  # nothing was there to take away


def test_store_wipe_turns_a_redis_error_into_a_fault_error_naming_the_address(
    ctx: FakeContext, fake_redis: type[FakeRedis], monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Failing(FakeRedis):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.error = redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(redis, "Redis", Failing)
    with pytest.raises(FaultError, match=r"store_wipe store at 127.0.0.1:6390: TimeoutError: Timeout reading"):
        make_fault(StoreWipeSpec(kind="store_wipe", target="store"), "wipe").inject(ctx)
    assert fake_redis.made[0].closed


def test_store_wipe_of_a_process_that_never_listened_fails_without_connecting(fake_redis: type[FakeRedis]) -> None:
    ctx = FakeContext()
    ctx.add_process("store", role="redis")
    with pytest.raises(FaultError, match="store did not emit listening"):
        make_fault(StoreWipeSpec(kind="store_wipe", target="store"), "wipe").inject(ctx)
    assert fake_redis.made == []


def test_store_wipe_needs_a_redis_process_and_a_running_one() -> None:
    spec = StoreWipeSpec(kind="store_wipe", target="server")
    processes = {"server": ServerProcess(role="server"), "store": RedisProcess(role="redis")}
    assert spec.process_issues(processes) == (("target", "'server' is a server process; store_wipe empties a redis process"),)
    assert StoreWipeSpec(kind="store_wipe", target="store").process_issues(processes) == ()
    assert spec.process_refs() == ("server",) and spec.running_refs() == ("server",)
