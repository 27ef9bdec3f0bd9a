"""Which errors are worth waiting out, and the pauses between attempts."""

from __future__ import annotations

import asyncio
import errno
import ssl
import time

import pytest
from rstream import exceptions as rx

from pyspark_rmqs.broker import recovery
from pyspark_rmqs.broker.recovery import Backoff, as_transient
from pyspark_rmqs.errors import (
    AuthenticationError,
    BrokerTimeoutError,
    BrokerUnavailableError,
    ConfigurationError,
    StreamNotFoundError,
)


@pytest.mark.parametrize(
    "error",
    [
        BrokerUnavailableError("refused"),
        BrokerTimeoutError("slow"),
        rx.StreamNotAvailable(),
        rx.LeaderNotAvailable(),
        ConnectionResetError(),
        BrokenPipeError(),
        ConnectionRefusedError(),
        TimeoutError(),
        asyncio.IncompleteReadError(b"", 8),
        OSError(errno.EHOSTUNREACH, "no route"),
    ],
)
def test_transient(error: BaseException) -> None:
    err = as_transient(error, "stats(s)")
    assert isinstance(err, BrokerUnavailableError)
    assert err.retryable


@pytest.mark.parametrize(
    "error",
    [
        AuthenticationError("refused user"),
        StreamNotFoundError("gone"),
        ConfigurationError("bad option"),
        rx.StreamDoesNotExist(),
        ssl.SSLCertVerificationError("bad certificate"),
        FileNotFoundError(errno.ENOENT, "ca.pem"),
        ValueError("bug"),
    ],
)
def test_not_transient(error: BaseException) -> None:
    assert as_transient(error) is None


def test_stream_not_available_names_the_call() -> None:
    err = as_transient(rx.StreamNotAvailable(), "subscribe to 'orders-0'")
    assert err is not None and str(err).startswith("subscribe to 'orders-0': the stream is not available yet")


def test_backoff_doubles_to_the_cap_and_stops_at_the_window() -> None:
    b = Backoff(window_s=10.0)
    delays = [b.next_delay() for _ in range(6)]
    assert delays == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    b.started -= 9.0  # 9 s spent: a 4 s pause would cross the window
    assert b.next_delay() is None


def test_backoff_reset_starts_a_new_window() -> None:
    b = Backoff(window_s=1.0)
    b.started -= 5.0
    assert b.next_delay() is None
    b.reset()
    assert b.next_delay() == 0.25


def test_backoff_never_pauses_past_the_deadline() -> None:
    b = Backoff(window_s=60.0, deadline=time.monotonic() + 0.1)
    assert b.next_delay() is None


def test_backoff_window_follows_the_module_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "RECOVERY_WINDOW_S", 0.1)
    assert Backoff().next_delay() is None
