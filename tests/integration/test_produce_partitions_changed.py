"""A produce run retried after its super stream's partitions changed: each message once, or a clear error.

A produce run's retry numbers each partition stream's messages from the bases its first try
recorded: the broker drops a re-sent message only if it reaches the same partition stream under
the same publishing id. Hash routing over today's partitions moved most keys when a partition was
added between the tries, so the retry's ids no longer matched its messages: the broker dropped new
messages as "already sent" and kept re-sent ones twice, and the run reported success. A retry now
routes over the partition list its first try recorded; a partition removed since fails it before
it sends. Every test counts every body across all partition streams.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.broker.writer import WriteSettings
from pyspark_rmqs.errors import RoutingChangedError
from pyspark_rmqs.produce import run_produce
from tests.support.broker import BrokerSettings, management
from tests.support.data import client, conn_of

N = 3000
FAIL_AT = 2500  # the first try yields this many, waits until the broker stored STORED, then fails
STORED = 2000


def bodies_in(broker: BrokerSettings, streams: list[str]) -> dict[str, list[bytes]]:
    c = client(broker)
    return {
        s: list(read_range(conn_of(broker), s, 0, c.tail(s)).column("value").to_pylist()) for s in streams
    }


def assert_each_once(got: list[bytes], expected: list[bytes]) -> None:
    dups = len(got) - len(set(got))
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not dups and not missing and not extra, (
        f"{len(got)} messages for {len(expected)}: {dups} duplicate(s), {len(missing)} missing "
        f"(first: {missing[:3]}), {len(extra)} unexpected (first: {extra[:3]})"
    )


def keyed(
    prefix: str, n: int = N, fail_at: int | None = None, wait: Any = None, keys: int | None = None
) -> Iterator[Any]:
    """`n` keyed messages, unique bodies (keys `key-<i>`, or with `keys` the binding keys "0", "1",
    ...); with `fail_at`, raise there once `wait()` returned."""
    for i in range(n):
        if i == fail_at:
            wait()
            raise RuntimeError(f"injected failure after {fail_at} of {n} messages")
        key = f"key-{i}" if keys is None else str(i % keys)
        yield {"value": f"{prefix}-{i:05d}".encode(), "routing_key": key}


def numbered(prefix: str, n: int = N) -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() for i in range(n)]


def wait_for_tails(broker: BrokerSettings, streams: list[str], at_least: int) -> None:
    deadline = time.monotonic() + 30
    while sum(client(broker).tails(streams).values()) < at_least:
        assert time.monotonic() < deadline, f"the broker never held {at_least} messages"
        time.sleep(0.05)


def failed_first_try(
    broker: BrokerSettings,
    name: str,
    parts: list[str],
    prefix: str,
    identity: str,
    settings: WriteSettings | None = None,
    keys: int | None = None,
) -> None:
    """A produce run's first try: 2,500 of 3,000 messages sent, 2,000 of them stored, then it fails."""
    with pytest.raises(RuntimeError, match="injected failure"):
        run_produce(
            conn_of(broker),
            keyed(prefix, fail_at=FAIL_AT, wait=lambda: wait_for_tails(broker, parts, STORED), keys=keys),
            superstream=name,
            settings=settings or WriteSettings(producer_name="loader"),
            run_identity=identity,
        )
    assert sum(client(broker).tails(parts).values()) >= STORED


def unbind(broker: BrokerSettings, superstream: str, partition: str) -> None:
    """Take `partition` out of `superstream` (its binding deleted; the stream itself stays)."""
    vhost = quote(broker.vhost, safe="")
    path = f"bindings/{vhost}/e/{quote(superstream, safe='')}/q/{quote(partition, safe='')}"
    for b in management("GET", path):
        management("DELETE", f"{path}/{quote(b['properties_key'], safe='')}")


def test_a_retry_after_a_partition_was_added_routes_as_its_first_try_and_writes_each_message_once(
    broker: BrokerSettings, streams: Any
) -> None:
    """Try 1 stores 2,000 of 3,000 keyed messages over 2 partitions and fails; a third partition is
    bound; the retry of the same run identity routes over the 2 partitions its first try used: each
    message once (was: about 650 dropped as already sent, about 690 kept twice, and success). A new
    run identity afterwards routes over the 3 partitions of today."""
    if broker.external:
        pytest.skip("binds a partition through the local broker's management API")
    name, parts = streams.super_stream(2)
    failed_first_try(broker, name, parts, "k", "run-1")
    added = streams.add_partition(name, 2)
    assert client(broker).partitions(name) == [*parts, added]

    out = run_produce(
        conn_of(broker),
        keyed("k"),
        superstream=name,
        settings=WriteSettings(producer_name="loader"),
        run_identity="run-1",
    )
    got = bodies_in(broker, [*parts, added])
    assert_each_once([b for bodies in got.values() for b in bodies], numbered("k"))
    assert got[added] == []  # the first try's partitions only
    assert out.resumed and sum(out.messages.values()) == N and out.messages[added] == 0
    held, new = sum(out.already_stored.values()), sum(out.new.values())
    assert held >= STORED and held + new == N

    # Retried once more: nothing new, nothing lost.
    again = run_produce(
        conn_of(broker),
        keyed("k"),
        superstream=name,
        settings=WriteSettings(producer_name="loader"),
        run_identity="run-1",
    )
    assert sum(again.new.values()) == 0
    # A new run identity is new data, routed over today's three partitions.
    nxt = run_produce(
        conn_of(broker),
        keyed("next"),
        superstream=name,
        settings=WriteSettings(producer_name="loader"),
        run_identity="run-2",
    )
    got = bodies_in(broker, [*parts, added])
    assert_each_once([b for bodies in got.values() for b in bodies], numbered("k") + numbered("next"))
    assert not nxt.resumed and nxt.messages[added] == len(got[added]) > 0
    assert all(b.startswith(b"next-") for b in got[added])


