"""A produce run's publishing ids: one run per producer name at a time, and a retry numbered as its first try.

The broker deduplicates per producer name and stream: it keeps the highest publishing id it stored
for the name (its *sequence*) and drops any message of that name whose id is at or below it. That
protects a re-sent message only if it carries the id it had the first time, and only if no other
run took those ids. Continuing after the sequence at every start (what `produce` did) broke both:
two runs of one name at once reused each other's ids, so the broker dropped one run's rows, and a
retried task numbered its messages after what its failed try had stored, so those were kept twice.

So a produce run with a producer name
- holds the name's lease (`lease.py`) on `producer_key(name, target)` while it sends: a second run
  of the name on the same stream or super stream waits up to `wait_s`, then fails with
  `ProducerBusyError` before it sends anything;
- has an identity (Airflow: dag, task, run and map index; Dagster: asset, partition and run; a
  caller's own; else a random one: every call a new run), and numbers its messages from what its
  identity's first try recorded. The producer record lives in `rmqs.runs` beside the consumers'
  run records (`record.write_body`: a message, then the key's pointer); it holds, newest first, the
  last `HISTORY` runs of the name, each with its base per partition stream (the first publishing id
  it used: the broker's sequence + 1 when it began) and the messages it skips (below); on a super
  stream also the partition list its first try routed over, in order, and its routing strategy.

A message keeps its id only if it reaches the partition stream it reached the first time: ids are
positional per partition stream. So every try of a run routes over its first try's partition list,
not today's (hash routing over a partition added since would move most keys: the broker would drop
new messages as re-sent and keep re-sent ones twice). A partition added since gets none of the
run's messages (the next run routes over it); one removed since, or another routing strategy,
fails the try with `RoutingChangedError` before it sends.

What a try does, in this order (`begin`):
1. take the lease: from here on nobody else sends under the name or writes its record;
2. read the record, then the broker's sequence on every partition stream. Under the lease both
   change only through this try, which has sent nothing yet, so they agree with each other;
3. decide the numbering (`plan_run`):
   - the identity is the newest run (a retry): the same partition list, bases and skips as its
     first try. Its messages get the ids they had, and the broker drops those it stored already;
   - the identity is an older run (another run of the name ran after its failed try): the ids it
     got stored are those from its base up to where the next run began (the record keeps that as
     its ends), per partition stream. Numbered from its old base, its missing messages would be
     dropped too (their ids are now below the sequence), so it skips that many of its first
     messages to each partition stream instead, and numbers the rest after the sequence: it
     becomes the newest run again, with the summed skips and its first try's partition list;
   - a new identity: today's partitions, bases after the sequence, nothing skipped;
4. write the record when it changed (a retry of the newest run changes nothing), and only then send.

Crashes: the record is a message published first and a pointer stored second (the pointer is the
write). A try that dies before step 4 moved the pointer sent nothing, so its retry finds the
previous record and the same sequences and decides the same bases. A try that dies after it left
its bases in the record: the retry numbers its messages from them, whether the dead try sent none,
some or all of them.

What it relies on: the producer function yields the same messages in the same order on a retry (a
retry may yield more: those are new and kept); one message per publishing id (no sub-entry
batching); every publisher of the name goes through rmqs. A retry after more than `HISTORY` later
runs of the name, or once retention removed the name's record from `rmqs.runs`, is taken as a new
run (at-least-once; the latter is logged as a warning: the broker holds messages of a name with no
record). The lease ends with its connection (a broker restart, its node down): a run that lost it
takes it back before its next batch (`Lease.keep`), and fails with `LeaseLostError` if it cannot or
another run of the name wrote the record meanwhile (every run of another identity does).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.core.errors import ConsumerBusyError, ProducerBusyError, RoutingChangedError
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.runs import lease as leases
from pyspark_rmqs.runs import record

log = logging.getLogger(__name__)

KIND = "producer"
VERSION = 1
HISTORY = 16  # runs of one producer name kept in its record (a retry finds its own among them)
MAX_RECORD_BYTES = 256_000  # older runs are left out of a record past this size


def routing_name(strategy: str, partitioner_class: str | None = None) -> str:
    """How a run routes, as its record keeps it: `hash`, `key` or `custom:<partitionerClass>`."""
    return f"custom:{partitioner_class}" if strategy == "custom" else strategy


def producer_key(producer: str, target: str) -> str:
    """The name a producer's runs on one stream or super stream are known by (lease and pointer)."""
    return record.run_key("producer:" + producer, target)


