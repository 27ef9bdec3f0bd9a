"""The broker layer against a real broker: BrokerClient, RangeReader/read_range and StreamProducer.

No mocks: every test publishes through `StreamProducer`, reads back through `read_range` and asserts
exact offsets and values. Streams come from the `streams` fixture and are deleted after each test.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings, read_range
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings, hash_partition
from pyspark_rmqs.core import codec
from pyspark_rmqs.core.errors import (
    AuthenticationError,
    BrokerTimeoutError,
    ConfigurationError,
    DataLossError,
    PublishError,
    StreamNotFoundError,
)
from pyspark_rmqs.core.schema import METADATA_FIELDS, PROPERTY_NAMES
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from tests.support.broker import BrokerSettings
from tests.support.data import settled_bounds

pytestmark = pytest.mark.timeout(180)


# --------------------------------------------------------------------------------------- helpers


@pytest.fixture
def conn(broker: BrokerSettings) -> ConnectionOptions:
    return parse_connection_options(broker.spark_options)


@pytest.fixture
def client(conn: ConnectionOptions) -> BrokerClient:
    return BrokerClient(conn)


def bodies(prefix: str, start: int, stop: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(start, stop)]


def publish(
    conn: ConnectionOptions,
    stream: str,
    values: Sequence[bytes],
    *,
    sizes: Sequence[int] | None = None,
    settings: WriteSettings | None = None,
    filter_values: Sequence[str | None] | None = None,
) -> dict[str, int]:
    """Publish `values` (bodies) to `stream`, one flushed send() per entry of `sizes`.

    Returns the producer's last publishing ids (read before `close()`, which forgets them).
    """
    messages = [codec.encode(v) for v in values]
    sizes = list(sizes) if sizes is not None else [len(messages)]
    assert sum(sizes) == len(messages)
    producer = StreamProducer(conn, stream, superstream=False, settings=settings or WriteSettings())
    try:
        at = 0
        for n in sizes:
            fvals = list(filter_values[at : at + n]) if filter_values is not None else None
            producer.send(messages[at : at + n], filter_values=fvals)
            producer.flush()  # one send per chunk (or more): chunk boundaries differ from send to send
            at += n
        return producer.last_publishing_ids()
    finally:
        producer.close()


def read(
    conn: ConnectionOptions, stream: str, start: int, end: int, **kw: Any
) -> tuple[list[int], list[bytes]]:
    table = read_range(conn, stream, start, end, ReadSettings(**kw))
    return table.column("offset").to_pylist(), table.column("value").to_pylist()


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    out = fn(*args, **kw)
    return out, time.monotonic() - t0


# ------------------------------------------------------------------------------------------ tail


def test_tail_follows_user_messages_not_tracking_entries(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    assert client.stream_exists(s) is True
    assert client.tail(s) == 0
    assert client.first_offset(s) == 0
    assert client.stats(s).is_empty

    n = 137
    publish(conn, s, bodies("t", 0, n), sizes=[100, 37])
    assert client.tail(s) == n

    client.store_offsets("c", {s: 5})
    assert client.stored_offset("c", s) == 5
    # The tracking entry takes offset n: the broker's last chunk is now past the last user message.
    assert client.stats(s).committed_chunk_id == n
    assert client.tail(s) == n
    assert client.tails([s]) == {s: n}
    assert client.stored_offset("never-stored-" + uuid.uuid4().hex[:6], s) is None

    client.store_offsets("c", {s: 9})
    assert client.stored_offset("c", s) == 9
    assert client.tail(s) == n


def test_store_offsets_on_partitions_concurrently(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    _, parts = streams.super_stream(3)
    counts = {parts[0]: 3, parts[1]: 5, parts[2]: 7}
    for p, n in counts.items():
        publish(conn, p, bodies(p, 0, n))
    assert client.tails(parts) == counts

    wanted = {parts[0]: 1, parts[1]: 4, parts[2]: 6}
    client.store_offsets("grp", wanted)
    assert client.stored_offsets("grp", parts) == wanted
    assert client.stored_offsets("other", parts) == dict.fromkeys(parts)
    assert client.tails(parts) == counts  # tracking entries do not move the tails

    moved = {parts[0]: 2, parts[1]: 5, parts[2]: 7}
    client.store_offsets("grp", moved)
    assert client.stored_offsets("grp", parts) == moved


def test_forward_stores_never_move_a_stored_offset_back(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    """`store_offsets_forward` (the streaming source's commit, `store_watermarks`): a lower value is
    kept out and reported, a higher or first one is stored."""
    _, parts = streams.super_stream(2)
    for p in parts:
        publish(conn, p, bodies(p, 0, 100))
    client.store_offsets("fwd", {parts[0]: 80})
    kept = client.store_offsets_forward("fwd", {parts[0]: 40, parts[1]: 30})
    assert kept == {parts[0]: 80}
    assert client.stored_offsets("fwd", parts) == {parts[0]: 80, parts[1]: 30}
    assert client.store_offsets_forward("fwd", {parts[0]: 90, parts[1]: 30}) == {}
    assert client.stored_offsets("fwd", parts) == {parts[0]: 90, parts[1]: 30}


def test_a_store_below_the_first_offset_the_broker_drops_at_once_is_no_failure(  # type: ignore[no-untyped-def]
    conn, client, streams, broker: BrokerSettings
) -> None:
    """The broker keeps no stored offset below a stream's first offset past a segment roll, and a
    store's own tracking chunk rolls one when the last segment is full: here every chunk does (the
    segments are smaller than the snapshot of three long tracked names). A run resuming a range
    retention had overtaken stores its end there; `store_offsets` waited for a value the broker had
    dropped and failed with a retryable `BrokerTimeoutError`, on every retry (found by `make
    campaign`, seed 2949345665). It returns; a store at or above the first offset is still read back."""
    s = streams.stream(arguments={"max-length-bytes": 20_000, "stream-max-segment-size-bytes": 400})
    publish(conn, s, bodies("r" * 100, 0, 400), sizes=[10] * 40)
    first, tail = settled_bounds(broker, s, truncated=True)
    names = [f"{i}-{uuid.uuid4().hex}".ljust(200, "x") for i in range(3)]  # a 600-byte snapshot
    for name in names:
        client.store_offsets(name, {s: tail - 1})
    assert client.stored_offsets(names[0], [s]) == {s: tail - 1}
    (_, took) = timed(client.store_offsets, "behind", {s: first - 5})
    assert client.stored_offset("behind", s) is None, "the broker kept it: this test needs it dropped"
    assert took < 1.0, took
    client.store_offsets("behind", {s: tail - 1})
    assert client.stored_offset("behind", s) == tail - 1


# ------------------------------------------------------------------------------- reader ranges

N_READ = 5_000
SEND_SIZES = (1, 7, 250, 999, 13, 1730, 2000)  # flushed one by one: chunks of very different sizes


def test_reader_ranges_start_and_end_inside_chunks(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    values = bodies("r", 0, N_READ)
    publish(conn, s, values, sizes=SEND_SIZES)
    assert client.tail(s) == N_READ
    assert client.stats(s).committed_chunk_id >= sum(SEND_SIZES[:-1])  # many chunks, the last one late

    for start, end in [
        (0, 1),
        (17, 4321),
        (4999, 5000),
        (0, 5000),
        (1, 8),
        (7, 258),
        (256, 1259),
        (3000, 3001),
    ]:
        offsets, got = read(conn, s, start, end)
        assert offsets == list(range(start, end)), (start, end)
        assert got == values[start:end], (start, end)

    # Several RecordBatches (batch_rows) and the full decoding path give the same rows.
    reader = RangeReader(conn, s, 17, 4321, ReadSettings(batch_rows=1000, metadata_fields=("routing_key",)))
    batches = list(reader)
    assert len(batches) > 1
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(17, 4321))
    assert [v for b in batches for v in b.column("value").to_pylist()] == values[17:4321]
    assert {r for b in batches for r in b.column("routing_key").to_pylist()} == {None}


def test_reader_empty_range_and_tracking_entry_at_the_end(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    values = bodies("e", 0, 300)
    publish(conn, s, values, sizes=[120, 180])

    table, took = timed(read_range, conn, s, 10, 10, ReadSettings())
    assert table.num_rows == 0
    assert table.column_names == ["value", "stream", "offset", "chunk_timestamp"]
    assert took < 0.5

    client.store_offsets("c", {s: 5})
    tail = client.tail(s)
    assert tail == 300
    (offsets, got), took = timed(read, conn, s, 250, tail)
    assert offsets == list(range(250, 300))
    assert got == values[250:300]
    assert took < 5

    # The range ends past the tracking entry (offset 300): it ends once nothing more can come.
    (offsets, got), took = timed(read, conn, s, 250, 301, poll_timeout_ms=20_000)
    assert offsets == list(range(250, 300))
    assert got == values[250:300]
    assert took < 5

    # With more messages after the tracking entry, a range spanning it skips exactly that offset.
    more = bodies("f", 0, 20)
    publish(conn, s, more)
    assert client.tail(s) == 321
    (offsets, got), took = timed(read, conn, s, 295, 306)
    assert offsets == [295, 296, 297, 298, 299, 301, 302, 303, 304, 305]
    assert got == values[295:] + more[:5]
    assert took < 5


# ------------------------------------------------------------------------------- missing stream


def test_missing_stream_raises_stream_not_found(conn, client) -> None:  # type: ignore[no-untyped-def]
    missing = "no-such-stream-" + uuid.uuid4().hex[:10]
    # A reader only runs on a planned range: a stream gone by then is data loss (failOnDataLoss).
    with pytest.raises(DataLossError) as lost:
        read_range(conn, missing, 0, 10, ReadSettings())
    assert f"offsets [0, 10) of stream '{missing}' are lost" in str(lost.value)
    assert "failOnDataLoss" in str(lost.value)
    reader = RangeReader(conn, missing, 0, 10, ReadSettings(fail_on_data_loss=False))
    assert list(reader) == []
    assert reader.lost == [(0, 10)]
    with pytest.raises(StreamNotFoundError) as exc:
        client.tail(missing)
    assert missing in str(exc.value)
    with pytest.raises(StreamNotFoundError) as exc:
        client.partitions(missing)
    assert missing in str(exc.value)
    assert client.stream_exists(missing) is False


# --------------------------------------------------------------------------------- super streams


def test_super_stream_hash_routing(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    assert client.partitions(name) == parts

    n = 1_000
    keys = [f"key-{i}" for i in range(n)]
    values = bodies("h", 0, n)
    producer = StreamProducer(conn, name, superstream=True, settings=WriteSettings(routing_strategy="hash"))
    try:
        assert producer.partitions == parts
        for lo, hi in [(0, 333), (333, 334), (334, 1000)]:
            producer.send([codec.encode(v) for v in values[lo:hi]], routing_keys=keys[lo:hi])
        producer.flush()
    finally:
        producer.close()

    expected: dict[str, list[bytes]] = {p: [] for p in parts}
    for k, v in zip(keys, values, strict=True):
        expected[parts[hash_partition(k, 3)]].append(v)
    assert all(expected.values())  # every partition got some
    tails = client.tails(parts)
    assert tails == {p: len(vs) for p, vs in expected.items()}
    for p in parts:
        offsets, got = read(conn, p, 0, tails[p])
        assert offsets == list(range(tails[p]))
        assert got == expected[p]  # in publishing order within the partition


def test_super_stream_key_routing(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    for i, p in enumerate(parts):
        assert client.route(str(i), name) == [p]
    assert client.route("no-such-key", name) == []

    keys = [str(i % 3) for i in range(30)]
    values = bodies("k", 0, 30)
    producer = StreamProducer(conn, name, superstream=True, settings=WriteSettings(routing_strategy="key"))
    try:
        producer.send([codec.encode(v) for v in values], routing_keys=keys)
        producer.flush()
        with pytest.raises(ConfigurationError) as exc:
            producer.send([codec.encode(b"lost")], routing_keys=["no-such-key"])
        assert "no-such-key" in str(exc.value)
        assert name in str(exc.value)
    finally:
        producer.close()

    for i, p in enumerate(parts):
        want = [v for k, v in zip(keys, values, strict=True) if k == str(i)]
        offsets, got = read(conn, p, 0, client.tail(p))
        assert offsets == list(range(10))
        assert got == want


# ----------------------------------------------------------------------------------- metadata


def test_properties_and_annotations_survive_write_and_read(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    created = [datetime(2024, 5, 17, 8, 30, 15, 123000 + i * 1000, tzinfo=UTC) for i in range(3)]
    messages = [
        codec.encode(
            f"body-{i}".encode(),
            properties={
                "message_id": f"id-{i}",
                "correlation_id": f"corr-{i}",
                "subject": "subj",
                "content_type": "application/json",
                "creation_time": created[i],
            },
            application_properties={"routing_key": "rk", "n": 5, "flag": True},
            message_annotations={"x-opt-a": "b"},
        )
        for i in range(3)
    ]
    messages.append(codec.encode(b"plain"))
    before = datetime.now(UTC).replace(microsecond=0)
    producer = StreamProducer(conn, s, superstream=False, settings=WriteSettings())
    try:
        producer.send(messages)
        producer.flush()
    finally:
        producer.close()
    after = datetime.now(UTC)

    table = read_range(conn, s, 0, 4, ReadSettings(metadata_fields=METADATA_FIELDS))
    assert table.column_names == ["value", "stream", "offset", "chunk_timestamp", *METADATA_FIELDS]
    rows = table.to_pylist()
    for row in rows:
        assert before <= row["chunk_timestamp"] <= after

    def props(i: int) -> dict[str, Any]:
        p: dict[str, Any] = dict.fromkeys(PROPERTY_NAMES)
        p.update(
            message_id=f"id-{i}",
            correlation_id=f"corr-{i}",
            subject="subj",
            content_type="application/json",
            creation_time=created[i],
        )
        return p

    expected = [
        {
            "value": f"body-{i}".encode(),
            "stream": s,
            "offset": i,
            "chunk_timestamp": rows[i]["chunk_timestamp"],
            "properties": props(i),
            "application_properties": [("routing_key", "rk"), ("n", "5"), ("flag", "true")],
            "message_annotations": [("x-opt-a", "b")],
            "creation_time": created[i],
            "routing_key": "rk",
        }
        for i in range(3)
    ]
    expected.append(
        {
            "value": b"plain",
            "stream": s,
            "offset": 3,
            "chunk_timestamp": rows[3]["chunk_timestamp"],
            "properties": None,
            "application_properties": None,
            "message_annotations": None,
            "creation_time": None,
            "routing_key": None,
        }
    )
    assert rows == expected
    assert rows[0]["creation_time"] == rows[0]["properties"]["creation_time"]

    # Only some metadata columns: the same values in canonical order.
    some = read_range(conn, s, 1, 3, ReadSettings(metadata_fields=("routing_key", "creation_time")))
    assert some.column_names == [
        "value",
        "stream",
        "offset",
        "chunk_timestamp",
        "creation_time",
        "routing_key",
    ]
    assert some.column("creation_time").to_pylist() == created[1:3]
    assert some.column("routing_key").to_pylist() == ["rk", "rk"]


# ------------------------------------------------------------------------------------- filtering


def test_filtering_returns_every_matching_message(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    us1, eu, us2 = bodies("us", 0, 200), bodies("eu", 0, 300), bodies("us", 200, 600)
    values = us1 + eu + us2
    filters: list[str | None] = ["us"] * 200 + ["eu"] * 300 + ["us"] * 400
    publish(conn, s, values, sizes=[200, 300, 400], filter_values=filters)
    tail = client.tail(s)
    assert tail == 900

    # Without a filter, every message is there in order.
    assert read(conn, s, 0, tail) == (list(range(900)), values)

    (offsets, got), took = timed(read, conn, s, 0, tail, filter_values=["eu"])
    assert took < 10
    assert offsets == sorted(set(offsets))
    rows = dict(zip(offsets, got, strict=True))
    assert all(rows[200 + i] == eu[i] for i in range(300))  # eu is a subset of the result
    assert all(rows[o] == values[o] for o in offsets)  # false positives are whole, real messages

    (offsets, got), took = timed(read, conn, s, 250, 260, filter_values=["eu"])
    assert (offsets, got) == (list(range(250, 260)), eu[50:60])
    assert took < 10


# ---------------------------------------------------------------------------------- deduplication


def test_named_producer_continues_after_the_last_publishing_id(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    first, second = bodies("a", 0, 120), bodies("b", 0, 80)
    settings = WriteSettings(producer_name="p1")

    p1 = publish(conn, s, first, sizes=[50, 70], settings=settings)
    assert p1 == {s: 120}
    p2 = publish(conn, s, second, settings=settings)
    assert p2 == {s: 200}

    assert client.tail(s) == 200
    assert read(conn, s, 0, 200) == (list(range(200)), first + second)


def test_a_connection_whose_publisher_was_not_deleted_is_not_reused(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    """A writer whose publisher deletion failed (timed out on a loaded machine) closes that
    connection instead of pooling it: the next writer would declare the same publisher id on it and
    the broker refuse with PRECONDITION_FAILED (seen in CI as a failed publish)."""
    s = streams.stream()
    producer = StreamProducer(conn, s, superstream=False, settings=WriteSettings())
    try:
        producer.send([codec.encode(v) for v in bodies("a", 0, 10)])
        producer.flush()
        stuck = producer._publishers[s].client

        async def deletion_times_out(publisher_id: int) -> None:
            raise TimeoutError("delete_publisher timed out")

        stuck.delete_publisher = deletion_times_out  # type: ignore[method-assign]
    finally:
        producer.close()

    publish(conn, s, bodies("b", 0, 10))  # a fresh connection: the same publisher id declares again
    assert read(conn, s, 0, 20) == (list(range(20)), bodies("a", 0, 10) + bodies("b", 0, 10))


# ------------------------------------------------------------------------------------ compression


@pytest.mark.parametrize("compression", ["gzip", "zstd", "lz4", "snappy"])
def test_sub_entry_compression_round_trip(conn, client, streams, compression: str) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    values = [f"{compression}-{i}-".encode() * (1 + i % 7) for i in range(95)]
    settings = WriteSettings(compression=compression, sub_entry_size=10, batch_size=3)
    p = publish(conn, s, values, sizes=[41, 54], settings=settings)
    assert p == {s: 11}  # one publishing id per sub-entry: 41 -> 3+2, 54 -> 3+3
    assert client.tail(s) == 95

    assert read(conn, s, 0, 95) == (list(range(95)), values)
    assert read(conn, s, 13, 57) == (list(range(13, 57)), values[13:57])
    full = read_range(conn, s, 0, 95, ReadSettings(metadata_fields=METADATA_FIELDS))
    assert full.column("offset").to_pylist() == list(range(95))
    assert full.column("value").to_pylist() == values


# ------------------------------------------------------------------------------------- timestamps


def test_tail_of_a_stream_holding_only_tracking_entries(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    """An offset stored on an empty stream is its only chunk: the tail is 0, found at once (the scan
    for a user chunk must see offset-tracking chunks, or it waits for one and times out)."""
    s = streams.stream()
    client.store_offsets("c", {s: 0})
    assert client.stats(s).committed_chunk_id == 0
    tail, took = timed(client.tail, s)
    assert tail == 0 and took < 10


def test_time_bounds_follow_the_broker_clock_and_a_stamp_closes_an_idle_time(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(conn, s, bodies("A", 0, 40))
    time.sleep(1.2)
    t1 = int(time.time() * 1000)
    publish(conn, s, bodies("B", 0, 30))
    time.sleep(1.2)
    t2 = int(time.time() * 1000)  # nothing after it: the broker's clock shows no chunk that late

    first, at_t1, at_t2 = client.time_bounds([s], [0, t1, t2])[s]
    assert (first.offset, first.passed, at_t1.offset, at_t1.passed) == (0, True, 40, True)
    assert (at_t2.offset, at_t2.passed) == (70, False) and at_t2.last_timestamp is not None
    assert at_t1.last_timestamp is not None and at_t2.last_timestamp < t2

    client.stamp_clock([s])  # an offset-tracking entry, timestamped now by the broker: t2 passed
    again = client.time_bounds([s], [t1, t2])[s]
    assert [(b.offset, b.passed) for b in again] == [(40, True), (70, True)]
    assert client.tail(s) == 70  # the stamp holds no message
    publish(conn, s, bodies("C", 0, 5))
    assert client.time_bounds([s], [t2])[s][0].offset == 70  # the same answer once passed
    assert read(conn, s, 70, client.tail(s))[1] == bodies("C", 0, 5)

    empty = streams.stream()
    (bound,) = client.time_bounds([empty], [t2])[empty]
    assert (bound.offset, bound.passed, bound.last_timestamp) == (0, False, None)
    client.stamp_clock([empty])
    (bound,) = client.time_bounds([empty], [t2])[empty]
    assert (bound.offset, bound.passed) == (0, True) and client.tail(empty) == 0
    with pytest.raises(ValueError, match="ascending"):
        client.time_bounds([s], [t2, t1])


def test_offset_for_timestamp(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    a, b = bodies("A", 0, 70), bodies("B", 0, 30)
    publish(conn, s, a, sizes=[40, 30])
    time.sleep(1.2)
    now_ms = int(time.time() * 1000)
    publish(conn, s, b)

    assert client.offset_for_timestamp(s, now_ms) == len(a)
    assert client.offset_for_timestamp(s, 0) == 0
    assert client.offset_for_timestamp(s, now_ms + 3_600_000) == client.tail(s) == len(a) + len(b)


# ------------------------------------------------------------------------------------ poll timeout


def test_range_beyond_the_tail_fails_with_poll_timeout(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(conn, s, bodies("p", 0, 20))
    client.store_offsets("c", {s: 3})  # a tracking entry at offset 20 must not make [0, 30) "complete"
    tail = client.tail(s)
    assert tail == 20

    t0 = time.monotonic()
    with pytest.raises(BrokerTimeoutError) as exc:
        read_range(conn, s, 0, tail + 10, ReadSettings(poll_timeout_ms=1500))
    took = time.monotonic() - t0
    assert 1.4 <= took < 6
    message = str(exc.value)
    assert s in message
    assert "pollTimeoutMs=1500" in message
    assert "stopped at offset 20" in message


def test_range_beyond_the_tail_fails_with_max_wait(conn, client, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(conn, s, bodies("w", 0, 20))

    t0 = time.monotonic()
    with pytest.raises(BrokerTimeoutError) as exc:
        read_range(conn, s, 5, 25, ReadSettings(poll_timeout_ms=60_000, max_wait_ms=1200))
    took = time.monotonic() - t0
    assert 1.1 <= took < 6
    message = str(exc.value)
    assert s in message
    assert "maxWaitMs=1200" in message
    assert "stopped at offset 20" in message


# ------------------------------------------------------------------------------------ credentials


def test_wrong_password_raises_authentication_error_without_the_secret(
    broker: BrokerSettings, streams
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    secret = "wrong-secret-pw"
    conn = parse_connection_options(
        {
            "endpoints": f"{broker.host}:{broker.port}",
            "username": broker.username,
            "password": secret,
            "vhost": broker.vhost,
        }
    )
    assert secret not in repr(conn)
    assert secret not in str(conn)
    with pytest.raises(AuthenticationError) as exc:
        BrokerClient(conn).tail(s)
    assert secret not in str(exc.value)
    assert secret not in repr(exc.value)
    assert broker.username in str(exc.value)


def test_failed_confirms_fail_the_producer(conn: ConnectionOptions, streams) -> None:  # type: ignore[no-untyped-def]
    """A stream deleted under a producer: negative confirms or the broker's metadata update fail it fast."""
    s = streams.stream()
    msgs = [codec.encode_body(b"x" * 100)] * 20_000
    threading.Timer(0.3, lambda: BrokerClient(conn).delete_stream(s)).start()
    started = time.monotonic()
    with (
        pytest.raises(PublishError, match=s),
        StreamProducer(conn, s, superstream=False, settings=WriteSettings(max_in_flight=2000)) as p,
    ):
        for _ in range(500):
            p.send(msgs)
        p.flush()
    assert time.monotonic() - started < 8


class LoopbackResolver:
    """Test resolver: every address goes to the local broker's stream port."""

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        return ("127.0.0.1", 5552 if host == "broker.invalid" else port)


def test_address_resolver_class(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    conn = parse_connection_options(
        {
            **broker.spark_options,
            "endpoints": "broker.invalid:1234",
            "addressResolverClass": f"{__name__}.LoopbackResolver",
        }
    )
    if broker.external:
        pytest.skip("the resolver maps to the local broker")
    assert BrokerClient(conn).tail(s) == 0
    bad = parse_connection_options({**broker.spark_options, "addressResolverClass": "no.such.Resolver"})
    with pytest.raises(ConfigurationError, match="addressResolverClass"):
        BrokerClient(bad).tail(s)
