"""Riding out a broker restart: which errors are transient, and the pauses between attempts.

A restarting broker first stops answering, then closes every connection, refuses new ones for a
few seconds and answers "stream not available" until its streams are back (10-15 s for a local
node). Readers, writers and metadata calls that already reached the broker wait for it for up to
`RECOVERY_WINDOW_S`, then fail loudly. A broker this process never reached fails at once: a wrong
address or a stopped broker at planning time is for the user to fix, not to wait for.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
import time

from rstream import exceptions as rx

from pyspark_rmqs.errors import BrokerUnavailableError

RECOVERY_WINDOW_S = 60.0
_NETWORK_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.ETIMEDOUT,
    errno.ENETUNREACH,
    errno.EHOSTUNREACH,
    errno.ENETDOWN,
}
FIRST_DELAY_S = 0.25
MAX_DELAY_S = 4.0


def as_transient(e: BaseException, what: str = "") -> BrokerUnavailableError | None:
    """`e` as a retryable error when it means "the broker is away for now"; None otherwise."""
    where = f"{what}: " if what else ""
    if isinstance(e, BrokerUnavailableError):
        return e
    if isinstance(e, (rx.StreamNotAvailable, rx.LeaderNotAvailable)):
        return BrokerUnavailableError(
            f"{where}the stream is not available yet (the broker is starting or the stream's leader moved)"
        )
    if isinstance(e, ssl.SSLError):  # certificates do not heal by waiting
        return None
    network = isinstance(e, OSError) and e.errno in _NETWORK_ERRNOS  # not a missing file, say
    if network or isinstance(e, (ConnectionError, asyncio.IncompleteReadError, TimeoutError)):
        return BrokerUnavailableError(f"{where}connection to the broker lost ({type(e).__name__})")
    return None


class Backoff:
    """Exponential pauses (0.25 s doubling to 4 s) within a window that starts at the first failure."""

    def __init__(self, window_s: float | None = None, deadline: float | None = None) -> None:
        self.started = time.monotonic()
        self.window_s = RECOVERY_WINDOW_S if window_s is None else window_s
        self.deadline = deadline  # a monotonic time no pause may cross (maxWaitMs, say)
        self.delay = FIRST_DELAY_S
        self.attempts = 0

    def next_delay(self) -> float | None:
        """The pause before the next attempt; None when the window (or the deadline) is spent."""
        now = time.monotonic()
        limit = self.started + self.window_s
        if self.deadline is not None:
            limit = min(limit, self.deadline)
        if now + self.delay > limit:
            return None
        delay = self.delay
        self.delay = min(self.delay * 2, MAX_DELAY_S)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        """Progress was made: the next failure starts a new window."""
        self.started = time.monotonic()
        self.delay = FIRST_DELAY_S

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started
