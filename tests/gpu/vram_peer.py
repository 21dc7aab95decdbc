"""A source-side peer for the GPU tests: a model in CUDA memory, served over NIXL.

``python vram_peer.py --transport T --tensors N --tensor-mib M`` prints one JSON
line (agent name, listener port, descriptors, checksums) and serves until killed.
It uses the manager and arenas only, no control plane, so it runs wherever
NIXL and torch do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mxref import config


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", required=True)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--tensor-mib", type=int, default=64)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config.apply_transport_profile(args.transport)

    from mxref.accelerators import get_backend
    from mxref.model import ModelSpec, generate
    from mxref.transfer.manager import LocalTensor, NixlTransferManager

    cuda = get_backend("cuda")
    spec = ModelSpec(tensors=args.tensors, tensor_bytes=args.tensor_mib << 20)
    host = generate(spec)
    sums = host.checksums()
    arena = cuda.to_device(host, 0)
    mgr = NixlTransferManager("vram-src", 0, cuda)
    mgr.create_agent(args.port, progress_thread=False)
    mgr.register_tensors([LocalTensor(s.name, a, n, s.dtype, 0) for s, (a, n) in zip(arena.specs, arena.regions())])
    mgr.start_progress_pump()
    print(json.dumps({
        "agent": "vram-src", "port": args.port, "checksums": sums,
        "tensors": [{"name": s.name, "addr": a, "size": n, "dtype": s.dtype} for s, (a, n) in zip(arena.specs, arena.regions())],
    }), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
