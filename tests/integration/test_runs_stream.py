"""The run records stream `rmqs.runs` against the real broker (issue 47): finding a consumer's newest
record reads no record of another consumer, whatever the virtual host's history, and the stream is
bounded by the retention rmqs creates it with (docs/permissions.md, "The `rmqs.runs` stream")."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode_body
from pyspark_rmqs.runs import record
from tests.support import broker as tb
from tests.support.data import conn_of


@pytest.fixture
def runs_stream(broker: tb.BrokerSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A stream of its own standing for `rmqs.runs`, created by `record.ensure_stream` as rmqs
    creates the real one (the virtual host's own is left alone)."""
    name = tb.unique_name("rmqs-runs")
    monkeypatch.setattr(record, "RUNS_STREAM", name)
    monkeypatch.setattr(record, "_ready", set())
    record.ensure_stream(conn_of(broker))
    yield name
    BrokerClient(conn_of(broker)).delete_stream(name)


def _body(consumer: str, i: int) -> bytes:
    """A record as runs write it (the fields `read_latest`'s match and `from_json` look at)."""
    return json.dumps(
        {"consumer": consumer, "target": "orders", "state": "stored", "ranges": {"orders": [i, i + 10]},
         "incarnations": {"orders": 1}, "seen": {"orders": i - 1}, "token": f"t{i}", "run_id": f"r{i}",
         "superstream": False, "pipeline": None, "attempt": 0, "started_at": time.time(),
         "updated_at": time.time(), "v": 1},
        sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip


def _others(conn: Any, stream: str, count: int, start: int) -> None:
    """`count` records of 50 other consumers, in chunks of 100 (as many runs' records land)."""
    with StreamProducer(conn, stream, superstream=False, settings=WriteSettings()) as p:
        for lo in range(start, start + count, 100):
            p.send(
                [encode_body(_body(f"other-{i % 50}", i)) for i in range(lo, min(lo + 100, start + count))]
            )
            p.flush()


def test_a_consumers_newest_record_is_found_without_reading_other_consumers_records(
    broker: tb.BrokerSettings, runs_stream: str
) -> None:
    """10,000 records of other consumers before the consumer's newest record and 10,000 after it:
    the lookup (`record.latest_body`: the consumer's pointer, then the first of its records at or
    after it) looks at one record, its own; the cost does not depend on how many runs the virtual
    host made."""
    conn = conn_of(broker)
    key = record.run_key("mine", "orders")
    _others(conn, runs_stream, 10_000, 0)
    record.write_body(conn, key, _body("mine", 0))
    mine = record.write_body(conn, key, _body("mine", 10))  # its newest: the pointer moves to it
    _others(conn, runs_stream, 10_000, 10_000)
    looked_at: list[bytes] = []
    match = record._is_record_of("mine", "orders")

    def counted(body: bytes) -> bool:
        looked_at.append(body)
        return bool(match(body))

    body, pointer = record.read_latest(conn, key, counted)
    assert pointer == mine and body is not None and json.loads(body)["token"] == "t10"
    assert len(looked_at) == 1, len(looked_at)
    assert BrokerClient(conn).tail(runs_stream) >= 20_002


def test_the_runs_stream_is_created_with_the_retention_the_docs_state(
    broker: tb.BrokerSettings, runs_stream: str
) -> None:
    """The newest 1 GB in 16 MB segments (`max-length-bytes`): the bound docs/permissions.md states."""
    queue = tb.management("GET", f"queues/%2F/{urllib.parse.quote(runs_stream, safe='')}")
    arguments = queue["arguments"]
    assert (
        arguments["x-max-length-bytes"] == 1_000_000_000 == record.RUNS_STREAM_ARGUMENTS["max-length-bytes"]
    )
    assert arguments["x-stream-max-segment-size-bytes"] == 16_000_000
    assert arguments["x-queue-type"] == "stream"


def test_a_consumer_whose_record_retention_removed_runs_from_its_watermark(broker: tb.BrokerSettings) -> None:
    """Found by hand (2026-12-06): once retention removed a consumer's newest record from `rmqs.runs`
    while its pointer was still stored (until the broker's next segment roll drops it), looking the
    record up read on to the stream's last chunk for a match, was delivered only user chunks, and
    took the silence after the last one (the last chunk is a pointer, a tracking chunk) for a broker
    that did not answer: every run of the consumer failed with a retryable `BrokerTimeoutError`
    (138 other runs sufficed in a 200 KB stream). Now the record is gone and the run plans from the
    consumer's watermark, as docs/permissions.md says: every offset published since, once; and a
    consumer that never stored one (its only run found its stream empty) plans as one that never
    ran, from `startingOffsets` ("latest": what arrived meanwhile is not its)."""
    from dataclasses import replace

    from pyspark_rmqs.consume import run_consume
    from pyspark_rmqs.jobs import plan_read
    from tests.support.data import publish
    from tests.support.permissions import fresh_vhost

    with fresh_vhost(broker) as vhost:
        b = replace(broker, vhost=vhost)
        conn, offsets = conn_of(b), {"s": list[int](), "empty": list[int]()}
        c = BrokerClient(conn)
        c.create_stream(
            record.RUNS_STREAM, {"max-length-bytes": 60_000, "stream-max-segment-size-bytes": 15_000}
        )
        c.create_stream("s")
        c.create_stream("empty")

        def run(stream: str, start: str) -> None:
            plan = plan_read(conn, stream=stream, consumer="etl", starting_offsets=start)
            run_consume(conn, plan, lambda batch: offsets[stream].extend(batch.column("offset").to_pylist()))

        publish(b, "s", [f"a{i}".encode() for i in range(30)])
        run("s", "earliest")
        run("empty", "latest")
        key = record.run_key("etl", "s")
        filled = 0
        while True:  # other writers until retention passed the pointer, while it is still stored
            pointer = c.stored_offset(key, record.RUNS_STREAM)
            assert pointer is not None, "the pointer was dropped before retention passed it"
            if pointer < c.first_offset(record.RUNS_STREAM):
                break
            _others(conn, record.RUNS_STREAM, 20, filled)
            filled += 20
            assert filled < 5_000
        assert record.latest(conn, "etl", "s") is None  # before: BrokerTimeoutError, every time
        publish(b, "s", [f"b{i}".encode() for i in range(20)])
        publish(b, "empty", [f"c{i}".encode() for i in range(10)])
        run("s", "earliest")
        run("empty", "latest")
        assert offsets["s"] == list(range(30)) + list(range(c.tail("s") - 20, c.tail("s")))
        assert c.stored_offset("etl", "s") == c.tail("s") - 1
        assert offsets["empty"] == [] and c.stored_offset("etl", "empty") == c.tail("empty") - 1


def test_a_produce_retry_whose_record_retention_removed_is_a_new_run_and_says_so(
    broker: tb.BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the protocol campaign's `evict_records` work (2026-12-06): a produce run's record is
    what numbers its retry's messages as its first try's. Once retention removed it from `rmqs.runs`
    (between the tries), the retry is numbered as a new run: the 8 messages the failed try stored are
    stored again, at-least-once, as docs/failure-semantics.md says of a retry after 16 later runs.
    Nothing can tell the retry its first try's publishing ids then; the run says so in a warning
    (the broker holds messages of the name, and the name has no record), not silently."""
    from dataclasses import replace

    from pyspark_rmqs.runs import producer as producer_runs
    from pyspark_rmqs.runs.produce import run_produce
    from tests.support.permissions import fresh_vhost

    with fresh_vhost(broker) as vhost:
        conn = conn_of(replace(broker, vhost=vhost))
        c = BrokerClient(conn)
        c.create_stream(
            record.RUNS_STREAM, {"max-length-bytes": 60_000, "stream-max-segment-size-bytes": 15_000}
        )
        c.create_stream("s")
        settings = WriteSettings(producer_name="p1")

        def messages(fail: bool) -> Iterator[bytes]:
            for i in range(20):
                if fail and i == 10:
                    raise RuntimeError("the producer function failed (injected)")
                yield f"m{i}".encode()

        with pytest.raises(RuntimeError):
            run_produce(conn, messages(True), stream="s", settings=settings, run_identity="r1", batch=4)
        stored = c.tail("s")
        assert stored == 8  # two batches of 4 confirmed before the failure
        key = producer_runs.producer_key("p1", "s")
        pointer = c.stored_offset(key, record.RUNS_STREAM)
        assert pointer is not None and producer_runs.latest(conn, "p1", "s") is not None
        filled = 0
        while c.first_offset(record.RUNS_STREAM) <= pointer:  # other runs' records, until retention passed it
            _others(conn, record.RUNS_STREAM, 20, filled)
            filled += 20
            assert filled < 5_000
        assert producer_runs.latest(conn, "p1", "s") is None
        caplog.set_level("WARNING", logger="pyspark_rmqs.runs.producer")
        done = run_produce(conn, messages(False), stream="s", settings=settings, run_identity="r1", batch=4)
        assert not done.resumed and c.tail("s") == stored + 20  # the 8 stored again: at-least-once
        assert any("has no record" in r.getMessage() and "'r1'" in r.getMessage() for r in caplog.records)
