"""The one message encoder (`batches.encode_row`): the Spark sink's rows and `produce.publish`'s dicts."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from pyspark_rmqs.core import codec
from pyspark_rmqs.core.batches import MessageEncoder, encode_row
from pyspark_rmqs.core.errors import DataError
from pyspark_rmqs.runs.produce import encode_message

ROW = {
    "value": b"v",
    "routing_key": "k1",
    "properties": {"message_id": "m1"},
    "application_properties": {"region": "eu"},
    "message_annotations": {"x-a": "1"},
}


def test_sink_rows_and_produce_dicts_encode_alike() -> None:
    batch = pa.RecordBatch.from_pylist([ROW])
    msgs, keys, filters = MessageEncoder(batch.schema.names, filter_value_path="routing_key").encode(batch)
    assert msgs == [encode_row(ROW, "row 0")] == [encode_message(ROW)[0]]
    assert keys == ["k1"] and filters == ["k1"]
    d = codec.decode(memoryview(msgs[0]))
    assert d.application_properties == {"region": "eu", "routing_key": "k1"}


def test_value_only_is_one_data_section() -> None:
    batch = pa.RecordBatch.from_pylist([{"value": b"a"}, {"value": "b"}])
    msgs, keys, _ = MessageEncoder(["value"]).encode(batch)
    assert msgs == [codec.encode_body(b"a"), codec.encode_body(b"b")] and keys is None
    assert encode_message("b") == (codec.encode_body(b"b"), None)


def test_creation_time_column_becomes_the_property() -> None:
    at = datetime(2024, 1, 2, tzinfo=UTC)
    d = codec.decode(memoryview(encode_row({"value": b"x", "creation_time": at}, "row 0")))
    assert d.properties is not None and d.properties[9] == codec.to_millis(at)


def test_null_value_names_the_row_across_batches() -> None:
    enc = MessageEncoder(["value"])
    enc.encode(pa.RecordBatch.from_pylist([{"value": b"a"}]))
    with pytest.raises(DataError, match=r"row 2 of this task has a null 'value'"):
        enc.encode(pa.RecordBatch.from_pylist([{"value": b"b"}, {"value": None}]))
