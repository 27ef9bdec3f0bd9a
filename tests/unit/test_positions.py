"""`planning.resolve_positions`: the one resolver of read positions (Spark readers and orchestration)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pyspark_rmqs.broker.positions import (
    Bounds,
    ending_offsets,
    resolve_positions,
    source_position,
    starting_offsets,
)
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.offsets import EARLIEST, LATEST
from pyspark_rmqs.options import parse_source_options

B = Bounds(first={"o-0": 10, "o-1": 0}, tail={"o-0": 100, "o-1": 50})


class _Timestamps:
    """Answers offset_for_timestamp as a broker would for chunks one per millisecond from offset 0."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def offset_for_timestamp(self, stream: str, ms: int) -> int:
        self.asked.append((stream, ms))
        return min(ms, B.tail[stream])


def test_named_positions() -> None:
    assert resolve_positions(None, B, "earliest", is_end=False) == {"o-0": 10, "o-1": 0}
    assert resolve_positions(None, B, "latest", is_end=False) == {"o-0": 100, "o-1": 50}
    assert resolve_positions(None, B, "latest", is_end=True) == {"o-0": 100, "o-1": 50}


def test_offsets_maps_and_json_fill_unnamed_streams_by_side() -> None:
    assert resolve_positions(None, B, {"o-0": 42}, is_end=False) == {"o-0": 42, "o-1": 0}
    assert resolve_positions(None, B, {"o-0": 42}, is_end=True) == {"o-0": 42, "o-1": 50}
    assert resolve_positions(None, B, {"o-0": LATEST, "o-1": EARLIEST}, is_end=False) == {
        "o-0": 100,
        "o-1": 0,
    }
    assert resolve_positions(None, B, '{"o-1": 7}', is_end=False) == {"o-0": 10, "o-1": 7}


def test_watermark_is_stored_plus_one_or_the_fallback() -> None:
    stored = {"o-0": 41, "o-1": None}
    assert resolve_positions(None, B, "watermark", is_end=False, stored=stored) == {"o-0": 42, "o-1": 0}
    got = resolve_positions(None, B, "watermark", is_end=False, stored=stored, fallback="latest")
    assert got == {"o-0": 42, "o-1": 50}
    with pytest.raises(ConfigurationError, match="needs a consumer_name"):
        resolve_positions(None, B, "watermark", is_end=False)
    with pytest.raises(ConfigurationError, match="end must be 'latest'"):
        resolve_positions(None, B, "watermark", is_end=True, stored=stored)


def test_timestamps_ask_the_broker_per_stream() -> None:
    ts = _Timestamps()
    at = datetime(1970, 1, 1, 0, 0, 0, 30_000, tzinfo=UTC)  # 30 ms
    assert resolve_positions(ts, B, at, is_end=False) == {"o-0": 30, "o-1": 30}  # type: ignore[arg-type]
    assert resolve_positions(ts, B, 70, is_end=True) == {"o-0": 70, "o-1": 50}  # type: ignore[arg-type]
    assert ts.asked == [("o-0", 30), ("o-1", 30), ("o-0", 70), ("o-1", 70)]
    with pytest.raises(ConfigurationError, match="cannot be a timestamp"):
        resolve_positions(None, B, 70, is_end=True)


def test_bad_positions_name_what_is_valid() -> None:
    with pytest.raises(ConfigurationError, match="start must be 'watermark', 'earliest', 'latest'"):
        resolve_positions(None, B, "soon", is_end=False)


def test_spark_options_resolve_through_the_same_resolver() -> None:
    base = {"endpoints": "localhost:5552", "superstream": "o"}
    opts = parse_source_options(
        {**base, "startingOffsets": "offset", "startingOffset": "20"}, streaming=False
    )
    assert source_position(opts, B.tail, is_end=False) == {"o-0": 20, "o-1": 20}
    assert starting_offsets(None, opts, B) == {"o-0": 20, "o-1": 20}  # type: ignore[arg-type]
    opts = parse_source_options({**base, "endingOffsets": '{"o-0": 500, "o-1": 5}'}, streaming=False)
    assert ending_offsets(opts, B) == {"o-0": 100, "o-1": 5}  # never beyond the tail
    opts = parse_source_options({**base, "startingOffsets": "latest"}, streaming=False)
    assert starting_offsets(None, opts, B) == {"o-0": 100, "o-1": 50}  # type: ignore[arg-type]


class _Oldest:
    """Answers oldest_chunks as a broker would: retention removed [0, 10) of o-0; what is left starts
    with a chunk written at 500 ms."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def oldest_chunks(self, streams: list[str]) -> dict[str, tuple[int, int] | None]:
        self.asked.append(list(streams))
        return {s: (10, 500) for s in streams}


def test_a_timestamp_start_before_the_oldest_chunk_of_a_truncated_stream_is_data_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pyspark_rmqs.broker.positions import timestamp_start_loss
    from pyspark_rmqs.core.errors import DataLossError

    old = _Oldest()
    with pytest.raises(DataLossError, match=r"offsets \[0, 10\) of stream 'o-0' are lost .* \(499 ms\)"):
        timestamp_start_loss(old, B, 499, True)  # type: ignore[arg-type]
    assert old.asked == [["o-0"]]  # o-1 lost nothing to retention: no probe
    assert timestamp_start_loss(old, B, 499, False) == {"o-0": [0, 10]}  # type: ignore[arg-type]
    assert "failOnDataLoss=false" in caplog.text and "(500 ms)" in caplog.text
    at = datetime(1970, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)  # the oldest chunk's own time: nothing lost
    assert timestamp_start_loss(old, B, at, True) == {}  # type: ignore[arg-type]
    assert timestamp_start_loss(old, B, 501, True) == {}  # type: ignore[arg-type]
    asked = len(old.asked)
    for pos in ("earliest", {"o-0": 0}, '{"o-0": 0}'):  # not times: nothing to check, nothing asked
        assert timestamp_start_loss(old, B, pos, True) == {}  # type: ignore[arg-type]
    assert len(old.asked) == asked


class _NoBroker:
    """A client any call to which fails the test: the check must not ask the broker."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the broker was asked ({name}) for an end that is not a time")


@pytest.mark.parametrize("end", ["latest", {"o-0": 5}, '{"o-0": 5}'])
def test_an_end_that_is_no_time_is_never_checked_against_the_broker_clock(end: object) -> None:
    from pyspark_rmqs.broker.positions import check_time_end

    check_time_end(_NoBroker(), ["o-0"], end, datetime.now(UTC))  # type: ignore[arg-type]
