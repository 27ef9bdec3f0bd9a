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
