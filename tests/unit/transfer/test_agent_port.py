"""The NIXL metadata listener's port: chosen free, then bound by NIXL (it cannot bind port 0).
Another process can take the port in between; the agent is then created on another port, a
bounded number of times (a parallel test run once lost a source to "Address already in use")."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mxref.process import EPHEMERAL_RANGE, free_port, listener_ports
from mxref.transfer.manager import NixlTransferManager


class FlakyBind(NixlTransferManager):
    """A manager whose agent creation fails (as a taken port does) the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__("flaky", 0)
        self.failures = failures
        self.tried: list[int] = []

    def create_agent(self, listen_port: int, progress_thread: bool) -> None:
        self.tried.append(listen_port)
        if len(self.tried) <= self.failures:
            raise RuntimeError(f"listener on {listen_port}: Address already in use")
        self._listen_port = listen_port


def test_a_port_taken_between_choosing_and_binding_is_retried_on_another() -> None:
    mgr = FlakyBind(failures=1)
    port = mgr.create_agent_on_free_port(progress_thread=False)
    assert len(mgr.tried) == 2 and port == mgr.tried[-1] == mgr.listen_port
    assert all(0 < p < 65536 for p in mgr.tried)


def test_the_retries_are_bounded_and_the_last_error_is_raised() -> None:
    mgr = FlakyBind(failures=10)
    with pytest.raises(RuntimeError, match="Address already in use"):
        mgr.create_agent_on_free_port(progress_thread=False, attempts=3)
    assert len(mgr.tried) == 3


def test_the_chosen_port_is_free_on_every_address_as_nixls_listener_binds_it() -> None:
    """NIXL's listener binds INADDR_ANY: a port held on another address (here 127.0.0.2) would
    fail its bind, so the probe must never hand one out (a probe of 127.0.0.1 alone did: three
    attempts in a row lost to EADDRINUSE on a loaded machine)."""
    held = []
    ports = listener_ports()
    try:
        for port in ports[:: max(1, len(ports) // 1500)]:  # every few ports of the range: 1500 held
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.2", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        assert len(taken) > 1000
        chosen = {free_port() for _ in range(300)}
        assert not chosen & taken
    finally:
        for s in held:
            s.close()


def test_the_chosen_port_is_none_the_kernel_gives_an_outgoing_connection() -> None:
    """Ports of the kernel's ephemeral range go to outgoing connections on their own: one chosen
    there could be taken between the probe and the listener's bind."""
    low, high = (int(x) for x in Path(EPHEMERAL_RANGE).read_text().split()[:2])
    chosen = [free_port() for _ in range(200)]
    assert not [p for p in chosen if low <= p <= high]
    assert len(set(chosen)) > 150  # picked at random, not one after another
