"""Watermarks (tail, stored offset, lag) against the real broker, sync and async."""

from __future__ import annotations

import asyncio

import pytest

from pyspark_rmqs.core.errors import StreamNotFoundError
from pyspark_rmqs.runs.watermarks import awatermarks, store_watermarks, watermarks, watermarks_after
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish


def test_stream_watermark_lifecycle(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    conn = conn_of(broker)
    publish(broker, s, [b"x"] * 100)
    w = watermarks(conn, "etl", stream=s)
    [p] = w.partitions
    assert (p.first, p.tail, p.stored, p.next_offset, p.lag) == (0, 100, None, 0, 100)
    assert w.pending() == {s: (0, 100)}
    store_watermarks(conn, "etl", watermarks_after(w.pending()))
    w = watermarks(conn, "etl", stream=s)
    assert (w.partitions[0].stored, w.total_lag, w.pending()) == (99, 0, {})
    publish(broker, s, [b"y"] * 20)  # offset 100 is the tracking entry written by the store
    w = watermarks(conn, "etl", stream=s)
    assert w.partitions[0].tail == 121
    assert w.pending() == {s: (100, 121)}  # reading [100, 121) yields exactly the 20 new messages


def test_super_stream_watermarks_async(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    conn = conn_of(broker)
    for i, p in enumerate(parts):
        publish(broker, p, [b"m"] * (10 * (i + 1)))
    store_watermarks(conn, "dash", {parts[0]: 9, parts[1]: 4})
    w = asyncio.run(awatermarks(conn, "dash", superstream=name))
    assert [(p.stream, p.stored, p.lag) for p in w.partitions] == [
        (parts[0], 9, 0),
        (parts[1], 4, 15),
        (parts[2], None, 30),
    ]
    assert w.total_lag == 45
    assert w.to_dict()["partitions"][1]["next_offset"] == 5


def test_missing_stream(broker: BrokerSettings) -> None:
    with pytest.raises(StreamNotFoundError, match="'nope-123'"):
        watermarks(conn_of(broker), "c", stream="nope-123")
