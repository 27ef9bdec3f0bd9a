"""A run's lease on a consumer (or producer) name: the broker's single active consumer, held open.

Two runs on one consumer name read the same range and both deliver it; comparing watermarks at
the end (the old check) catches that only after both sinks ran. The lease decides before reading.
It is a subscription, with `single-active-consumer` and the name, to the records stream
(`record.RUNS_STREAM`) on a connection of its own: the broker makes exactly one subscription of a
name active, promotes the next one when the holder unsubscribes or its connection dies (a killed
process: at once; a paused one: after missed heartbeats), and tells each the moment it becomes
active (ConsumerUpdate). The subscription has no credit, so it never receives a message.

Why not a stored value with an expiry: stored offsets have no compare-and-set, so two runs could
both "win"; the broker's group has one active member by construction, and expiry on a dead holder
comes from the connection itself instead of a clock.

A lease can end under a running run: its connection's node dies, the broker restarts, an operator
closes the connection. The broker then hands the name to the next run that asks. So every write a
run makes under its lease (a record, the watermark store, a producer's batch) is preceded by
`Lease.keep()`: a local flag while the lease is held; when it was lost, the lease is taken again
(on a live member of the records stream) and the name's record pointer must still be where this
holder last left it (`mark`), else `LeaseLostError` before anything more is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rstream import exceptions as rx
from rstream import schema
from rstream.constants import OffsetType

from pyspark_rmqs.broker import recovery
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.placement import open_for
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.recovery import COME_BACK_ADVICE, retry_sync
from pyspark_rmqs.broker.topology import Node, node_of
from pyspark_rmqs.core.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    ConsumerBusyError,
    LeaseLostError,
    access_refused,
)
from pyspark_rmqs.runs.record import RUNS_STREAM, ensure_stream

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 256  # the broker's limit on a consumer (reference) name
DEFAULT_WAIT_S = 10.0
_UNKNOWN = object()  # `Lease.pointer` before the holder read or wrote its name's record pointer


class Lease:
    """The lease on `name` while held; `release()` (or closing the process) gives it back.

    `keep()` before every write under the lease; `mark(pointer)` after every read or write of the
    name's record pointer (the stored offset of `name` on `stream`), so a lease taken back can prove
    that nobody wrote a record of the name meanwhile.
    """

    def __init__(
        self,
        conn: Any,
        name: str,
        client: RmqsClient,
        sub: int,
        *,
        stream: str = RUNS_STREAM,
        wait_s: float = DEFAULT_WAIT_S,
        what: str = "",
    ) -> None:
        self.conn = conn
        self.name = name
        self._client = client
        self._sub = sub
        self.stream = stream
        self.wait_s = wait_s
        self.what = what or repr(name)
        self.acquired_at = time.time()
        self.pointer: object = _UNKNOWN
        self.regained = 0  # how often the lease was lost and taken back (for logs and tests)
        # What a retry does after `LeaseLostError`, for its message (a produce run says its own).
        self.retry_advice = (
            "a retry resumes the name's newest record whole (a delivered one only stores) or plans after it"
        )

    @property
    def held(self) -> bool:
        """Whether the lease's connection is still open, as this process knows it (a local flag)."""
        c = self._client
        return c is not None and c.is_connection_alive()

    @property
    def node(self) -> Node | None:
        """The broker node the lease's connection is on (None: released, or not advertised)."""
        c = self._client
        return None if c is None else node_of(c.server_properties)

    def mark(self, pointer: int | None) -> None:
        """The name's record pointer as this holder read it (under the lease) or last wrote it."""
        self.pointer = pointer

    def keep(self, before: str) -> None:
        """Make sure this run still holds the name before it writes `before` (what it is about to write).

        Held (the normal path): returns at once, no round trip. Lost: takes the lease again through a
        live member of the records stream (waiting up to `wait_s` for a run that took it meanwhile),
        then reads the name's record pointer: it must be where this holder last left it (`mark`).
        Raises `LeaseLostError`, before anything is written, when the lease cannot be taken back in
        time or the pointer moved (another run wrote a record of the name); the lease is then given
        back. A holder that never marked a pointer only proves it holds the lease again.

        What this guarantees: no write of this run follows a lease end that this process has seen,
        unless the run took the name back and nobody wrote a record of it in between. What it does
        not: `held` is the connection as this process knows it. A node that dies or a broker that
        closes the connection is seen at once (the socket closes), but a connection cut silently (a
        network partition) is seen only when a read or write on it fails, and a lease can also end
        between this check and the write that follows it. Another run may take the name in that
        window; the writes themselves still check what they can (a watermark store fails with
        `WatermarkConflictError` when another run stored since this one planned, and exactly-once
        outputs recognise a run's token), but two records may then interleave. Holding a lease is
        the broker's word at one instant, never a lock on the future.
        """
        if self.held:
            return
        log.warning("the lease on %s ended under the run (its connection closed); taking it back", self.what)
        self._drop()
        self._regain(before)
        now = self._moved()
        if now is not _UNKNOWN:
            raise LeaseLostError(
                f"{self.what}: this run lost its lease (its connection to the broker closed: a node "
                f"down or a broker restart) and another run of the name wrote its record meanwhile "
                f"(record pointer {self.pointer} -> {now}). Stopped before writing {before}; this run "
                f"stored nothing more. Retry the run: {self.retry_advice}"
            )
        log.warning("took the lease on %s back; its record is as this run left it: going on", self.what)

    def fence(self, before: str) -> None:
        """Before an output commit: prove, with one round trip, that no other run took the name over.

        `keep` trusts the local flag; a process that has not yet seen its connection close (paused,
        or a connection cut silently) would commit on it. Every run that reads under the name first
        moves its record pointer (a new record, or a resumed one written again: `record.taken_over`),
        so a pointer that is no longer where this holder left it means another run may be
        delivering this very range: `LeaseLostError` before the commit, and the lease given back.
        """
        if not self.held:  # taken back with the pointer checked, or LeaseLostError
            self.keep(before)
            return
        now = self._moved()
        if now is not _UNKNOWN:
            raise LeaseLostError(
                f"{self.what}: another run of the name took it over while this run was in its sink "
                f"(record pointer {self.pointer} -> {now}): this run's lease ended without this process "
                f"seeing it (a paused process, or a connection cut). Stopped before writing {before}; "
                f"this run committed and stored nothing. Retry the run: {self.retry_advice}"
            )

    def _moved(self) -> object:
        """The name's record pointer when it is no longer where this holder left it (the lease is
        then given back), else `_UNKNOWN`; a holder that never marked a pointer proves nothing."""
        if self.pointer is _UNKNOWN:
            return _UNKNOWN
        now = BrokerClient(self.conn).stored_offset(self.name, self.stream)
        if now == self.pointer:
            return _UNKNOWN
        self.release()
        return now

    def _regain(self, before: str) -> None:
        """Subscribe again (a fresh connection on a live member), waiting `wait_s` for a run that took
        the name, and retrying unreachable members for the recovery window (`RECOVERY_WINDOW_S`: a
        broker restarting under the run is waited for as its readers and writers wait for it);
        `LeaseLostError` when the name stays held by another run or no member answers."""
        unreachable: BrokerUnavailableError | None = None
        try:  # a broker restarting under the run: as long as its readers and writers wait for it
            got = _acquire_within(
                self.conn, self.stream, self.name, self.wait_s, unreachable_s=recovery.RECOVERY_WINDOW_S
            )
        except BrokerUnavailableError as e:
            got, unreachable = None, e
        if got is not None:
            self._client, self._sub = got
            self.regained += 1
            return
        why = (
            f"no member of '{self.stream}' could be subscribed to ({unreachable})"
            if unreachable is not None
            else "another run holds it now"
        )
        raise LeaseLostError(
            f"{self.what}: this run lost its lease (its connection to the broker closed: a node down "
            f"or a broker restart) and could not take it back in time: {why}. "
            f"Stopped before writing {before}; this run stored nothing more. Retry once the broker is "
            f"reachable: {self.retry_advice}"
        )

    def _drop(self) -> None:
        """Forget the dead connection (closing it in the background: the broker already ended it)."""
        client, self._client = self._client, None  # type: ignore[assignment]
        if client is not None:
            try:
                run_sync(_close_dead(client), 10.0, "close a lost lease")
            except Exception:
                pass

    def release(self) -> None:
        """Give the lease back (idempotent; never raises: the broker ends it with the connection)."""
        client, self._client = self._client, None  # type: ignore[assignment]
        if client is None:
            return
        try:
            run_sync(_release(client, self._sub), 10.0, "release lease")
        except Exception:
            log.debug("releasing the lease on '%s' failed; the broker ends it with the connection", self.name)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a lease nobody released still ends with the process
        if getattr(self, "_client", None) is not None:
            try:
                self.release()
            except Exception:
                pass