@dataclass(frozen=True)
class ProducerRun:
    """One run of a producer name: its first publishing id per partition stream, and what it skips."""

    identity: str
    bases: dict[str, int]
    # Per partition stream, how many of the run's first messages to it an earlier try got stored
    # under ids that are now below the broker's sequence: skipped, never sent again.
    skip: dict[str, int] = field(default_factory=dict)
    # Set when the next run began: the broker's sequence + 1 then, per partition stream, so the ids
    # this run got stored are [bases, ends).
    ends: dict[str, int] | None = None
    pipeline: str | None = None
    started_at: float = field(default_factory=time.time)
    # A super stream's partition streams its first try routed over, in their order, and how it
    # routed (`routing_name`): every try routes so. None: a stream, or a record written before rmqs kept them.
    partitions: tuple[str, ...] | None = None
    routing: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"identity": self.identity, "bases": self.bases, "started_at": self.started_at}
        if any(self.skip.values()):
            d["skip"] = {s: n for s, n in self.skip.items() if n}
        if self.ends is not None:
            d["ends"] = self.ends
        if self.pipeline:
            d["pipeline"] = self.pipeline
        if self.partitions is not None:
            d["partitions"] = list(self.partitions)
        if self.routing is not None:
            d["routing"] = self.routing
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProducerRun:
        return cls(
            identity=str(d["identity"]),
            bases={s: int(v) for s, v in d["bases"].items()},
            skip={s: int(v) for s, v in d.get("skip", {}).items()},
            ends=None if d.get("ends") is None else {s: int(v) for s, v in d["ends"].items()},
            pipeline=d.get("pipeline"),
            started_at=float(d.get("started_at", 0.0)),
            partitions=None if d.get("partitions") is None else tuple(str(p) for p in d["partitions"]),
            routing=d.get("routing"),
        )

    def stored(self) -> dict[str, int]:
        """Per partition stream, the messages it got stored (known once the next run began)."""
        ends = self.ends or {}
        return {s: max(0, ends.get(s, base) - base) for s, base in self.bases.items()}


@dataclass(frozen=True)
class ProducerRecord:
    """A producer name's recent runs on one target, newest first (only the newest may be sending)."""

    producer: str
    target: str
    runs: tuple[ProducerRun, ...]
    updated_at: float = field(default_factory=time.time)

    def to_json(self) -> bytes:
        runs = list(self.runs)
        while True:
            d = {
                "kind": KIND,
                "v": VERSION,
                "producer": self.producer,
                "target": self.target,
                "updated_at": self.updated_at,
                "runs": [r.to_dict() for r in runs],
            }
            body = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
            if len(body) <= MAX_RECORD_BYTES or len(runs) <= 1:
                return body
            runs.pop()  # the oldest run goes first

    @classmethod
    def from_json(cls, body: bytes) -> ProducerRecord:
        d = json.loads(body)
        return cls(
            producer=d["producer"],
            target=d["target"],
            runs=tuple(ProducerRun.from_dict(r) for r in d["runs"]),
            updated_at=float(d.get("updated_at", 0.0)),
        )


def _is_record_of(producer: str, target: str) -> Any:
    marker = b'"producer":' + json.dumps(producer).encode()

    def match(body: bytes) -> bool:
        if marker not in body:  # cheap filter before parsing: most records are others'
            return False
        try:
            d = json.loads(body)
        except ValueError:
            return False
        return bool(d.get("kind") == KIND and d.get("producer") == producer and d.get("target") == target)

    return match


def latest(
    conn: Any, producer: str, target: str, *, lease: leases.Lease | None = None
) -> ProducerRecord | None:
    """The producer name's record on `target`, or None (it never ran there, or retention took it).
    Read under `lease`, the pointer found is marked on it (`Lease.keep` proves it unchanged)."""
    body, pointer = record.read_latest(conn, producer_key(producer, target), _is_record_of(producer, target))
    if lease is not None:
        lease.mark(pointer)
    return None if body is None else ProducerRecord.from_json(body)


