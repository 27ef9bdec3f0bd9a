"""Publish frames and sub-entry batches (`broker/frames.py`, `chunks.py`): what the writer sends
reads back through the reader's chunk parsing, for every compression."""

from __future__ import annotations

import struct

import pytest

from pyspark_rmqs.broker import frames
from pyspark_rmqs.core.chunks import COMPRESSION_CODES, chunk_records
from pyspark_rmqs.core.codec import encode_body

MESSAGES = [encode_body(b"m%d" % i * (i + 1)) for i in range(7)]


@pytest.mark.parametrize("compression", sorted(COMPRESSION_CODES))
def test_sub_entries_read_back_as_the_messages(compression: str) -> None:
    entries = frames.sub_entries(MESSAGES, 3, compression)
    assert [n for _, n in entries] == [3, 3, 1]
    chunk = b"".join(e for e, _ in entries)
    assert [bytes(r) for r in chunk_records(chunk, len(entries))] == MESSAGES


def test_publish_frame_numbers_messages_from_the_first_id() -> None:
    frame = frames.publish_frame(3, 100, MESSAGES[:2], None)
    length, key, version, pub, count = struct.unpack_from(">IHHBi", frame)
    assert (length + 4, key, version, pub, count) == (len(frame), 2, 1, 3, 2)
    assert sum(frames.entry_sizes(MESSAGES[:2], None)) == len(frame) - frames.FRAME_HEADER
    first_id, size = struct.unpack_from(">QI", frame, frames.FRAME_HEADER)
    assert (first_id, size) == (100, len(MESSAGES[0]))


def test_filtered_publish_frame_is_version_2_and_sized_as_planned() -> None:
    filters = ["eu", None]
    frame = frames.publish_frame(0, 1, MESSAGES[:2], filters)
    assert struct.unpack_from(">H", frame, 6)[0] == 2
    assert sum(frames.entry_sizes(MESSAGES[:2], filters)) == len(frame) - frames.FRAME_HEADER


def test_sub_entry_frame_numbers_batches() -> None:
    entries = frames.sub_entries(MESSAGES, 4, "gzip")
    frame = frames.sub_entry_frame(1, 10, [e for e, _ in entries])
    assert sum(frames.sub_entry_sizes(entries)) == len(frame) - frames.FRAME_HEADER
    assert struct.unpack_from(">Q", frame, frames.FRAME_HEADER)[0] == 10