def check_name(name: str, what: str = "consumer name") -> str:
    if not name:
        raise ConfigurationError(f"a {what} is needed to hold a run's lease")
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"{what} '{name[:40]}...' is {size} bytes; the broker allows at most {MAX_NAME_BYTES}"
        )
    return name


_closing: set[asyncio.Task[None]] = set()


async def _release(client: RmqsClient, sub: int) -> None:
    """Unsubscribe (the broker hands the lease on at once), then close the connection in the
    background: rstream's close waits 200 ms after the broker's answer, a cost no run should pay."""
    try:
        await asyncio.wait_for(client.unsubscribe(sub), 5.0)
    except Exception:  # the connection is going anyway: closing it ends the subscription too
        await _close(client, sub)
        return
    task = asyncio.get_running_loop().create_task(_close(client, sub))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _close(client: RmqsClient, sub: int) -> None:
    try:
        await asyncio.wait_for(client.unsubscribe(sub), 5.0)
    except Exception:
        pass
    try:
        await asyncio.wait_for(client.close(), 5.0)
    except Exception:
        pass


async def _close_dead(client: RmqsClient) -> None:
    """Close a connection already gone (no unsubscribe: nobody would answer it)."""
    try:
        await asyncio.wait_for(client.close(), 5.0)
    except Exception:
        pass