def _check_routing(
    previous: ProducerRecord, run: ProducerRun, partitions: Sequence[str] | None, routing: str | None
) -> None:
    """A retry of `run` routes as its first try did, or fails before it sends (`RoutingChangedError`)."""
    where = f"super stream '{previous.target}'"
    whose = f"run '{run.identity}' of producer '{previous.producer}'"
    if run.partitions is not None and partitions is not None:
        gone = [p for p in run.partitions if p not in partitions]
        if gone:
            raise RoutingChangedError(
                f"partition stream(s) {gone} of {where} that {whose} routed to on its first try are no "
                f"longer part of it (its partitions now: {list(partitions)}); this try sent nothing. "
                "Routed over the others, its re-sent messages would reach other partition streams under "
                "other publishing ids: the broker would drop some as re-sent and keep others twice. Bind "
                "the partition stream(s) again and retry, or publish under a new run identity (a new "
                "run: what the first try stored is then published again)"
            )
    if run.routing is not None and routing is not None and run.routing != routing:
        raise RoutingChangedError(
            f"{whose} on {where} routed by '{run.routing}' on its first try and this try routes by "
            f"'{routing}'; this try sent nothing. Its re-sent messages would reach other partition "
            "streams under other publishing ids: retry with the first try's routing, or publish under a "
            "new run identity"
        )


def plan_run(
    previous: ProducerRecord | None,
    identity: str,
    sequences: Mapping[str, int],
    pipeline: str | None = None,
    *,
    partitions: Sequence[str] | None = None,
    routing: str | None = None,
) -> tuple[ProducerRun, bool, tuple[ProducerRun, ...] | None]:
    """This try's numbering from the record and the broker's sequences (both read under the lease).

    `partitions` (a super stream's partition streams today, in order) and `routing`
    (`routing_name`) are recorded with a new run; a retry keeps its first try's, or fails with
    `RoutingChangedError` when the super stream lost one of them or the routing changed. Returns
    the run, whether it resumes a recorded run, and the runs to record (None: the record stays as
    it is). See the module docstring.
    """
    runs = previous.runs if previous is not None else ()
    after = {s: seq + 1 for s, seq in sequences.items()}
    today = None if partitions is None else tuple(partitions)
    how = None if today is None else routing
    if runs and runs[0].identity == identity:
        assert previous is not None
        newest = runs[0]
        _check_routing(previous, newest, today, routing)
        # A partition stream added since gets none of its messages when it routes over its first
        # try's partitions; it has a base all the same (a key bound to it alone routes there).
        # A run recorded without its partitions routes over today's from now on.
        run = replace(
            newest,
            bases={**after, **newest.bases},
            partitions=today if newest.partitions is None else newest.partitions,
            routing=how if newest.routing is None else newest.routing,
        )
        return run, True, None if run == newest else (run, *runs[1:])
    mine = next((r for r in runs[1:] if r.identity == identity), None)
    if mine is None:
        run = ProducerRun(identity, after, {}, None, pipeline, partitions=today, routing=how)
    else:
        assert previous is not None
        _check_routing(previous, mine, today, routing)
        stored = mine.stored()
        skip = {s: mine.skip.get(s, 0) + stored.get(s, 0) for s in {*mine.skip, *stored}}
        run = ProducerRun(
            identity,
            after,
            skip,
            None,
            pipeline,
            mine.started_at,
            today if mine.partitions is None else mine.partitions,
            how if mine.routing is None else mine.routing,
        )
    # The run that was newest ends where this one begins.
    ended = tuple(r if r.ends is not None else replace(r, ends=after) for r in runs if r.identity != identity)
    return run, mine is not None, (run, *ended[: HISTORY - 1])


@dataclass
class ProducerTry:
    """A try of a produce run, holding the producer name's lease: how to number its messages."""

    conn: Any
    producer: str
    target: Target
    run: ProducerRun
    resumed: bool
    sequences: dict[str, int]  # the broker's sequence per partition stream when the try began
    lease: leases.Lease
    wait_s: float

    def already_stored(self, sent: Mapping[str, int], skipped: Mapping[str, int]) -> dict[str, int]:
        """Per partition stream, how many of this try's messages the broker held already: those
        skipped, and those it dropped as re-sent (ids at or below its sequence when the try began)."""
        out: dict[str, int] = {}
        for s in {*sent, *skipped}:
            n, base = sent.get(s, 0), self.run.bases.get(s)
            dropped = 0 if base is None else min(n, max(0, self.sequences.get(s, 0) - base + 1))
            out[s] = skipped.get(s, 0) + dropped
        return out

    def check_held(self) -> None:
        """Still the one run of the name before the next batch: a lease lost with its connection is
        taken back, and the try goes on only if the record's pointer did not move meanwhile (a run of
        another identity writes the record when it begins); else `LeaseLostError` (`Lease.keep`)."""
        self.lease.keep("its next batch")

    def release(self) -> None:
        self.lease.release()


