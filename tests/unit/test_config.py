"""``MX_TRANSFER_TIMEOUT`` as the load strategy reads it (docs/contract.md#read-budget): explicit, finite and positive, or 300 s.

The budget bounds every READ; a value that would mean "no timeout" (0, a negative
number, NaN, infinity) or garbage must fall back to 300 s with a warning, never
turn into waiting forever.
"""

from __future__ import annotations

import logging
import math

import pytest

from mxref import config


def test_unset_is_300(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MX_TRANSFER_TIMEOUT", raising=False)
    assert config.transfer_timeout_seconds() == 300.0
    assert config.transfer_timeout_seconds({}) == 300.0


@pytest.mark.parametrize("raw, expected", [("12.5", 12.5), ("1", 1.0), ("900", 900.0), (" 7 ", 7.0), ("1e-3", 0.001)])
def test_an_explicit_positive_value_is_honoured(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raw: str, expected: float
) -> None:
    monkeypatch.setenv("MX_TRANSFER_TIMEOUT", raw)
    with caplog.at_level(logging.WARNING, logger="mxref.config"):
        assert config.transfer_timeout_seconds() == expected
        assert config.transfer_timeout_seconds({"MX_TRANSFER_TIMEOUT": raw}) == expected
    assert not caplog.records


@pytest.mark.parametrize("raw", ["0", "-3", "nan", "inf", "-inf", "abc", "", "12s"])
def test_unusable_values_fall_back_to_300_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    monkeypatch.setenv("MX_TRANSFER_TIMEOUT", raw)
    with caplog.at_level(logging.WARNING, logger="mxref.config"):
        assert config.transfer_timeout_seconds() == 300.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "MX_TRANSFER_TIMEOUT" in warnings[0].getMessage() and "300" in warnings[0].getMessage()


@pytest.mark.parametrize("raw", ["0", "-0", "-3", "nan", "inf", "1e999", "abc", None])
def test_the_budget_is_always_finite_and_positive(raw: str | None) -> None:
    env = {} if raw is None else {"MX_TRANSFER_TIMEOUT": raw}
    value = config.transfer_timeout_seconds(env)
    assert math.isfinite(value) and value > 0


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "x"])
def test_env_float_never_means_forever(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mxref.config"):
        assert config.env_float("MX_HEARTBEAT_INTERVAL_SECS", 30.0, {"MX_HEARTBEAT_INTERVAL_SECS": raw}) == 30.0
    assert caplog.records


@pytest.mark.parametrize("raw", ["0", "-2", "nan", "inf", "abc", "0ms"])
def test_cli_durations_refuse_what_would_mean_forever(raw: str) -> None:
    """A flag (``--transfer-timeout``) stops the process instead of falling back."""
    with pytest.raises(ValueError, match="duration"):
        config.parse_seconds(raw)


@pytest.mark.parametrize("raw, expected", [("2", 2.0), ("0.5", 0.5), ("2s", 2.0), ("500ms", 0.5)])
def test_cli_durations(raw: str, expected: float) -> None:
    assert config.parse_seconds(raw) == expected


def test_the_manager_uses_the_configured_budget_when_given_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """``timeout_seconds=None`` is the env budget, not an unbounded wait."""
    import mxref.transfer.manager as nt

    class Stuck:
        def check_xfer_state(self, handle: object) -> str:
            return "PROC"

        def release_xfer_handle(self, handle: object) -> None:
            pass

    seen: list[float] = []
    real_wait = nt.NixlTransferManager._wait_for_xfers

    def spy(self, handles, timeout_s, label):  # type: ignore[no-untyped-def]
        seen.append(timeout_s)
        return real_wait(self, handles, timeout_s, label)

    monkeypatch.setattr(nt.NixlTransferManager, "_wait_for_xfers", spy)
    monkeypatch.setenv("MX_TRANSFER_TIMEOUT", "0.02")
    mgr = nt.NixlTransferManager("t", 0)
    mgr._agent, mgr._metadata = Stuck(), b"md"
    posted = nt.PostedRead(handle=object(), total_bytes=1, num_ranges=1, posted_at=0.0)
    with pytest.raises(TimeoutError):
        mgr.await_read_batches([posted], timeout_seconds=None)
    monkeypatch.setenv("MX_TRANSFER_TIMEOUT", "0")
    assert config.transfer_timeout_seconds() == 300.0
    assert seen == [0.02]
