"""mxref: the reference peer-to-peer weight-transfer implementation of mxchaos.

Processes (``python -m mxref server|source|reader|prepare|demo``) move real bytes
with NIXL, talk over the gRPC contract in ``proto/mxref/v1``, write one JSON event
per lifecycle step (``mxref.events``) and serve Prometheus metrics.
"""

from __future__ import annotations

__version__ = "0.1.0"