def _acquire(
    conn: Any, producer: str, target: Target, wait_s: float, before: ProducerRecord | None
) -> leases.Lease:
    key = producer_key(producer, target.name)
    what = f"producer '{producer}' on {target.describe()}"
    try:
        lease = leases.acquire(conn, record.RUNS_STREAM, key, wait_s=wait_s, what=what)
        lease.retry_advice = "a retry with the same run identity adds only what is missing"
        return lease
    except ConsumerBusyError:
        holder = ""
        if before is not None and before.runs:
            r = before.runs[0]
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.started_at))
            who = f"pipeline '{r.pipeline}', " if r.pipeline else ""
            holder = f" (the newest recorded run: {who}run '{r.identity}' started {since})"
        raise ProducerBusyError(
            f"producer '{producer}' on {target.describe()} is held by another run{holder}; waited "
            f"{wait_s:.0f} s. This run sent nothing: two runs of one producer name would reuse publishing "
            "ids and the broker would drop one run's messages. Run one producer of a name per stream at "
            "a time (or give each its own name); a retry succeeds once the other run ends, or at once if "
            "its process died"
        ) from None


def begin(
    conn: Any,
    producer: str,
    target: Target,
    streams: Iterable[str],
    identity: str | None,
    *,
    wait_s: float | None = None,
    pipeline: str | None = None,
    routing: str | None = None,
) -> ProducerTry:
    """Take the producer name's lease and decide this try's numbering (the steps of the module
    docstring, in that order). Release it with `ProducerTry.release()` when the run ends.

    `streams`: the stream, or the super stream's partition streams today (in order); a super
    stream's try routes over `ProducerTry.run.partitions` (its first try's) and by `routing`."""
    streams = list(streams)
    leases.check_name(producer, "producer name")
    wait = leases.DEFAULT_WAIT_S if wait_s is None else wait_s
    before = latest(conn, producer, target.name)  # only to name the holder if the name is busy
    lease = _acquire(conn, producer, target, wait, before)
    try:
        previous = latest(conn, producer, target.name, lease=lease)  # under the lease: only this try writes
        sequences = BrokerClient(conn).publisher_sequences(producer, streams)
        if previous is None and identity and any(sequences.values()):
            log.warning(
                "producer '%s' on %s has no record in %s, though the broker stored messages of the name "
                "(retention removed its record, or the name published outside rmqs): run '%s' is "
                "numbered as a new run; if it retries a failed try, what that try stored is published "
                "again (at-least-once)",
                producer,
                target.describe(),
                record.RUNS_STREAM,
                identity,
            )
        run, resumed, runs = plan_run(
            previous,
            identity or uuid.uuid4().hex,
            sequences,
            pipeline,
            partitions=streams if target.is_super else None,
            routing=routing if target.is_super else None,
        )
        if runs is not None:  # the pointer moves last: a crash before it leaves the old record
            updated = ProducerRecord(producer, target.name, runs)
            lease.keep("its record")
            lease.mark(record.write_body(conn, producer_key(producer, target.name), updated.to_json()))
        log.info(
            "producer '%s' on %s: run '%s' %s, first publishing ids %s%s",
            producer,
            target.describe(),
            run.identity,
            "resumed" if resumed else "new",
            run.bases,
            f", skipping {run.skip} message(s) stored before" if any(run.skip.values()) else "",
        )
        added = [p for p in streams if run.partitions is not None and p not in run.partitions]
        if added:
            log.warning(
                "producer '%s' on %s: run '%s' routes over the partition streams its first try routed "
                "over, %s; %s, added since, get(s) none of its messages (the next run routes over them)",
                producer,
                target.describe(),
                run.identity,
                list(run.partitions or ()),
                added,
            )
        return ProducerTry(conn, producer, target, run, resumed, sequences, lease, wait)
    except BaseException:
        lease.release()
        raise
