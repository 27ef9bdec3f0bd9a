"""Riding out a broker restart: which errors are transient, and the pauses between attempts.

A restarting broker first stops answering, then closes every connection, refuses new ones for a
few seconds and answers "stream not available" until its streams are back (10-15 s for a local
node). Readers, writers and metadata calls that already reached the broker wait for it for up to
`RECOVERY_WINDOW_S`, then fail loudly. A broker this process never reached fails at once: a wrong
address or a stopped broker at planning time is for the user to fix, not to wait for.

Every reconnecting path waits through the one loop here, `retry_async` (on the broker loop) or
`retry_sync` (in a caller's thread): metadata calls (`client.py`), resubscribing readers
(`reader.py`, never past maxWaitMs), and producers starting (`writer.py`) or recovering
(`publisher.py`) a publisher.
The timeouts of the synchronous waits around broker calls are named here too.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rstream import exceptions as rx

from pyspark_rmqs.core.errors import BrokerUnavailableError

R = TypeVar("R")

RECOVERY_WINDOW_S = 60.0
# What to do when the window is spent, for the messages that end it (readers, writers).
COME_BACK_ADVICE = (
    "Retry once the broker runs again; on a cluster, once a majority of the stream's members run "
    "(a stream that lost its majority has no leader: bring its nodes back)"
)
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
            f"{where}the stream is not available yet (the broker is starting, the stream's leader moved, "
            "or more than half of the stream's members are down: a stream has a leader only while a "
            "majority of its members run)"
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


# Timeouts of the synchronous waits (`run_sync`) around broker calls, named by what they bound.
# A call that may wait out a restart (a patient metadata call, one that retries) must allow the
# recovery window and then some; a close is short and best effort.
CLOSE_TIMEOUT_S = 30
"""Unsubscribe a reader and return its connection."""
SUBSCRIBE_TIMEOUT_S = 60
"""One subscription attempt (`retry_sync` waits between attempts, outside it)."""
PRODUCER_CLOSE_TIMEOUT_S = 60
"""Delete every publisher of a producer and return its connections."""
METADATA_CALL_TIMEOUT_S = 90
"""A patient metadata call from an executor (tail, stats, first offset): the window plus a request."""
ROUTING_CALL_TIMEOUT_S = 150
"""A super stream's partitions or a key's route, asked by a producer (patient)."""
WATERMARKS_TIMEOUT_S = 120
"""Reading or storing the watermarks (and plans) of a consumer name over all partition streams."""


class _Attempts:
    """The decision between two attempts, shared by `retry_async` and `retry_sync`."""

    def __init__(
        self,
        what: str,
        window: float | None,
        deadline: float | None,
        retry_if: Callable[[BrokerUnavailableError], bool] | None,
        exhausted: Callable[[BrokerUnavailableError], BaseException] | None,
        on_retry: Callable[[BrokerUnavailableError, float, int], None] | None,
    ) -> None:
        self.what = what
        self.window = window
        self.deadline = deadline
        self.retry_if = retry_if
        self.exhausted = exhausted
        self.on_retry = on_retry
        self.backoff: Backoff | None = None  # the window starts at the first failure

    def pause(self, e: Exception) -> float:
        """The pause before the next attempt after `e`; raises when `e` is final."""
        err = as_transient(e, self.what)
        if err is None:
            raise e
        if self.retry_if is not None and not self.retry_if(err):
            if err is e:
                raise e
            raise err from e
        self.backoff = self.backoff or Backoff(self.window, self.deadline)
        delay = self.backoff.next_delay()
        if delay is None:
            window = self.backoff.window_s
            final = (
                self.exhausted(err)
                if self.exhausted is not None
                else BrokerUnavailableError(
                    f"{self.what}: the broker did not come back within {window:.0f} s ({err})"
                )
            )
            raise final from e
        if self.on_retry is not None:
            self.on_retry(err, delay, self.backoff.attempts)
        return delay


async def retry_async(
    what: str,
    attempt: Callable[[], Awaitable[R]],
    *,
    window: float | None = None,
    deadline: float | None = None,
    retry_if: Callable[[BrokerUnavailableError], bool] | None = None,
    exhausted: Callable[[BrokerUnavailableError], BaseException] | None = None,
    on_retry: Callable[[BrokerUnavailableError, float, int], None] | None = None,
) -> R:
    """`await attempt()` until it succeeds, waiting out a restarting broker; the one retry loop.

    An error that is not transient (`as_transient`) is raised as it is, at once. A transient one is
    retried after a `Backoff` pause while the window (from the first failure, default
    `RECOVERY_WINDOW_S`) and the `deadline` (monotonic) allow, unless `retry_if(err)` says no: then
    the transient error is raised at once. When the window is spent, `exhausted(err)` is raised
    (default: `BrokerUnavailableError` naming `what`), chained to the last error. `on_retry(err,
    pause, attempts)` is told before each pause. Cleanup after a failed attempt belongs in `attempt`.
    """
    attempts = _Attempts(what, window, deadline, retry_if, exhausted, on_retry)
    while True:
        try:
            return await attempt()
        except Exception as e:
            await asyncio.sleep(attempts.pause(e))


def retry_sync(
    what: str,
    attempt: Callable[[], R],
    *,
    window: float | None = None,
    deadline: float | None = None,
    retry_if: Callable[[BrokerUnavailableError], bool] | None = None,
    exhausted: Callable[[BrokerUnavailableError], BaseException] | None = None,
    on_retry: Callable[[BrokerUnavailableError, float, int], None] | None = None,
) -> R:
    """`retry_async` for a thread that is not the broker loop's (it sleeps in this thread)."""
    attempts = _Attempts(what, window, deadline, retry_if, exhausted, on_retry)
    while True:
        try:
            return attempt()
        except Exception as e:
            time.sleep(attempts.pause(e))
