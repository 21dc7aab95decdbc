"""mxref: the reference peer-to-peer weight-transfer implementation of mxchaos.

Processes (``python -m mxref server|source|reader|prepare|demo``) move real bytes
with NIXL, talk over the gRPC contract in ``proto/mxref/v1``, write one JSON event
per lifecycle step (``mxref.events``) and serve Prometheus metrics.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

# A process with live gRPC channels that starts a child (subprocess.Popen with preexec_fn or
# close_fds, as the harness and mxref's benchmarks do) may lose that child before its exec:
# gRPC's fork handlers restart its poller in the child, whose epoll descriptor close_fds has
# closed, and the child aborts ("epoll_wait error: Bad file descriptor", grpcio 1.80 and later,
# grpc/grpc#43055). Measured here with grpcio 1.85.3, 25 s of spawns beside a busy channel: 2 of
# 4903 and 3 of 3984 children aborted with the default, 0 of 6549 and 0 of 6953 with fork
# support off. Nothing here uses gRPC in a forked child, so it is off unless the caller says.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
