"""A raw two-process NIXL READ: the baseline the reference flow is measured against.

``python -m mxref.bench.raw --bytes N --repeat K [--progress pump|thread|fastest]`` starts a raw
source process (one registered buffer) and reads the buffer from this process with the NIXL API
directly: one descriptor, one handle, tight polling. Same transport profile as mxref's source and
reader, so the ratio between the two isolates what mxref's flow adds (control plane, handshake,
per-tensor descriptors, chunking, integrity check).

The raw source drives its agent's progress one of two ways (``SOURCE_PROGRESS``):

* ``pump``: no NIXL progress thread, ``get_new_notifs`` every 1 ms (as mxref's source does);
* ``thread``: NIXL's own progress thread (``enable_prog_thread=True``), which spins a core.

``--progress fastest`` measures both, one after the other, and reports the faster one's figures
(``progress`` names it) beside each variant's median: a baseline is only honest when it is the
fastest raw READ one can configure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from mxref import config
from mxref.options import parse

SOURCE_PROGRESS = ("pump", "thread")


def _source(port: int, nbytes: int, seconds: float, progress: str = "pump") -> int:
    from mxref.transfer.manager import import_nixl

    if progress not in SOURCE_PROGRESS:
        raise ValueError(f"progress {progress!r}: one of {', '.join(SOURCE_PROGRESS)}")
    api = import_nixl()
    agent = api.nixl_agent("raw-src", api.nixl_agent_config(progress == "thread", True, port, backends=["UCX"]))
    buf = np.arange(nbytes // 8, dtype=np.uint64)
    reg = agent.register_memory(np.array([(buf.ctypes.data, buf.nbytes, 0)], dtype=np.uint64), "DRAM")
    print(json.dumps({"addr": int(buf.ctypes.data), "bytes": int(buf.nbytes)}), flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if progress == "pump":
            agent.get_new_notifs()
            time.sleep(0.001)
        else:  # NIXL's thread makes the progress
            time.sleep(0.05)
    agent.deregister_memory(reg)
    return 0


def raw_read(nbytes: int, repeat: int, timeout_s: float = 60.0, progress: str = "pump",
             phases: list[dict[str, float]] | None = None) -> list[float]:
    """GB/s of each of ``repeat`` READs of ``nbytes`` from a fresh raw source process whose
    progress is ``progress`` (``SOURCE_PROGRESS``). ``phases``, when given, gets one dict per READ
    (``RAW_PHASES``: where its time went, in the terms of ``mxref.transfer.chunked.ReadClock``)."""
    if progress not in SOURCE_PROGRESS:
        raise ValueError(f"progress {progress!r}: one of {', '.join(SOURCE_PROGRESS)}")
    from mxref.process import die_with_parent, free_port, read_json_line
    from mxref.transfer.manager import import_nixl

    port = free_port()
    src = subprocess.Popen(
        [sys.executable, "-m", "mxref.bench.raw", "--serve", str(port), "--bytes", str(nbytes),
         "--seconds", str(timeout_s + 30), "--progress", progress],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True, preexec_fn=die_with_parent,
    )
    try:
        assert src.stdout is not None
        info = read_json_line(src.stdout, timeout_s, "the raw source")  # NIXL logs to stdout too
        api = import_nixl()
        t0 = time.perf_counter()
        agent = api.nixl_agent(f"raw-rd-{os.getpid()}", api.nixl_agent_config(False, True, free_port(), backends=["UCX"]))
        agent_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        dst = np.empty(info["bytes"] // 8, dtype=np.uint64)
        dst.fill(0)  # fault the pages in now, as mxref's reader does, not during the first READ
        first_touch = time.perf_counter() - t0
        t0 = time.perf_counter()
        agent.register_memory(np.array([(dst.ctypes.data, dst.nbytes, 0)], dtype=np.uint64), "DRAM")
        register = time.perf_counter() - t0
        deadline = time.monotonic() + timeout_s
        while not agent.check_remote_metadata("raw-src"):
            if time.monotonic() > deadline:
                raise TimeoutError("raw source metadata did not arrive")
            agent.fetch_remote_metadata("raw-src", "127.0.0.1", port)
            time.sleep(0.05)
        local = agent.get_xfer_descs(np.array([(dst.ctypes.data, dst.nbytes, 0)], dtype=np.uint64), "DRAM")
        remote = agent.get_xfer_descs(np.array([(info["addr"], info["bytes"], 0)], dtype=np.uint64), "DRAM")
        rates = []
        for _ in range(repeat):
            t_prep = time.perf_counter()
            handle = agent.initialize_xfer("READ", local, remote, "raw-src")
            t0 = time.perf_counter()
            state = agent.transfer(handle)
            t_posted = time.perf_counter()
            polls = 0
            while state != "DONE":
                state = agent.check_xfer_state(handle)
                polls += 1
                if state == "ERR" or time.monotonic() > deadline:
                    raise RuntimeError(f"raw READ ended in {state}")
            t_done = time.perf_counter()
            rates.append(info["bytes"] / (t_done - t0) / 1e9)
            agent.release_xfer_handle(handle)
            if phases is not None:  # the READ is t0..t_done: post + poll, as mxref's is prep..release
                phases.append({"first_touch_s": first_touch, "agent_s": agent_s, "register_s": register, "prep_s": t0 - t_prep,
                               "post_s": t_posted - t0, "posts": 1, "poll_s": t_done - t_posted, "polls": polls,
                               "release_s": time.perf_counter() - t_done, "total_s": t_done - t0})
        if not np.array_equal(dst[:1024], np.arange(1024, dtype=np.uint64)):
            raise RuntimeError("raw READ delivered wrong bytes")
        agent.remove_remote_agent("raw-src")
        return rates
    finally:
        src.kill()
        src.communicate(timeout=10)


@dataclass(frozen=True, kw_only=True)
class RawFlags:
    """``python -m mxref.bench.raw``'s flags, typed (``mxref.options``)."""

    bytes: int
    repeat: int
    transport: str
    progress: str
    serve: int | None
    seconds: float


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transport", default="ucx-tcp", choices=sorted(config.TRANSPORT_PROFILES))
    parser.add_argument("--progress", default="pump", choices=[*SOURCE_PROGRESS, "fastest"],
                        help="the raw source's progress: pumped every 1 ms, NIXL's thread, or both "
                             "one after the other and the faster reported (default pump)")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=90.0, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv, RawFlags)
    if args.serve is not None and args.progress not in SOURCE_PROGRESS:
        parser.error(f"--serve needs --progress {' or '.join(SOURCE_PROGRESS)}")
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be >= 1")
    config.apply_transport_profile(args.transport)
    if args.serve is not None:
        return _source(args.serve, args.bytes, args.seconds, args.progress)
    kinds = list(SOURCE_PROGRESS) if args.progress == "fastest" else [args.progress]
    # each variant: one fresh source, --repeat READs on its connection (the first cold, the rest warm)
    samples = {kind: raw_read(args.bytes, args.repeat, progress=kind) for kind in kinds}
    print(json.dumps({"raw_read": raw_summary(args.bytes, samples)}))
    return 0


def raw_summary(nbytes: int, samples: dict[str, list[float]]) -> dict[str, object]:
    """The JSON of ``python -m mxref.bench.raw``: the fastest variant's samples and median (``gbps``,
    ``median_gbps``, ``progress``) and every variant's median (``variants``)."""
    medians = {k: statistics.median(v) for k, v in samples.items() if v}
    if not medians:
        raise ValueError("no raw READ samples")
    best = max(medians, key=lambda k: medians[k])
    return {"bytes": nbytes, "progress": best, "gbps": [round(r, 3) for r in samples[best]],
            "median_gbps": round(medians[best], 3),
            "variants": {k: {"median_gbps": round(m, 3), "gbps": [round(r, 3) for r in samples[k]]}
                         for k, m in medians.items()}}


if __name__ == "__main__":
    sys.exit(main())
