"""The metadata client's channel reconnects promptly once its server is back.

After refused connections a gRPC channel waits out its reconnect backoff (1 s, x1.6, up to
120 s by default) and fails RPCs fast meanwhile: a source whose server was down re-published
only seconds to minutes after the server returned (ModelExpress #196 / #658; the incident
scenarios mx196 and mx658 measure it). ``MxClient`` caps that backoff near a heartbeat.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from mxref import config
from mxref.roles import client as client_mod


def test_the_client_options_cap_the_reconnect_backoff() -> None:
    options = dict(config.grpc_client_options())
    assert options["grpc.max_reconnect_backoff_ms"] <= 2000
    assert options["grpc.initial_reconnect_backoff_ms"] <= options["grpc.max_reconnect_backoff_ms"]
    # not the minimum: gRPC takes it as the connect timeout too (a hung server must run into
    # the RPC deadline, not fail fast: scenarios/metadata_server_hangs.yaml)
    assert "grpc.min_reconnect_backoff_ms" not in options
    # and it still carries the message-size limits
    assert set(dict(config.grpc_message_options())) <= set(options)


def test_mx_client_opens_its_channel_with_the_client_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    real = grpc.insecure_channel

    def spy(target: str, options: Any = None, *args: Any, **kwargs: Any) -> grpc.Channel:
        seen.append(dict(options or ()))
        return real(target, options, *args, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", spy)
    with client_mod.MxClient("127.0.0.1:1", timeout_s=0.1):
        pass
    assert seen and seen[0].get("grpc.max_reconnect_backoff_ms") == config.RECONNECT_BACKOFF_MS[1]
