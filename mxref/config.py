"""Every environment variable mxref reads, parsed in one place.

Names follow ModelExpress where the behaviour is the same (``MX_*``); mxref's own
knobs are ``MXREF_*``. Command-line flags override the environment; the CLI passes
its values in explicitly, so nothing below ``__main__`` reads ``os.environ``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping

logger = logging.getLogger("mxref.config")

# Seed 001: the RDMA path's per-candidate budget when MX_TRANSFER_TIMEOUT is not
# explicitly set (the env helper's own 900 s default is deliberately not inherited).
DEFAULT_TRANSFER_TIMEOUT_S = 300.0
MAX_SOURCE_RETRIES = 3
# ModelExpress hard-codes 120 s for the NIXL metadata handshake poll.
DEFAULT_HANDSHAKE_TIMEOUT_S = 120.0
DEFAULT_MANIFEST_TIMEOUT_S = 5.0
DEFAULT_RPC_TIMEOUT_S = 30.0

DEFAULT_HEARTBEAT_INTERVAL_S = 30.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 90.0
DEFAULT_REAPER_SCAN_INTERVAL_S = 30.0
DEFAULT_GC_TIMEOUT_S = 3600.0

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def transfer_timeout_seconds(env: Mapping[str, str] | None = None) -> float:
    """Per-candidate READ budget in seconds, as seed 001 defines it.

    ``MX_TRANSFER_TIMEOUT`` is honoured only when explicitly set to a finite,
    positive number. Unset gives 300 s; garbage, zero, negative, NaN or infinity
    give 300 s with a warning, never "wait forever".
    """
    env = os.environ if env is None else env
    raw = env.get("MX_TRANSFER_TIMEOUT")
    if raw is None:
        return DEFAULT_TRANSFER_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        logger.warning(
            "MX_TRANSFER_TIMEOUT=%r is not a number; using %.1fs for the transfer budget",
            raw, DEFAULT_TRANSFER_TIMEOUT_S,
        )
        return DEFAULT_TRANSFER_TIMEOUT_S
    if not math.isfinite(value) or value <= 0:
        logger.warning(
            "MX_TRANSFER_TIMEOUT=%r is not finite and positive; using %.1fs rather than waiting forever",
            raw, DEFAULT_TRANSFER_TIMEOUT_S,
        )
        return DEFAULT_TRANSFER_TIMEOUT_S
    return value


def env_float(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """A positive finite float from the environment; warns and uses ``default`` otherwise."""
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        logger.warning("%s=%r is not a number; using %s", name, raw, default)
        return default
    if not math.isfinite(value) or value <= 0:
        logger.warning("%s=%r is not finite and positive; using %s", name, raw, default)
        return default
    return value


def env_bool(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    logger.warning("%s=%r is not a boolean (1/true/yes/on, 0/false/no/off); using %s", name, raw, default)
    return default


def server_address(env: Mapping[str, str] | None = None) -> str:
    """``MODEL_EXPRESS_URL`` wins over ``MX_SERVER_ADDRESS`` (as in ModelExpress); scheme stripped."""
    env = os.environ if env is None else env
    raw = env.get("MODEL_EXPRESS_URL") or env.get("MX_SERVER_ADDRESS") or "localhost:8001"
    for prefix in ("http://", "https://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):]
    return raw.rstrip("/")


# Transport profiles: the UCX environment each profile sets before NIXL is imported.
# ``ucx-tcp`` is what single-host chaos needs (the default same-host transport,
# cma, hides a frozen source) plus the segment size that takes TCP from ~1.2 to
# ~3.4 GB/s here. RX is raised together with TX: a source whose TX segment exceeds
# a reader's RX aborts (see shared notes), so every peer must use the same profile.
TRANSPORT_PROFILES: dict[str, dict[str, str]] = {
    "ucx-tcp": {
        "UCX_TLS": "tcp",
        "UCX_NET_DEVICES": "lo",
        "UCX_TCP_TX_SEG_SIZE": "512K",
        "UCX_TCP_RX_SEG_SIZE": "512K",
    },
    # Several hosts in network namespaces: TCP on whatever device routes there.
    "ucx-tcp-any": {
        "UCX_TLS": "tcp",
        "UCX_TCP_TX_SEG_SIZE": "512K",
        "UCX_TCP_RX_SEG_SIZE": "512K",
    },
    # RDMA hosts: let UCX choose (rc/ud verbs, cuda_copy, ...).
    "rdma": {},
    # Whatever UCX picks on this host (cma/shm on one host).
    "default": {},
}


def apply_transport_profile(name: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Set the profile's variables in ``env`` (default ``os.environ``) unless already set.

    Returns what it set. Must run before NIXL is imported.
    """
    if name not in TRANSPORT_PROFILES:
        raise ValueError(f"unknown transport profile {name!r} (known: {', '.join(TRANSPORT_PROFILES)})")
    target = os.environ if env is None else env
    applied = {}
    for key, value in TRANSPORT_PROFILES[name].items():
        if key not in target:
            target[key] = value
            applied[key] = value
    return applied
