"""Generated code of ModelExpress's ``model_express.p2p`` (``proto/mxref/mx/p2p.proto``; ``python -m mxref.codegen``)."""

from __future__ import annotations
