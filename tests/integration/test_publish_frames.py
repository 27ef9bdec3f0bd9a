"""Publish frames sized by bytes against the negotiated frame_max, on a real broker.

The broker's own limit (`stream.frame_max`, 1 MiB by default) cannot be lowered here without a
second broker; the negotiated limit is the smaller of the client's and the broker's, so these tests
connect with a client that asks for 64 KiB in the handshake.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_rmqs.broker import connect as connect_module
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core import codec
from pyspark_rmqs.core.errors import DataError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

SMALL_FRAME_MAX = 64 * 1024


class SameAddress:
    """An address resolver that changes nothing: it only gives these connections a pool of their own."""

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        return host, port


class _SmallFrameClient(RmqsClient):
    def __init__(self, host: str, port: int, **kw: Any) -> None:
        kw["frame_max"] = SMALL_FRAME_MAX
        super().__init__(host, port, **kw)


@pytest.fixture
def small_frames(broker: BrokerSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectionOptions]:
    """Connection options whose connections negotiate a 64 KiB frame_max."""
    monkeypatch.setattr(connect_module, "RmqsClient", _SmallFrameClient)
    yield parse_connection_options(
        {**broker.spark_options, "addressResolverClass": f"{__name__}.SameAddress"}
    )


def _bodies(n: int, size: int) -> list[bytes]:
    return [f"{i:06d}".encode() + os.urandom(size - 6) for i in range(n)]


@pytest.mark.parametrize(
    ("settings", "filtered"),
    [
        (WriteSettings(), False),
        (WriteSettings(), True),
        (WriteSettings(sub_entry_size=10), False),  # random bodies: compression could not shrink them
    ],
    ids=["plain", "filter-values", "sub-entries"],
)
def test_frames_are_split_to_fit_the_negotiated_frame_max(
    small_frames: ConnectionOptions, broker: BrokerSettings, streams, settings: WriteSettings, filtered: bool
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fm")
    bodies = _bodies(1000, 1024)  # ~1 MiB in one send(): two frames of 500 without byte sizing
    filters = [f"f{i % 3}" for i in range(len(bodies))] if filtered else None
    with StreamProducer(small_frames, s, superstream=False, settings=settings) as p:
        p.send([codec.encode_body(b) for b in bodies], filter_values=filters)
        p.flush()
        frames, largest = p.frame_stats()[s]
    assert largest <= SMALL_FRAME_MAX
    assert frames >= len(bodies) * 1024 // SMALL_FRAME_MAX + 1, f"{frames} frames for ~1 MiB"
    assert read_range(conn_of(broker), s, 0, client(broker).tail(s)).column("value").to_pylist() == bodies


def test_a_message_larger_than_the_frame_max_fails_naming_row_size_and_limit(
    small_frames: ConnectionOptions, broker: BrokerSettings, streams
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fm")
    small = _bodies(3, 1024)
    big = codec.encode_body(b"x" * 200 * 1024)
    with (
        StreamProducer(small_frames, s, superstream=False, settings=WriteSettings()) as p,
        pytest.raises(DataError) as failed,
    ):
        p.send([codec.encode_body(b) for b in small])
        p.send([codec.encode_body(small[0]), big])  # rows 3 and 4 of the task
    text = str(failed.value)
    assert f"row 4 of this task: a message of {len(big)} bytes does not fit" in text
    assert f"{SMALL_FRAME_MAX} bytes" in text and s in text
