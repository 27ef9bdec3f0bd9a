"""The sink's body-only encoder has two paths that must publish the same bytes: `encode_bodies`
(vectorised, with numpy: one header array per batch) and `codec.encode_body` row by row (without)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rmqs.core import chunks, codec
from pyspark_rmqs.core.batches import MessageEncoder, encode_bodies
from pyspark_rmqs.core.errors import DataError

BODIES = st.lists(
    st.one_of(st.binary(max_size=300), st.binary(min_size=250, max_size=70_000)), min_size=0, max_size=40
)


def encode_with(batch: pa.RecordBatch, vectorised: bool) -> list[bytes]:
    old = chunks.VECTORISED
    chunks.VECTORISED = vectorised
    try:
        return MessageEncoder(batch.schema.names).encode(batch)[0]
    finally:
        chunks.VECTORISED = old


@settings(max_examples=200, deadline=None)
@given(BODIES, st.sampled_from(["binary", "string", "large_binary", "large_string"]), st.integers(0, 5))
def test_both_paths_publish_the_same_messages(bodies: list[bytes], kind: str, cut: int) -> None:
    if kind.endswith("string"):
        bodies = [b.decode("latin-1").encode("utf-8") for b in bodies]  # valid UTF-8 of any length
        column = pa.array([b.decode("utf-8") for b in bodies], getattr(pa, kind)())
    else:
        column = pa.array(bodies, getattr(pa, kind)())
    batch = pa.record_batch([column], names=["value"]).slice(min(cut, len(bodies)))  # sliced batches too
    expected = [codec.encode_body(b) for b in bodies[min(cut, len(bodies)) :]]
    assert encode_with(batch, vectorised=True) == expected
    assert encode_with(batch, vectorised=False) == expected


def test_the_vbin8_vbin32_boundary() -> None:
    for n in (0, 1, 254, 255, 256, 257, 65_536):
        body = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
        assert encode_bodies(pa.array([body], pa.binary())) == [codec.encode_body(body)]


def test_a_null_value_names_its_row_on_both_paths() -> None:
    batch = pa.record_batch([pa.array([b"a", None, b"c"], pa.binary())], names=["value"])
    for vectorised in (True, False):
        with pytest.raises(DataError, match="row 1 of this task has a null 'value'"):
            encode_with(batch, vectorised)
