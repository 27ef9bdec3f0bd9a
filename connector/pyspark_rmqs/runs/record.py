"""The run record: a run's whole state in one message of the records stream, found by one pointer.

A watermark run (one that stores its consumer's watermark) writes its record before it reads:
the consumer, every partition stream with its planned `[start, end)` and incarnation
(`incarnation.py`), the watermarks it saw, its token and who runs it. It then moves the record
through its states, each a new record:

    planned    the range is fixed; nothing delivered yet
    delivered  the sink returned (or the output committed the run's token): never deliver again
    stored     every partition's watermark is stored: the run is over

A retry (any worker, any time) reads the latest record and resumes it whole: the same ranges, the
same token; a `delivered` record only stores; a `stored` one is done and a new run plans.

Where it lives: records are messages (JSON bodies) of one stream per virtual host, `rmqs.runs`,
created on first use. Records are kept per consumer name and target (`run_key`: a consumer's
watermark is per stream). The key's stored offset on that stream is the record's pointer:
the tail of `rmqs.runs` just before the record was published. Since a consumer's records are
written only by the run holding its lease (`lease.py`), its newest record is the first of its
records at or after the pointer. Storing the pointer is the state change: one stored offset, so a
transition happens whole or not at all — a record published by a process that died before
storing the pointer is never found.

`rmqs.runs` keeps the newest 1 GB of records (`max-length-bytes`): a record that retention
removes belongs to a run long finished; a consumer whose record is gone plans from its
watermark, as a consumer that never ran.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.core.codec import encode_body
from pyspark_rmqs.core.errors import AccessRefusedError, StreamNotFoundError, access_refused

if TYPE_CHECKING:
    from pyspark_rmqs.runs.lease import Lease

log = logging.getLogger(__name__)

RUNS_STREAM = "rmqs.runs"
# Where retention passed a pointer, its record is gone, or is among the first chunks kept (written
# just after the pointer's tail was read, behind at most the records and pointers of the runs
# that wrote meanwhile): the search reads that many chunks, not the whole stream (1 GB).
SEARCH_PAST_RETENTION_CHUNKS = 256
RUNS_STREAM_ARGUMENTS = {"max-length-bytes": 1_000_000_000, "stream-max-segment-size-bytes": 16_000_000}
VERSION = 1

PLANNED = "planned"
DELIVERED = "delivered"
STORED = "stored"
STATES = (PLANNED, DELIVERED, STORED)


@dataclass(frozen=True)
class RunRecord:
    """One run of one consumer name: what it planned, on which stream incarnations, how far it got."""

    consumer: str
    run_id: str
    target: str
    superstream: bool
    state: str
    # Every partition stream planned, `[start, end)`; an empty range (start == end) records where
    # the next run starts when nothing is stored yet (a first run at `latest`).
    ranges: dict[str, tuple[int, int]]
    incarnations: dict[str, int]
    # The stored watermarks when the run planned (a store checks nobody else moved them).
    seen: dict[str, int | None]
    token: str
    pipeline: str | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    # Which try of the run wrote it: each resume writes the record again with the next attempt, so
    # the record pointer moves before the resuming run reads (the fence `Lease.fence` checks).
    attempt: int = 0

    @property
    def key(self) -> str:
        return run_key(self.consumer, self.target)

    @property
    def done(self) -> bool:
        return self.state == STORED

    @property
    def delivered(self) -> bool:
        """Whether the run's sink succeeded: its ranges' ends are where the consumer stands."""
        return self.state in (DELIVERED, STORED)

    def moved_to(self, state: str) -> RunRecord:
        assert state in STATES
        return replace(self, state=state, updated_at=time.time())

    def taken_over(self) -> RunRecord:
        """The same run, resumed by its next attempt (same ranges, token and state)."""
        return replace(self, attempt=self.attempt + 1, updated_at=time.time())

    def abandoned(self) -> RunRecord:
        """This unfinished run given up (`rmqs watermark set`): done, and it read nothing.

        Its ranges shrink to their starts, so a partition that stored nothing yet starts where this
        run would have, never at its planned end.
        """
        return replace(
            self,
            state=STORED,
            ranges={s: (a, a) for s, (a, _) in self.ranges.items()},
            updated_at=time.time(),
        )

    def holder(self) -> str:
        """Who runs it, for messages: the pipeline and run id, and since when."""
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at))
        who = f"pipeline '{self.pipeline}', " if self.pipeline else ""
        again = f", attempt {self.attempt + 1}" if self.attempt else ""
        return f"{who}run {self.run_id[:12]} started {since}, {self.state}{again}"

    def to_json(self) -> bytes:
        d = asdict(self)
        d["v"] = VERSION
        d["ranges"] = {s: list(r) for s, r in self.ranges.items()}
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, body: bytes) -> RunRecord:
        d = json.loads(body)
        d.pop("v", None)
        d["ranges"] = {s: (int(a), int(b)) for s, (a, b) in d["ranges"].items()}
        d["incarnations"] = {s: int(v) for s, v in d["incarnations"].items()}
        return cls(**d)


def run_key(consumer: str, target: str) -> str:
    """The name a consumer's runs on one stream or super stream are known by in `rmqs.runs`.

    A consumer name's watermark is per stream, so two targets read under one consumer name are two
    pipelines: each has its own record and lease. `<target>/<consumer>`, or, past the broker's
    256-byte limit on names, their beginnings and a hash of the whole.
    """
    key = f"{target}/{consumer}"
    if len(key.encode()) <= 256:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    head = target.encode()[:100].decode(errors="ignore")
    tail = consumer.encode()[:100].decode(errors="ignore")
    return f"{head}/{tail}#{digest}"


def _is_record_of(consumer: str, target: str) -> Any:
    marker = b'"consumer":' + json.dumps(consumer).encode()

    def match(body: bytes) -> bool:
        if marker not in body:  # cheap filter before parsing: most records are other consumers'
            return False
        try:
            d = json.loads(body)
        except ValueError:
            return False
        return bool(d.get("consumer") == consumer and d.get("target") == target)

    return match


_ready: set[Any] = set()
_ready_lock = threading.Lock()


def ensure_stream(conn: Any) -> None:
    """Make sure `rmqs.runs` exists, once per process and connection: created only when missing.

    RabbitMQ checks the configure permission before it looks whether a stream exists, so declaring
    an existing `rmqs.runs` would make every run need configure on it (measured on 4.0: refused,
    where a user with configure gets "already exists"). Asking first (Metadata, which needs no
    permission) lets a team run with only read and write on it. Creating it is refused without
    configure: the error then says who may create it, unless another process created it meanwhile.
    """
    key = conn.cache_key()
    with _ready_lock:
        if key in _ready:
            return
    client = BrokerClient(conn)
    if not client.stream_exists(RUNS_STREAM):
        try:
            client.create_stream(RUNS_STREAM, RUNS_STREAM_ARGUMENTS)
        except AccessRefusedError as e:
            if not client.stream_exists(RUNS_STREAM):
                raise _cannot_create(conn) from e
    with _ready_lock:
        _ready.add(key)


def _cannot_create(conn: Any) -> AccessRefusedError:
    return access_refused(
        conn,
        RUNS_STREAM,
        "configure",
        "create",
        note="It does not exist yet: rmqs keeps the records of watermark runs in it, one per virtual host. ",
        other_fix=f"run `rmqs create --stream {RUNS_STREAM}` once as a user allowed to configure it (it "
        "gets the retention a run would give it; runs then need only read and write on it), or ",
    )


def latest(conn: Any, consumer: str, target: str, *, lease: Lease | None = None) -> RunRecord | None:
    """The newest record of `consumer` on `target` (a stream or super stream name), or None when it
    has none (never ran, or retention took it: the run then plans from its watermark). Read under
    `lease`, the pointer found is marked on it (what a lease taken back later proves unchanged)."""
    body, pointer = read_latest(conn, run_key(consumer, target), _is_record_of(consumer, target))
    if lease is not None:
        lease.mark(pointer)
    return None if body is None else RunRecord.from_json(body)


def write(conn: Any, record: RunRecord, *, lease: Lease | None = None) -> RunRecord:
    """Publish `record` and point the consumer at it: the transition happens when the pointer moves.

    Call only while holding the consumer's lease (`lease.py`): the pointer rule relies on no other
    process writing records of this consumer. With `lease`, the lease is kept first (`Lease.keep`:
    taken back, or `LeaseLostError`, if it ended under the run) and the new pointer marked on it.
    """
    if lease is not None:
        lease.keep(f"its record '{record.state}'")
    pointer = write_body(conn, record.key, record.to_json())
    if lease is not None:
        lease.mark(pointer)
    return record


def advance(conn: Any, record: RunRecord, state: str, *, lease: Lease | None = None) -> RunRecord:
    """`record` moved to `state`, written (under `lease`: see `write`)."""
    return write(conn, record.moved_to(state), lease=lease)


def placed(
    conn: Any,
    consumer: str,
    target: str,
    superstream: bool,
    ranges: Mapping[str, tuple[int, int]],
    seen: Mapping[str, int | None],
    pipeline: str,
) -> RunRecord:
    """A finished record of a run that rmqs did not plan (a drain, `rmqs watermark set`): `ranges`
    is what it read (an empty range: where the consumer now stands).

    The broker forgets a stored offset that retention left below the first offset; the record is
    what still says where the consumer stood, so its next run (or a drain's new checkpoint) reports
    what retention took instead of starting as a new consumer.
    """
    import uuid

    from pyspark_rmqs.runs.incarnation import incarnations

    return RunRecord(
        consumer=consumer,
        run_id=uuid.uuid4().hex,
        target=target,
        superstream=superstream,
        state=STORED,
        ranges=dict(ranges),
        incarnations=incarnations(conn, list(ranges), mark=True),
        seen=dict(seen),
        token="",
        pipeline=pipeline,
    )


def ranges_of(record: RunRecord) -> Mapping[str, tuple[int, int]]:
    """The non-empty ranges of a record (what its run reads)."""
    return {s: r for s, r in record.ranges.items() if r[1] > r[0]}


# Generic helpers for other kinds of record kept the same way (`runs.producer`): one pointer per
# key, a record found as the first matching message at or after it, written only under the key's
# lease.


def latest_body(conn: Any, key: str, match: Any) -> bytes | None:
    """The body of `key`'s newest record: the first message at or after `key`'s pointer that
    `match`es; None when `key` has no pointer or retention removed its record."""
    return read_latest(conn, key, match)[0]


def read_latest(conn: Any, key: str, match: Any) -> tuple[bytes | None, int | None]:
    """`latest_body`, and the pointer it was found by (None: `key` has none).

    Reading creates nothing: where `rmqs.runs` does not exist no run wrote a record, and a read-only
    look (`rmqs watermark show`) needs no configure permission. Runs that write took their lease
    first, which makes sure the stream exists (`lease.acquire`)."""
    client = BrokerClient(conn)
    try:
        pointer = client.stored_offset(key, RUNS_STREAM)
    except StreamNotFoundError:
        return None, None
    except AccessRefusedError:  # the broker checks read before existence: a missing stream is no error
        if client.stream_exists(RUNS_STREAM):
            raise
        return None, None
    if pointer is None:
        return None, None
    found = client.find_message(
        RUNS_STREAM, pointer, match, max_chunks_past_retention=SEARCH_PAST_RETENTION_CHUNKS
    )
    if found is None:
        log.info("the newest record of '%s' is no longer in %s (retention)", key, RUNS_STREAM)
        return None, pointer
    return found[1], pointer


def write_body(conn: Any, key: str, body: bytes) -> int:
    """Publish `body` (a JSON record) and move `key`'s pointer to it: the write happens when the
    pointer moves; returns the pointer stored. Call only while holding `key`'s lease (see `write`)."""
    from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings

    ensure_stream(conn)
    client = BrokerClient(conn)
    pointer = client.tail(RUNS_STREAM)
    with StreamProducer(conn, RUNS_STREAM, superstream=False, settings=WriteSettings()) as producer:
        producer.send([encode_body(body)])
        producer.flush()
    client.store_offsets(key, {RUNS_STREAM: pointer})
    return pointer
