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
from pyspark_rmqs.core.errors import (
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


# ------------------------------------------------------------------------------ the one retry loop


def _flaky(failures: list[BaseException], result: str = "ok"):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    def attempt() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return result

    return attempt, calls


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []
    monkeypatch.setattr(recovery.time, "sleep", pauses.append)

    async def fake_sleep(delay: float) -> None:
        pauses.append(delay)

    monkeypatch.setattr(recovery.asyncio, "sleep", fake_sleep)
    return pauses


def test_retry_sync_waits_out_transient_errors(no_sleep: list[float]) -> None:
    attempt, calls = _flaky([ConnectionResetError(), rx.StreamNotAvailable()])
    seen: list[int] = []
    got = recovery.retry_sync("stats(s)", attempt, on_retry=lambda err, delay, n: seen.append(n))
    assert got == "ok" and len(calls) == 3
    assert no_sleep == [0.25, 0.5] and seen == [1, 2]


def test_retry_async_is_the_same_loop(no_sleep: list[float]) -> None:
    attempt, calls = _flaky([ConnectionResetError()])

    async def once() -> str:
        return attempt()

    assert asyncio.run(recovery.retry_async("stats(s)", once)) == "ok"
    assert len(calls) == 2 and no_sleep == [0.25]


def test_retry_raises_what_is_not_transient_at_once(no_sleep: list[float]) -> None:
    gone = StreamNotFoundError("gone")
    attempt, calls = _flaky([gone])
    with pytest.raises(StreamNotFoundError) as info:
        recovery.retry_sync("subscribe", attempt)
    assert info.value is gone and len(calls) == 1 and no_sleep == []


def test_retry_if_no_raises_the_transient_error_at_once(no_sleep: list[float]) -> None:
    attempt, calls = _flaky([ConnectionRefusedError()])
    with pytest.raises(BrokerUnavailableError, match="never reached: connection to the broker lost") as info:
        recovery.retry_sync("never reached", attempt, retry_if=lambda err: False)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert len(calls) == 1 and no_sleep == []


def test_retry_gives_up_when_the_window_is_spent(no_sleep: list[float]) -> None:
    attempt, calls = _flaky([ConnectionResetError()] * 100)
    with pytest.raises(
        BrokerUnavailableError, match=r"tail: the broker did not come back within 1 s"
    ) as info:
        recovery.retry_sync("tail", attempt, window=1.0)
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert no_sleep == [0.25, 0.5]  # a third pause (1 s) would cross the 1 s window
    assert len(calls) == 3


def test_retry_never_pauses_past_the_deadline(no_sleep: list[float]) -> None:
    attempt, calls = _flaky([ConnectionResetError()] * 3)

    class Late(Exception):
        pass

    with pytest.raises(Late):
        recovery.retry_sync(
            "subscribe", attempt, deadline=time.monotonic() + 0.1, exhausted=lambda err: Late(str(err))
        )
    assert len(calls) == 1 and no_sleep == []
