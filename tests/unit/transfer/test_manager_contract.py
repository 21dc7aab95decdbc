"""The NIXL transfer manager's contract (docs/contract.md#transfer-manager), on scripted fake agents.

Our own statement of the contract, plus what measurement added on UCX-TCP
(``docs/contract.md#what-measurement-added``): NIXL 1.5.1 raises instead of returning "ERR",
a leaving peer must also send INVL (``invalidate_local_metadata``) to clear the
source's record of it, and a fetch request can be silently lost, so it is re-sent.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import mxref.transfer.manager as nt
from mxref.errors import HandshakeTimeout, TransferFailed, TransferTimeout
from mxref.events import EventLog
from mxref.metrics import ReaderMetrics
from mxref.transfer.manager import LocalTensor, NixlTransferManager, PostedRead, PumpPacing


class ScriptedAgent:
    """Records every call in order; its transfer states come from ``states`` (a value or an exception)."""

    def __init__(self, *, loads_after_fetches: int = 1, remove_error: Exception | None = None,
                 invalidate_error: Exception | None = None, states: list[Any] | None = None,
                 post: Any = "PROC") -> None:
        self.log: list[tuple[Any, ...]] = []
        self.loads_after_fetches = loads_after_fetches
        self.fetches: dict[str, int] = {}
        self.remove_error = remove_error
        self.invalidate_error = invalidate_error
        self.states = list(states or ["DONE"])
        self.post = post

    # metadata
    def fetch_remote_metadata(self, name: str, ip: str, port: int) -> None:
        self.log.append(("fetch", name, ip, port))
        self.fetches[name] = self.fetches.get(name, 0) + 1

    def check_remote_metadata(self, name: str) -> bool:
        return self.fetches.get(name, 0) >= self.loads_after_fetches

    def add_remote_agent(self, blob: bytes) -> bytes:
        self.log.append(("add", blob))
        return b"blob-peer"

    def remove_remote_agent(self, name: str) -> None:
        self.log.append(("remove", name))
        if self.remove_error is not None:
            raise self.remove_error

    def send_local_metadata(self, ip: str, port: int) -> None:
        self.log.append(("push", ip, port))

    def invalidate_local_metadata(self, ip: str, port: int) -> None:
        self.log.append(("invalidate", ip, port))
        if self.invalidate_error is not None:
            raise self.invalidate_error

    # memory
    def register_memory(self, descs: Any, mem_type: str) -> str:
        token = f"reg{sum(1 for c in self.log if c[0] == 'register')}"
        self.log.append(("register", token))
        return token

    def deregister_memory(self, reg: Any) -> None:
        self.log.append(("deregister", reg))

    def get_agent_metadata(self) -> bytes:
        return b"our-md"

    # transfers
    def get_xfer_descs(self, descs: Any, mem_type: str) -> Any:
        return descs

    def initialize_xfer(self, op: str, local: Any, remote: Any, name: str) -> str:
        self.log.append(("init", op, name))
        return "h"

    def transfer(self, handle: Any) -> Any:
        self.log.append(("post", handle))
        if isinstance(self.post, Exception):
            raise self.post
        return self.post

    def check_xfer_state(self, handle: Any) -> Any:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(state, Exception):
            raise state
        return state

    def release_xfer_handle(self, handle: Any) -> None:
        self.log.append(("release_xfer", handle))


class FakeClock:
    """``time`` for the manager module: sleep advances a virtual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 1e-4)


def manager(agent: Any = None, *, metadata: bytes = b"md", **kw: Any) -> NixlTransferManager:
    mgr = NixlTransferManager("reader-x", 0, **kw)
    mgr._agent = agent if agent is not None else ScriptedAgent()
    mgr._metadata = metadata
    return mgr


def names(log: list[tuple[Any, ...]], kind: str) -> list[Any]:
    return [c[1] for c in log if c[0] == kind]


# ----------------------------------------------------------------------------- peer tracking


