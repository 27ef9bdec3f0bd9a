"""The fixed columns' two paths give the same batches: record positions plus a vectorised check and
gather per batch (`chunks.VECTORISED`, with numpy) and `chunk_bodies` record by record (without)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rmqs.core import chunks
from pyspark_rmqs.core.batches import BatchBuilder
from pyspark_rmqs.core.chunks import sub_entry
from pyspark_rmqs.core.codec import encode
from pyspark_rmqs.core.errors import DataError

REPO = Path(__file__).resolve().parents[2]


def entry(m: bytes) -> bytes:
    return struct.pack(">I", len(m)) + m


def data32(body: bytes) -> bytes:
    return b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


RECORDS = st.one_of(
    st.binary(max_size=300).map(encode),  # one small data section: the vectorised case
    st.binary(max_size=300).map(encode),
    st.binary(min_size=256, max_size=400).map(data32),  # one large data section
    st.binary(max_size=40),  # anything else: invalid AMQP, truncated sections, empty records
    st.binary(max_size=30).map(lambda b: encode(b, {"subject": "s"}, {"k": "v"})),
)


def chunk_of(records: list[bytes], sub_entries: bool) -> tuple[bytes, int]:
    if not sub_entries or len(records) < 3:
        return b"".join(entry(m) for m in records), len(records)
    return entry(records[0]) + sub_entry(records[1:3], 0) + b"".join(entry(m) for m in records[3:]), (
        len(records) - 1
    )


def build(
    chunk_list: list[tuple[bytes, int, int, int]], vectorised: bool, batch_rows: int
) -> list[pa.RecordBatch]:
    old = chunks.VECTORISED
    chunks.VECTORISED = vectorised
    try:
        b = BatchBuilder("s", ())
        out = []
        offset = 0
        for data, entries, skip, take in chunk_list:
            b.add_chunk(data, entries, skip, take, offset + skip, 1000)
            offset += 1000
            if b.rows >= batch_rows:
                out.append(b.flush())
        last = b.flush()
        return [*out, last] if last is not None else out
    finally:
        chunks.VECTORISED = old


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(RECORDS, min_size=1, max_size=12), st.booleans(), st.integers(0, 12), st.integers(0, 12)
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 20),
)
def test_both_paths_give_the_same_batches(
    spec: list[tuple[list[bytes], bool, int, int]], batch_rows: int
) -> None:
    chunk_list = []
    for records, subs, skip, take in spec:
        data, entries = chunk_of(records, subs)
        skip = min(skip, len(records))
        chunk_list.append((data, entries, skip, min(take, len(records) - skip)))
    fast = build(chunk_list, True, batch_rows)
    slow = build(chunk_list, False, batch_rows)
    assert [b.to_pydict() for b in fast] == [b.to_pydict() for b in slow]


def test_the_vectorised_gather_is_used_and_exact() -> None:
    pytest.importorskip("numpy")
    bodies = [bytes([i]) * i for i in range(200)]
    data = b"".join(entry(encode(b)) for b in bodies)
    assert chunks.body_spans(data, 3, 5) is not None
    got = chunks.bodies_array(
        [(data, chunks.body_spans(data, 0, 200)), (data, chunks.body_spans(data, 7, 3))]
    )
    assert got.type == pa.binary() and got.to_pylist() == bodies + bodies[7:10]


@pytest.mark.parametrize("vectorised_path", [True, False])
def test_a_corrupt_chunk_fails_both_ways(vectorised_path: bool) -> None:
    data = entry(encode(b"ok")) + struct.pack(">I", 50) + b"short"
    with pytest.raises(DataError, match="cannot read the chunk"):
        build([(data, 2, 0, 2)], vectorised_path, 10)
    flagged = chunks.CorruptChunkData(entry(encode(b"ok")), "CRC-32 mismatch")
    with pytest.raises(DataError, match="CRC-32"):
        build([(flagged, 1, 0, 1)], vectorised_path, 10)


@given(st.lists(st.binary(max_size=50), max_size=30))
def test_binary_array_is_pa_array(values: list[bytes]) -> None:
    want = pa.array(values, pa.binary())
    numpy = chunks._np
    try:
        for np_module in (numpy, None):  # with numpy's running sum and without
            chunks._np = np_module
            got = chunks.binary_array(values)
            assert got.type == pa.binary() and got.equals(want)
    finally:
        chunks._np = numpy


def test_the_fixed_columns_import_no_pandas() -> None:
    """pyarrow imports pandas (0.6-0.7 s) on a process's first `pa.array`: a batch of the fixed
    columns, on either path, is built from buffers, so a task or a Spark Python worker never pays it."""
    code = """
import sys
from tests.unit.test_vectorised_bodies import build, chunk_of
from pyspark_rmqs.core.codec import encode
assert "pandas" not in sys.modules, "imported before the read"
simple, n = chunk_of([encode(b"a" * 10), encode(b"b" * 20)], False)  # the vectorised gather
other, m = chunk_of([encode(b"c" * 300), b"not amqp"], False)  # record by record
for vectorised in (True, False):
    for chunk_list in ([(simple, n, 0, n)], [(other, m, 0, m)], [(simple, n, 0, n), (other, m, 0, m)]):
        (batch,) = build(chunk_list, vectorised, 100)
        assert batch.num_rows == sum(x[3] for x in chunk_list)
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
