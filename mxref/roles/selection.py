"""Source selectors: the order in which a reader tries its candidates.

``MX_P2P_SOURCE_SELECTOR`` names one (default ``random``; an unknown name falls
back to ``random`` with a warning, as in ModelExpress). Selectors only order;
filtering and the cap of ``MAX_SOURCE_RETRIES`` happen around them.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from mxref.v1 import p2p_pb2

logger = logging.getLogger("mxref.roles.selection")


@dataclass(frozen=True)
class Target:
    """Who is choosing: the inputs a deterministic selector may hash."""

    model_name: str
    worker_id: str
    worker_rank: int


class Selector(Protocol):
    name: str

    def order(
        self, candidates: Sequence[p2p_pb2.SourceInstanceRef], target: Target
    ) -> list[p2p_pb2.SourceInstanceRef]: ...


class RandomSelector:
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def order(
        self, candidates: Sequence[p2p_pb2.SourceInstanceRef], target: Target
    ) -> list[p2p_pb2.SourceInstanceRef]:
        del target  # random by design
        ordered = list(candidates)
        self._rng.shuffle(ordered)
        return ordered


class RendezvousHashSelector:
    """Highest-random-weight: blake2b-64 of target and candidate fields, highest first."""

    name = "rendezvous_hash"

    def __init__(self, seed: int | None = None) -> None:
        del seed  # deterministic by construction

    @staticmethod
    def score(target: Target, cand: p2p_pb2.SourceInstanceRef) -> int:
        key = "|".join(
            [target.model_name, target.worker_id, str(target.worker_rank),
             cand.mx_source_id, cand.worker_id, str(cand.worker_rank)]
        )
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")

    def order(
        self, candidates: Sequence[p2p_pb2.SourceInstanceRef], target: Target
    ) -> list[p2p_pb2.SourceInstanceRef]:
        return sorted(candidates, key=lambda c: self.score(target, c), reverse=True)


class OrdinalSelector:
    """For a fleet whose readers know their place in it (a pod's ordinal, a task id, a data
    parallel rank), given as the seed: the candidates in a stable order (by source id, worker id
    and rank), rotated by the ordinal. Readers 0..R-1 that list the same S sources start at R
    different places, so no source is first for more than ceil(R / S) of them, where independent
    random choices put 2 of 4 readers on one of 4 sources 9 times in 10. A reader whose first
    candidate fails moves on to the next in the rotation. No ordinal (seed None): 0."""

    name = "ordinal"

    def __init__(self, seed: int | None = None) -> None:
        self._ordinal = seed or 0

    def order(
        self, candidates: Sequence[p2p_pb2.SourceInstanceRef], target: Target
    ) -> list[p2p_pb2.SourceInstanceRef]:
        del target  # the ordinal alone places this reader
        ordered = sorted(candidates, key=lambda c: (c.mx_source_id, c.worker_id, c.worker_rank))
        if not ordered:
            return ordered
        k = self._ordinal % len(ordered)
        return ordered[k:] + ordered[:k]


SELECTORS: dict[str, Callable[[int | None], Selector]] = {"random": RandomSelector, "rendezvous_hash": RendezvousHashSelector,
                                                          "ordinal": OrdinalSelector}


def get_selector(name: str | None, seed: int | None = None) -> Selector:
    name = name or "random"
    factory = SELECTORS.get(name)
    if factory is None:
        logger.warning("unknown source selector %r (known: %s); using random", name, ", ".join(SELECTORS))
        factory = RandomSelector
    return factory(seed)