class TestPeerTracking:
    def test_fetched_peer_is_tracked_with_its_listener(self) -> None:
        mgr = manager()
        mgr.fetch_remote_and_wait("src-1", "127.0.0.1", 7001, timeout_seconds=1)
        assert mgr._remote_agents == {"src-1": ("127.0.0.1", 7001)}

    def test_blob_peer_is_tracked_without_an_endpoint(self) -> None:
        mgr = manager()
        assert mgr.add_remote_agent(b"blob") == "blob-peer"  # bytes from NIXL become str
        assert mgr._remote_agents == {"blob-peer": None}

    def test_a_peer_that_never_loads_is_not_tracked(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(nt, "time", FakeClock())
        mgr = manager(ScriptedAgent(loads_after_fetches=10**9))
        with pytest.raises(HandshakeTimeout) as err:
            mgr.fetch_remote_and_wait("src-1", "127.0.0.1", 7001, timeout_seconds=2.5)
        assert isinstance(err.value, TimeoutError)
        assert "src-1" in str(err.value) and "127.0.0.1:7001" in str(err.value)
        assert mgr._remote_agents == {}

    def test_the_fetch_is_resent_about_every_second_until_loaded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A request sent over a cached socket to a restarted peer is lost: ask again."""
        clock = FakeClock()
        monkeypatch.setattr(nt, "time", clock)
        agent = ScriptedAgent(loads_after_fetches=4)
        mgr = manager(agent)
        start = clock.now
        mgr.fetch_remote_and_wait("src-1", "127.0.0.1", 7001, timeout_seconds=30)
        assert agent.fetches["src-1"] == 4
        assert 3.0 <= clock.now - start < 3.5, "4 fetches: at 0, ~1, ~2 and ~3 s"
        assert mgr._remote_agents == {"src-1": ("127.0.0.1", 7001)}

    def test_a_timed_out_fetch_resends_within_its_budget_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(nt, "time", FakeClock())
        agent = ScriptedAgent(loads_after_fetches=10**9)
        with pytest.raises(HandshakeTimeout):
            manager(agent).fetch_remote_and_wait("src-1", "127.0.0.1", 7001, timeout_seconds=2.5)
        assert agent.fetches["src-1"] == 3  # at 0, 1 and 2 s

    def test_peer_gauge_follows_the_inventory(self) -> None:
        metrics = ReaderMetrics()
        mgr = manager(metrics=metrics.nixl)
        mgr.fetch_remote_and_wait("a", "127.0.0.1", 1, timeout_seconds=1)
        mgr.add_remote_agent(b"x")
        assert metrics.registry.get_sample_value("mxref_nixl_remote_agents") == 2
        mgr.remove_remote_agent("a")
        assert metrics.registry.get_sample_value("mxref_nixl_remote_agents") == 1


# ----------------------------------------------------------------------------- disconnect


class TestDisconnect:
    def test_shutdown_removes_every_peer_then_deregisters_in_reverse_then_drops_the_agent(self) -> None:
        agent = ScriptedAgent()
        mgr = manager(agent)
        mgr._registered_memory = ["m1", "m2", "m3"]
        mgr.fetch_remote_and_wait("src-a", "127.0.0.1", 7001, timeout_seconds=1)
        mgr.add_remote_agent(b"blob")
        seen_alive: list[bool] = []
        real_remove = agent.remove_remote_agent

        def spy(name: str) -> None:
            seen_alive.append(mgr._agent is agent)
            real_remove(name)

        agent.remove_remote_agent = spy  # type: ignore[method-assign]
        mgr.shutdown()
        kinds = [c[0] for c in agent.log if c[0] in ("remove", "deregister")]
        assert kinds == ["remove", "remove", "deregister", "deregister", "deregister"]
        assert sorted(names(agent.log, "remove")) == ["blob-peer", "src-a"]
        assert names(agent.log, "deregister") == ["m3", "m2", "m1"]
        assert seen_alive == [True, True]
        assert mgr._agent is None and mgr._remote_agents == {} and mgr._registered_memory == []
        assert not mgr.is_healthy()

    def test_removal_invalidates_our_record_at_a_peer_with_a_listener(self) -> None:
        agent = ScriptedAgent()
        mgr = manager(agent)
        mgr.fetch_remote_and_wait("src-a", "10.1.2.3", 7001, timeout_seconds=1)
        mgr.add_remote_agent(b"blob")
        mgr.shutdown()
        assert [c for c in agent.log if c[0] == "invalidate"] == [("invalidate", "10.1.2.3", 7001)]
        assert agent.log.index(("remove", "src-a")) < agent.log.index(("invalidate", "10.1.2.3", 7001))

    def test_removing_twice_is_harmless(self) -> None:
        agent = ScriptedAgent()
        mgr = manager(agent)
        mgr.fetch_remote_and_wait("src-a", "127.0.0.1", 7001, timeout_seconds=1)
        assert mgr.remove_remote_agent("src-a") is True
        assert mgr.remove_remote_agent("src-a") is True
        assert names(agent.log, "remove") == ["src-a", "src-a"]
        assert len([c for c in agent.log if c[0] == "invalidate"]) == 1, "the endpoint is forgotten after the first"

    def test_a_failing_removal_is_reported_and_does_not_break_shutdown(self) -> None:
        agent = ScriptedAgent(remove_error=RuntimeError("NIXL_ERR_NOT_FOUND"),
                              invalidate_error=RuntimeError("connection refused"))
        mgr = manager(agent)
        mgr._registered_memory = ["m1"]
        mgr.fetch_remote_and_wait("src-a", "127.0.0.1", 7001, timeout_seconds=1)
        mgr.fetch_remote_and_wait("src-b", "127.0.0.1", 7002, timeout_seconds=1)
        mgr.shutdown()  # must not raise
        assert sorted(names(agent.log, "remove")) == ["src-a", "src-b"], "one failure does not stop the others"
        assert names(agent.log, "deregister") == ["m1"]
        assert mgr._agent is None and mgr._remote_agents == {}

    def test_a_failing_removal_returns_false(self) -> None:
        mgr = manager(ScriptedAgent(remove_error=RuntimeError("boom")))
        mgr.fetch_remote_and_wait("src-a", "127.0.0.1", 7001, timeout_seconds=1)
        assert mgr.remove_remote_agent("src-a") is False

    def test_without_an_agent_nothing_happens(self) -> None:
        mgr = NixlTransferManager("t", 0)
        assert mgr.remove_remote_agent("x") is False
        assert mgr.disconnect_remote_agents() == 0
        mgr.shutdown()
        mgr.shutdown()

    def test_disconnect_counts_and_empties(self) -> None:
        mgr = manager()
        for i in range(3):
            mgr.fetch_remote_and_wait(f"s{i}", "127.0.0.1", 7000 + i, timeout_seconds=1)
        assert mgr.disconnect_remote_agents() == 3
        assert mgr.disconnect_remote_agents() == 0

    def test_shutdown_events(self, tmp_path: Path) -> None:
        path = tmp_path / "ev.jsonl"
        mgr = manager(events=EventLog(path, "rd", "reader"))
        mgr._registered_memory = ["m1"]
        mgr.fetch_remote_and_wait("src-a", "127.0.0.1", 7001, timeout_seconds=1)
        mgr.shutdown()
        events = [json.loads(line) for line in path.read_text().splitlines()]
        assert [(e["event"], e.get("step")) for e in events] == [
            ("peer_disconnected", None), ("shutdown_step", "disconnect_peers"),
            ("shutdown_step", "deregister"), ("nixl_audit", None), ("shutdown_step", "drop_agent"),
        ]
        assert events[0]["agent_name"] == "src-a" and events[0]["invalidated"] is True


class TestAtexit:
    def test_registered_once_and_unregistered_on_shutdown(self, monkeypatch: pytest.MonkeyPatch) -> None:
        registered: list[Any] = []
        unregistered: list[Any] = []
        monkeypatch.setattr("mxref.transfer.manager.atexit.register", registered.append)
        monkeypatch.setattr("mxref.transfer.manager.atexit.unregister", unregistered.append)
        mgr = manager()
        mgr._register_atexit()
        mgr._register_atexit()
        assert registered == [mgr.shutdown]
        mgr.shutdown()
        mgr.shutdown()
        assert unregistered == [mgr.shutdown]

    def test_create_agent_registers_the_hook(self, monkeypatch: pytest.MonkeyPatch) -> None:
        registered: list[Any] = []
        monkeypatch.setattr("mxref.transfer.manager.atexit.register", registered.append)
        monkeypatch.setattr("mxref.transfer.manager.atexit.unregister", lambda fn: None)

        class Api:
            @staticmethod
            def nixl_agent_config(**kw: Any) -> dict[str, Any]:
                return kw

            @staticmethod
            def nixl_agent(name: str, conf: Any) -> ScriptedAgent:
                return ScriptedAgent()

        monkeypatch.setattr(nt, "import_nixl", lambda: Api)
        mgr = NixlTransferManager("t", 0)
        mgr.create_agent(7100, progress_thread=False)
        assert registered == [mgr.shutdown]
        assert mgr.is_healthy() and mgr.listen_port == 7100
        mgr.shutdown()


# ----------------------------------------------------------------------------- health


NIXL_DISCONNECT = RuntimeError("nixlRemoteDisconnectError: NIXL_ERR_REMOTE_DISCONNECT")


class TestHealth:
    def test_fresh_manager_with_metadata_is_healthy(self) -> None:
        assert manager().is_healthy()
        assert not manager(metadata=b"").is_healthy()
        mgr = manager()
        mgr._agent = None
        assert not mgr.is_healthy()

    def test_initial_error_starts_unhealthy(self) -> None:
        mgr = manager(initial_error="READ timed out earlier")
        assert not mgr.is_healthy() and mgr.data_plane_error == "READ timed out earlier"
        mgr._agent.states = ["DONE"]
        mgr._wait_for_xfer("h", 1.0, "READ")
        assert mgr.is_healthy()

    def test_a_timeout_sets_it(self) -> None:
        mgr = manager(ScriptedAgent(states=["PROC"]))
        with pytest.raises(TransferTimeout) as err:
            mgr._wait_for_xfer("h", 0.02, "READ")
        assert isinstance(err.value, TimeoutError)
        assert not mgr.is_healthy() and "timed out" in (mgr.data_plane_error or "")

    @pytest.mark.parametrize("state", ["ERR", "ERROR", "FAIL"])
    def test_an_error_state_sets_it(self, state: str) -> None:
        mgr = manager(ScriptedAgent(states=[state]))
        with pytest.raises(TransferFailed):
            mgr._wait_for_xfer("h", 1.0, "READ")
        assert state in (mgr.data_plane_error or "")

    def test_a_raised_nixl_error_sets_it(self) -> None:
        """NIXL 1.5.1 never returns ERR: a dead peer makes check_xfer_state raise."""
        mgr = manager(ScriptedAgent(states=["PROC", NIXL_DISCONNECT]))
        with pytest.raises(TransferFailed) as err:
            mgr._wait_for_xfer("h", 1.0, "READ")
        assert isinstance(err.value, RuntimeError)
        assert "REMOTE_DISCONNECT" in (mgr.data_plane_error or "")
        assert not mgr.is_healthy()

    def test_a_success_clears_it(self) -> None:
        agent = ScriptedAgent(states=["PROC"])
        mgr = manager(agent)
        with pytest.raises(TransferTimeout):
            mgr._wait_for_xfer("h", 0.01, "READ")
        agent.states = ["PROC", "PROC", "DONE"]
        mgr._wait_for_xfer("h", 1.0, "READ")
        assert mgr.is_healthy() and mgr.data_plane_error is None

    def test_health_transitions_are_published(self, tmp_path: Path) -> None:
        metrics = ReaderMetrics()
        path = tmp_path / "ev.jsonl"
        agent = ScriptedAgent(states=[NIXL_DISCONNECT])
        mgr = manager(agent, metrics=metrics.nixl, events=EventLog(path, "rd", "reader"))
        with pytest.raises(TransferFailed):
            mgr._wait_for_xfer("h", 1.0, "READ")
        assert metrics.registry.get_sample_value("mxref_data_plane_healthy") == 0
        assert metrics.registry.get_sample_value("mx_nixl_data_plane_errors_total", {"kind": "status_error"}) == 1
        agent.states = ["DONE"]
        mgr._wait_for_xfer("h", 1.0, "READ")
        assert metrics.registry.get_sample_value("mxref_data_plane_healthy") == 1
        health = [json.loads(x) for x in path.read_text().splitlines()]
        assert [(e["event"], e["healthy"]) for e in health] == [("health", False), ("health", True)]


class TestReceive:
    def _mgr(self, agent: ScriptedAgent) -> NixlTransferManager:
        mgr = manager(agent)
        mgr._local_tensors = {"t0": LocalTensor("t0", 0x1000, 64, "float16")}
        return mgr

    def _remote(self) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(name="t0", addr=0x9000, size=64, device_id=0, dtype="float16")]

    def test_a_raise_at_post_sets_health_and_releases_the_handle(self) -> None:
        agent = ScriptedAgent(post=NIXL_DISCONNECT)
        mgr = self._mgr(agent)
        with pytest.raises(TransferFailed):
            mgr.receive_from_source(b"", self._remote(), 1.0, remote_agent_name="src")
        assert "at post" in (mgr.data_plane_error or "")
        assert ("release_xfer", "h") in agent.log

    def test_a_raise_at_init_sets_health(self, monkeypatch: pytest.MonkeyPatch) -> None:
        agent = ScriptedAgent()

        def init(op: str, local: Any, remote: Any, name: str) -> str:
            raise RuntimeError("nixlNotFoundError")

        monkeypatch.setattr(agent, "initialize_xfer", init)
        mgr = self._mgr(agent)
        with pytest.raises(TransferFailed):
            mgr.receive_from_source(b"", self._remote(), 1.0, remote_agent_name="src")
        assert "could not be prepared" in (mgr.data_plane_error or "")

    def test_a_timeout_releases_the_handle(self) -> None:
        agent = ScriptedAgent(states=["PROC"])
        mgr = self._mgr(agent)
        with pytest.raises(TransferTimeout):
            mgr.receive_from_source(b"", self._remote(), 0.02, remote_agent_name="src")
        assert ("release_xfer", "h") in agent.log

    def test_centralized_receive_tracks_the_blob_peer(self, mock_accelerator_backend_cls: type) -> None:
        agent = ScriptedAgent()
        accel = mock_accelerator_backend_cls()
        mgr = manager(agent, accelerator_backend=accel)
        assert mgr.receive_from_source(b"blob", [], 1.0) == (0, 0, "empty")
        assert accel.devices == [0]
        assert mgr._remote_agents == {"blob-peer": None}
        mgr.shutdown()
        assert names(agent.log, "remove") == ["blob-peer"]


class TestBatchHealth:
    def test_a_batch_timeout_sets_it(self) -> None:
        mgr = manager(ScriptedAgent(states=["PROC"]))
        with pytest.raises(TransferTimeout):
            mgr._wait_for_xfers(["a", "b"], 0.02, "READ batch")
        assert "timed out" in (mgr.data_plane_error or "") and "2 of 2" in (mgr.data_plane_error or "")

    def test_one_failed_handle_keeps_the_batch_unhealthy(self) -> None:
        # first two handles complete, the third raises: the batch failed
        mgr = manager(ScriptedAgent(states=["DONE", "DONE", NIXL_DISCONNECT]))
        with pytest.raises(TransferFailed):
            mgr._wait_for_xfers(["a", "b", "c"], 1.0, "READ batch")
        assert not mgr.is_healthy()

    def test_one_err_handle_keeps_the_batch_unhealthy_even_when_health_was_bad_before(self) -> None:
        mgr = manager(ScriptedAgent(states=["DONE", "ERR", "DONE"]), initial_error="earlier")
        with pytest.raises(TransferFailed):
            mgr._wait_for_xfers(["a", "b", "c"], 1.0, "READ batch")
        assert "ERR" in (mgr.data_plane_error or "")

    def test_completed_siblings_never_report_health_while_one_is_pending(self, tmp_path: Path) -> None:
        """Cleared once for the whole set: a heartbeat reading health mid-batch must not see it restored."""
        path = tmp_path / "ev.jsonl"
        agent = ScriptedAgent()
        seen: list[bool] = []
        mgr = manager(agent, initial_error="earlier", events=EventLog(path, "rd", "reader"))
        states = {"a": ["DONE"], "b": ["PROC"] * 3 + ["DONE"]}

        def check(handle: str) -> str:
            seen.append(mgr.is_healthy())
            queue = states[handle]
            return queue.pop(0) if len(queue) > 1 else queue[0]

        agent.check_xfer_state = check  # type: ignore[method-assign]
        mgr._wait_for_xfers(["a", "b"], 1.0, "READ batch")
        assert seen and not any(seen), "health came back before the batch completed"
        assert mgr.is_healthy()
        events = [json.loads(x) for x in path.read_text().splitlines()]
        assert [e["healthy"] for e in events if e["event"] == "health"] == [True]

    def test_a_complete_batch_clears_it(self) -> None:
        mgr = manager(ScriptedAgent(states=["PROC", "DONE", "DONE", "DONE"]), initial_error="earlier")
        mgr._wait_for_xfers(["a", "b"], 1.0, "READ batch")
        assert mgr.is_healthy()

    def test_an_empty_set_does_not_clear_it(self) -> None:
        mgr = manager(initial_error="earlier")
        mgr._wait_for_xfers([], 1.0, "READ batch")
        assert mgr.data_plane_error == "earlier"
        assert mgr.await_read_batches([], timeout_seconds=1.0) == 0
        assert mgr.data_plane_error == "earlier"

    def test_the_public_batch_wait_records_and_releases(self) -> None:
        agent = ScriptedAgent(states=["PROC"])
        mgr = manager(agent)
        posted = [PostedRead(handle=f"h{i}", total_bytes=10, num_ranges=1, posted_at=0.0) for i in range(2)]
        with pytest.raises(TransferTimeout):
            mgr.await_read_batches(posted, timeout_seconds=0.02)
        assert not mgr.is_healthy()
        assert names(agent.log, "release_xfer") == ["h0", "h1"]
        agent.states = ["DONE"]
        assert mgr.await_read_batches(posted, timeout_seconds=1.0) == 20
        assert mgr.is_healthy()


def test_a_blob_loaded_peer_we_pushed_to_is_invalidated_on_release() -> None:
    """Central mode has no endpoint, but a reader that pushed its metadata to the source's
    listener left a record there: releasing the source must invalidate it too."""
    agent = ScriptedAgent()
    mgr = manager(agent)
    name = mgr.add_remote_agent(b"blob")
    mgr.push_local_metadata(name, "10.0.0.9", 5555)
    assert mgr._remote_agents == {name: ("10.0.0.9", 5555)}
    assert mgr.remove_remote_agent(name) is True
    assert agent.log[-3:] == [("push", "10.0.0.9", 5555), ("remove", name), ("invalidate", "10.0.0.9", 5555)]


# ----------------------------------------------------------------------------- progress pump pacing


class PollingAgent:
    """An agent whose ``get_new_notifs`` records when it was called and spends ``busy_cpu_s``
    of CPU on the calls ``busy_at`` names (a poll that served a READ request)."""

    def __init__(self, busy_at: set[int], busy_cpu_s: float) -> None:
        self.calls: list[float] = []
        self.busy_at = busy_at
        self.busy_cpu_s = busy_cpu_s
        self.lock = threading.Lock()

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        with self.lock:
            self.calls.append(time.monotonic())
            n = len(self.calls)
        if n in self.busy_at:
            end = time.thread_time() + self.busy_cpu_s
            while time.thread_time() < end:
                pass
        return {}


class TestPumpPacing:
    PACE = PumpPacing(idle_s=0.01, busy_call_s=0.002, linger_s=0.1)

    def run_pump(self, agent: PollingAgent, seconds: float) -> list[float]:
        mgr = manager(agent)
        mgr.start_progress_pump(self.PACE)
        try:
            time.sleep(seconds)
        finally:
            mgr._stop_pump()
        assert mgr._pump is None
        with agent.lock:
            return list(agent.calls)

    def test_idle_polls_every_idle_interval_at_most(self) -> None:
        calls = self.run_pump(PollingAgent(set(), 0.0), 0.3)
        # 0.3 s at one poll per >= 10 ms: 31 at most (an idle wait is never cut short)
        assert 3 <= len(calls) <= 31
        assert min(b - a for a, b in itertools.pairwise(calls)) >= 0.009

    def test_a_busy_poll_makes_it_poll_at_once_for_the_linger_then_slow_again(self) -> None:
        calls = self.run_pump(PollingAgent({3}, 0.005), 0.5)
        busy_end = calls[3]  # the call after the busy one starts when the busy one ended
        within = [t for t in calls if busy_end <= t < busy_end + self.PACE.linger_s * 0.9]
        after = [t for t in calls if t >= busy_end + self.PACE.linger_s * 1.1]
        assert len(within) > 100, "no fast polls after a busy poll"
        # after the linger: back to idle pacing (0.5 s - ~0.13 s at >= 10 ms a poll)
        assert after and min(b - a for a, b in itertools.pairwise(after)) >= 0.009

    def test_wall_time_without_cpu_is_not_work(self) -> None:
        """A poll that is slow because it waited (off the CPU, as when preempted) is not work."""
        agent = PollingAgent(set(), 0.0)
        original = agent.get_new_notifs

        def sleepy() -> dict[str, list[bytes]]:
            result = original()
            if len(agent.calls) == 2:
                time.sleep(0.02)  # 20 ms of wall time, no CPU
            return result

        agent.get_new_notifs = sleepy  # type: ignore[method-assign]
        calls = self.run_pump(agent, 0.3)
        assert len(calls) <= 31
