"""The in-process TCP loopback ceiling: what any TCP transport could reach on this machine.

``loopback_gbps(nbytes)`` connects a socket pair over 127.0.0.1 inside this process, sends
``nbytes`` from a hot buffer on the calling thread and receives them into another hot buffer on
a second thread, both with large socket buffers, and returns GB/s (10^9 bytes/s). No
serialisation, no second process, no protocol: a NIXL READ over UCX-TCP between two processes
can only approach it, so ``raw / ceiling`` says how much of the machine a transport uses.
Every step is bounded (socket timeouts, a joined receiver); a stalled copy raises TimeoutError.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

BUFFER_BYTES = 4 << 20  # the hot buffer each side copies from / into, and the socket buffers


def loopback_gbps(nbytes: int, timeout_s: float = 30.0, buffer_bytes: int = BUFFER_BYTES) -> float:
    """GB/s of one copy of ``nbytes`` over a TCP connection on 127.0.0.1 inside this process."""
    if nbytes <= 0 or buffer_bytes <= 0:
        raise ValueError(f"nbytes ({nbytes}) and buffer_bytes ({buffer_bytes}) must be > 0")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(timeout_s)
        sender = socket.create_connection(listener.getsockname(), timeout=timeout_s)
        receiver, _ = listener.accept()
    received = [0]
    failure: list[BaseException] = []

    def receive() -> None:
        view = memoryview(bytearray(buffer_bytes))
        try:
            while received[0] < nbytes:
                n = receiver.recv_into(view, min(buffer_bytes, nbytes - received[0]))
                if n == 0:
                    raise ConnectionError(f"loopback sender closed after {received[0]} of {nbytes} bytes")
                received[0] += n
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    with sender, receiver:
        for s in (sender, receiver):
            s.settimeout(timeout_s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = memoryview(bytearray(b"\x5a" * buffer_bytes))
        thread = threading.Thread(target=receive, name="loopback-receiver", daemon=True)
        t0 = time.perf_counter()
        thread.start()
        sent = 0
        try:
            while sent < nbytes:
                step = min(buffer_bytes, nbytes - sent)
                sender.sendall(payload[:step])
                sent += step
        except OSError:
            receiver.shutdown(socket.SHUT_RDWR)  # wake the receiver; it reports the short count
            thread.join(timeout_s)
            raise
        thread.join(timeout_s)
        elapsed = time.perf_counter() - t0
        if thread.is_alive():
            receiver.shutdown(socket.SHUT_RDWR)
            thread.join(timeout_s)
            raise TimeoutError(f"loopback receiver got {received[0]} of {nbytes} bytes within {timeout_s:.0f}s")
    if failure:
        exc = failure[0]
        if isinstance(exc, TimeoutError | socket.timeout):
            raise TimeoutError(f"loopback receiver got {received[0]} of {nbytes} bytes: {exc}") from exc
        raise exc
    if received[0] != nbytes:
        raise RuntimeError(f"loopback receiver got {received[0]} of {nbytes} bytes")
    return nbytes / elapsed / 1e9


def loopback_ceiling(nbytes: int, repeat: int = 5, timeout_s: float = 30.0) -> dict[str, float | list[float]]:
    """Median (and samples) of ``repeat`` loopback copies of ``nbytes``."""
    if repeat < 1:
        raise ValueError(f"repeat ({repeat}) must be >= 1")
    samples = [loopback_gbps(nbytes, timeout_s) for _ in range(repeat)]
    return {"gbps": statistics.median(samples), "samples": samples}
