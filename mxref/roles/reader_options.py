"""A reader's options (``mxref.roles.reader.Reader``), kept apart from the load flow."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mxref import config
from mxref.transfer.chunked import ChunkPolicy

__all__ = ["DEFAULT_CHUNKS", "ReaderOptions"]

DEFAULT_CHUNKS = ChunkPolicy()  # frozen: one shared instance is safe


@dataclass(frozen=True)
class ReaderOptions:
    server: str
    transfer_timeout_s: float = config.DEFAULT_TRANSFER_TIMEOUT_S
    handshake_timeout_s: float = config.DEFAULT_HANDSHAKE_TIMEOUT_S
    manifest_timeout_s: float = config.DEFAULT_MANIFEST_TIMEOUT_S
    rpc_timeout_s: float = config.DEFAULT_RPC_TIMEOUT_S  # deadline of each metadata-server RPC
    worker_rank: int = 0
    accelerator: str = "cpu"
    device_id: int = 0
    selector: str = "random"
    selector_seed: int | None = None
    checkpoint: Path | None = None
    agent_name: str | None = None
    skip_release: bool = False  # simulates the pre-fix reader that never disconnects its source
    # simulates the unguarded reader: after a failed READ the next candidate is read with the same
    # agent, registration and memory (a stalled source's late replies land in the verified load)
    unguarded_retry: bool = False
    # chunked READs with one window deadline (a frozen source is seen in ~1 s); None: one READ
    # handle per candidate, bounded only by the budget (docs/contract.md#read-budget). The budget bounds both.
    chunks: ChunkPolicy | None = DEFAULT_CHUNKS
    # a chunked READ into host memory hashes each tensor whose bytes have landed between its polls
    # (``LandingChecksums``); False: every checksum after the READ (the bench's control)
    hash_while_reading: bool = True
    push_metadata: bool = False  # also push our metadata to the source's listener (see the CLI help)
    # prepare the first READ target (memory + agent) while the control plane is asked
    prestart: bool = True
    # take a tensor read lease (PrepareTensorRead) per attempt; no READ without one (mxref.roles.lease)
    lease: bool = False
    # ModelExpress 0.8's manifest that grows after publishing: a manifest holding every tensor of the
    # reference unchanged, and more, is read whole (``mxref.roles.growth``); else it is a mismatch
    accept_growth: bool = False
    name: str = "reader"
