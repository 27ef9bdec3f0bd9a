"""Publish frames: messages -> the bytes of Publish commands, sized by the negotiated frame_max.

A frame holds at most `batch_size` entries and at most the frame_max the connection negotiated
(`plan_frames`). Entries are messages (Publish v1), messages with a filter value (v2), or sub-entry
batches (`chunks.sub_entry`, compressed as the Java client writes them), each after its publishing
id. A message that fits no frame fails with `DataError` where the limit holds (`check_fits`); the
connection sends and confirms the frames (`writer.py`). Chunk entries read back are `chunks.py`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from typing import Any

from pyspark_rmqs.broker.client import parse_version
from pyspark_rmqs.core.chunks import COMPRESSION_CODES, sub_entry
from pyspark_rmqs.core.errors import DataError

log = logging.getLogger(__name__)

_PUBLISH = struct.Struct(">IHHBi")  # length, key, version, publisher id, count
_MSG = struct.Struct(">QI")
_MSG_FILTERED = struct.Struct(">Qh")
_PUBLISHING_ID = struct.Struct(">Q")
FRAME_HEADER = _PUBLISH.size  # a publish frame's bytes besides its entries, length prefix included
# RabbitMQ closes a connection that sends a frame over the negotiated frame_max from 4.3.5 on
# (rabbitmq-community/rstream#274); 4.0 accepts it (tests/integration/test_publish_frames.py).
ENFORCES_FRAME_MAX = (4, 3, 5)

_warned_oversized = False


def plan_frames(sizes: Sequence[int], max_entries: int, max_bytes: int) -> list[tuple[int, int]]:
    """Split entries of these sizes into consecutive frames [start, end): at most `max_entries`
    entries and `max_bytes` bytes each. An entry larger than `max_bytes` gets a frame of its own:
    the caller decides whether it may be sent."""
    frames: list[tuple[int, int]] = []
    start = used = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_entries or used + size > max_bytes):
            frames.append((start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        frames.append((start, len(sizes)))
    return frames


def entry_sizes(messages: Sequence[bytes], filters: Sequence[str | None] | None) -> list[int]:
    """Bytes of each message in a publish frame: id, (filter value,) length and body."""
    if filters is None:
        return [_MSG.size + len(m) for m in messages]
    return [
        _MSG_FILTERED.size + (len(f.encode("utf-8")) if f is not None else 0) + 4 + len(m)
        for m, f in zip(messages, filters, strict=True)
    ]


def publish_frame(
    publisher_id: int, first_id: int, messages: Sequence[bytes], filters: Sequence[str | None] | None
) -> bytes:
    """A Publish frame of `messages` with publishing ids `first_id`, +1, ... (v2 with filter values)."""
    pid = first_id
    buf: list[bytes] = []
    if filters is None:
        pack = _MSG.pack
        for m in messages:
            buf.append(pack(pid, len(m)))
            buf.append(m)
            pid += 1
        version = 1
    else:
        for m, f in zip(messages, filters, strict=True):
            if f is None:
                buf.append(_MSG_FILTERED.pack(pid, -1))
            else:
                raw = f.encode("utf-8")
                buf.append(_MSG_FILTERED.pack(pid, len(raw)) + raw)
            buf.append(len(m).to_bytes(4, "big"))
            buf.append(m)
            pid += 1
        version = 2
    body = b"".join(buf)
    return _PUBLISH.pack(len(body) + 9, 2, version, publisher_id, len(messages)) + body


def sub_entries(messages: Sequence[bytes], size: int, compression: str) -> list[tuple[bytes, int]]:
    """`messages` in sub-entry batches of `size`: (entry after its publishing id, messages in it)."""
    codec = COMPRESSION_CODES[compression]
    return [
        (sub_entry(messages[j : j + size], codec), len(messages[j : j + size]))
        for j in range(0, len(messages), size)
    ]


def sub_entry_sizes(entries: Sequence[tuple[bytes, int]]) -> list[int]:
    """Bytes of each sub-entry batch in a publish frame, its publishing id included."""
    return [_PUBLISHING_ID.size + len(e) for e, _ in entries]


def sub_entry_frame(publisher_id: int, first_id: int, entries: Sequence[bytes]) -> bytes:
    """A Publish frame of sub-entry batches with publishing ids `first_id`, +1, ... (one per batch)."""
    buf = []
    for i, entry in enumerate(entries):
        buf.append(_PUBLISHING_ID.pack(first_id + i))
        buf.append(entry)
    body = b"".join(buf)
    return _PUBLISH.pack(len(body) + 9, 2, 1, publisher_id, len(entries)) + body


def frame_limit_enforced(client: Any) -> bool:
    """Whether a frame over the connection's frame_max must not be sent at all.

    It must not when this client asked for that limit itself, or when the broker closes
    connections that exceed it (RabbitMQ >= 4.3.5). Older brokers accept larger frames, so a
    message larger than their negotiated frame_max (1 MiB by default) still goes through alone.
    """
    if client.requested_frame_max <= int(client.frame_max):
        return True
    version = (client.server_properties or {}).get("version", "0.0.0")
    return parse_version(str(version)) >= ENFORCES_FRAME_MAX


def check_fits(client: Any, stream: str, entry_size: int, row: int, what: str) -> None:
    """A frame holding only this entry is over the limit: fail naming the row, or allow it."""
    limit = int(client.frame_max)
    if FRAME_HEADER + entry_size <= limit:
        return
    if frame_limit_enforced(client):
        raise DataError(
            f"row {row} of this task: {what} does not fit in a publish frame to "
            f"'{stream}': the largest frame this connection may send is {limit} "
            f"bytes, {FRAME_HEADER} of them frame header (the frame_max negotiated with the broker; "
            "raise stream.frame_max on the broker or send smaller messages)"
        )
    global _warned_oversized
    if not _warned_oversized:
        _warned_oversized = True
        log.warning(
            "row %d of this task: %s exceeds the frame_max of %d bytes negotiated with '%s'; it is "
            "sent in a frame of its own, which this broker accepts (RabbitMQ %s and later refuse it)",
            row,
            what,
            limit,
            stream,
            ".".join(map(str, ENFORCES_FRAME_MAX)),
        )