async def _acquire(conn: Any, stream: str, name: str, wait_s: float) -> tuple[RmqsClient, int] | None:
    """The active subscription of `name`'s group, or None when it did not become active in time."""
    # A subscription needs a node hosting a member of the stream (a replica, else the leader).
    client = await open_for(conn, stream, "read", f"rmqs-lease:{name}"[:120])
    active: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    sub = 0

    async def on_update(frame: schema.ConsumerUpdateResponse) -> None:
        if frame.subscription_id != sub:
            return
        # The protocol wants an answer either way; the subscription has no credit, so the offset
        # it names never matters.
        await client.consumer_update(frame.correlation_id, schema.OffsetSpecification(OffsetType.NEXT, 0))
        if frame.active and not active.done():
            active.set_result(True)

    client.add_handler(schema.ConsumerUpdateResponse, on_update, name="rmqs-lease")
    try:
        await client.subscribe(
            stream,
            sub,
            offset_spec=schema.OffsetSpec.from_params(OffsetType.NEXT, None),
            initial_credit=0,
            properties={"single-active-consumer": "true", "name": name},
        )
        await asyncio.wait_for(asyncio.shield(active), wait_s)
    except TimeoutError:
        await _close(client, sub)
        return None
    except rx.AccessRefused as e:  # a single-active-consumer subscription: read on the stream
        await _close(client, sub)
        raise access_refused(conn, stream, "read", "take a run's lease (a subscription) on") from e
    except BaseException:
        await _close(client, sub)
        raise
    return client, sub


def _acquire_within(
    conn: Any, stream: str, name: str, wait_s: float, *, unreachable_s: float | None = None
) -> tuple[RmqsClient, int] | None:
    """`_acquire`, waiting up to `wait_s` for another holder, and a records stream that cannot be
    subscribed to for now (a member restarting, an election, a member list naming a node that just
    died) tried again until `unreachable_s` (default `wait_s`) passed (`recovery.retry_sync`, the
    one retry loop). None when another subscription of the name stays active; `BrokerUnavailableError`
    (the last one) when no member could be subscribed to."""
    window = wait_s if unreachable_s is None else max(wait_s, unreachable_s)
    deadline = time.monotonic() + window

    def attempt() -> tuple[RmqsClient, int] | None:
        left = min(wait_s, max(deadline - time.monotonic(), 0.1))
        return run_sync(_acquire(conn, stream, name, left), left + 60.0, f"lease on '{name}'")

    return retry_sync(
        f"subscribe to '{stream}'",
        attempt,
        window=window,
        deadline=deadline,
        exhausted=lambda err: err,
        on_retry=lambda err, _pause, _n: log.debug(
            "the lease on '%s' cannot be taken for now (%s); trying again", name, err
        ),
    )


def acquire(
    conn: Any,
    stream: str,
    name: str,
    *,
    wait_s: float = DEFAULT_WAIT_S,
    holder: str | Callable[[], str] = "",
    what: str = "",
) -> Lease:
    """Hold `name`'s lease, waiting up to `wait_s` for a holder to finish; else `ConsumerBusyError`.

    `what` says what the name stands for in messages (e.g. "consumer 'etl' on 'orders'"); `holder`
    describes who holds it now (read from the run record by the caller), or is a function asked
    for that only when the name is busy (the usual run pays no record read for it).
    """
    check_name(name, "lease name")
    if stream == RUNS_STREAM:  # the lease comes before the first record: on a new broker, create it
        ensure_stream(conn)
    try:
        got = _acquire_within(conn, stream, name, wait_s)
    except BrokerUnavailableError as e:
        raise BrokerUnavailableError(
            f"{what or repr(name)}: could not take its lease within {wait_s:.0f} s ({e}). This run read and "
            f"stored nothing. {COME_BACK_ADVICE}"
        ) from e
    if got is None:
        text = holder() if callable(holder) else holder
        # No known holder: usually a drain or a run that wrote no record yet, but a cluster whose
        # coordinator lost its majority hands out no lease at all, and looks the same from here.
        who = (
            f" ({text})"
            if text
            else " (no unfinished run record names it; if no other run of the name is running, the "
            "broker could not hand out the lease: on a cluster, check that a majority of its nodes run)"
        )
        raise ConsumerBusyError(
            f"{what or repr(name)} is held by another run{who}; waited {wait_s:.0f} s. This run read "
            "and stored nothing. Run one pipeline per consumer name at a time (or give each its own "
            "name); a retry succeeds once the other run ends, or at once if its process died"
        )
    return Lease(conn, name, *got, stream=stream, wait_s=wait_s, what=what)