def test_a_retry_after_a_partition_of_its_first_try_was_removed_fails_before_it_sends(
    broker: BrokerSettings, streams: Any
) -> None:
    """Try 1 stores 2,000 of 3,000 keyed messages over 3 partitions and fails; the third is taken out
    of the super stream; the retry fails with `RoutingChangedError` naming the partition, before it
    sends anything (routing over 2 partitions would drop some messages and keep others twice)."""
    if broker.external:
        pytest.skip("unbinds a partition through the local broker's management API")
    name, parts = streams.super_stream(3)
    failed_first_try(broker, name, parts, "r", "run-1")
    before = client(broker).tails(parts)
    unbind(broker, name, parts[2])
    assert client(broker).partitions(name) == parts[:2]

    with pytest.raises(RoutingChangedError, match=rf"{parts[2]}.*no longer") as caught:
        run_produce(
            conn_of(broker),
            keyed("r"),
            superstream=name,
            settings=WriteSettings(producer_name="loader"),
            run_identity="run-1",
        )
    assert "loader" in str(caught.value) and "run-1" in str(caught.value)
    assert client(broker).tails(parts) == before  # nothing sent
    # A new run identity is a new run: it routes over today's two partitions.
    run_produce(
        conn_of(broker),
        keyed("new", 500),
        superstream=name,
        settings=WriteSettings(producer_name="loader"),
        run_identity="run-2",
    )
    got = bodies_in(broker, parts)
    first_try = [b for s in parts for b in got[s] if b.startswith(b"r-")]
    assert len(first_try) == len(set(first_try)) == sum(before.values())  # the first try's, once
    new = [b for s in parts for b in got[s] if b.startswith(b"new-")]
    assert_each_once(new, numbered("new", 500))
    assert not any(b.startswith(b"new-") for b in got[parts[2]])


def test_a_retry_with_another_routing_strategy_fails_before_it_sends(
    broker: BrokerSettings, streams: Any
) -> None:
    """The first try routes by the super stream's bindings (`key`), its retry by hash: its messages
    would reach other partition streams under other ids. `RoutingChangedError` before it sends; the
    retry routing as the first try did then writes each message once."""
    name, parts = streams.super_stream(2)
    by_key = WriteSettings(producer_name="loader", routing_strategy="key")
    failed_first_try(broker, name, parts, "s", "run-1", by_key, keys=2)
    before = client(broker).tails(parts)
    with pytest.raises(RoutingChangedError, match=r"routed by 'key' on its first try.*by 'hash'"):
        run_produce(
            conn_of(broker),
            keyed("s", keys=2),
            superstream=name,
            settings=WriteSettings(producer_name="loader"),
            run_identity="run-1",
        )
    assert client(broker).tails(parts) == before
    run_produce(conn_of(broker), keyed("s", keys=2), superstream=name, settings=by_key, run_identity="run-1")
    got = bodies_in(broker, parts)
    assert_each_once(got[parts[0]] + got[parts[1]], numbered("s"))


# ------------------------------------------------------------- the Spark sink's tasks (`producerName`)


def test_a_spark_write_task_retried_after_a_partition_was_added_writes_each_row_once(
    broker: BrokerSettings, streams: Any
) -> None:
    """A batch write task with `producerName` numbers each partition stream's rows 1, 2, ... under a
    name shared by its attempts. Its first attempt stores 2,000 of 3,000 keyed rows over 2 partitions
    and fails; a third partition is bound; the retried attempt (the job's writer, pickled again as
    Spark hands it to every attempt) routes over the partitions the job's driver saw: each row once
    (was: re-sent rows routed over 3 partitions, about a third of them dropped, a third twice)."""
    if broker.external:
        pytest.skip("binds a partition through the local broker's management API")
    import pickle

    import pyarrow as pa

    from pyspark_rmqs.options import parse_sink_options
    from pyspark_rmqs.spark.sink import RabbitMQStreamsWriter
    from tests.support.data import spark_options

    name, parts = streams.super_stream(2)
    opts = parse_sink_options(spark_options(broker, superstream=name, producerName="loader"))
    writer = RabbitMQStreamsWriter(opts, ["value", "routing_key"])  # on the driver, once per job

    def batches(fail: bool) -> Iterator[pa.RecordBatch]:
        for start in range(0, N, 500):
            if fail and start == FAIL_AT:
                wait_for_tails(broker, parts, STORED)
                raise RuntimeError("injected failure of the first attempt")
            rows = range(start, start + 500)
            yield pa.RecordBatch.from_pydict(
                {"value": [f"t-{i:05d}".encode() for i in rows], "routing_key": [f"key-{i}" for i in rows]}
            )

    with pytest.raises(RuntimeError, match="injected failure"):
        pickle.loads(pickle.dumps(writer)).write(batches(fail=True))
    added = streams.add_partition(name, 2)
    result = pickle.loads(pickle.dumps(writer)).write(batches(fail=False))  # the retried attempt
    got = bodies_in(broker, [*parts, added])
    assert_each_once([b for bodies in got.values() for b in bodies], numbered("t"))
    assert got[added] == [] and sum(result.messages.values()) == N
