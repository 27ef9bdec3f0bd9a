"""Publishing without Spark: Python values -> AMQP 1.0 messages -> `StreamProducer` with confirms.

A message is `bytes`, `str` (UTF-8) or a dict with `value` (bytes or str) and optional
`routing_key`, `properties`, `application_properties`, `message_annotations`, encoded as the Spark
sink encodes a row (a `routing_key` is also stored as the application property `routing_key`, where
the source's `routing_key` column reads it from). Super streams route by `routing_key`.
`publish` returns only after every message was confirmed, with the count per partition stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pyspark_rmqs import codec
from pyspark_rmqs.batches import encode_row, message_body
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.errors import DataError
from pyspark_rmqs.target import Target

_KEYS = frozenset(("value", "routing_key", "properties", "application_properties", "message_annotations"))
BATCH = 1000  # messages handed to the producer at a time (it keeps its own confirm window)


def encode_message(message: Any, index: int = -1) -> tuple[bytes, str | None]:
    """One message (bytes, str or dict) -> (AMQP 1.0 bytes, routing key or None): the sink's encoder."""
    where = f"message {index}" if index >= 0 else "message"
    if not isinstance(message, Mapping):
        return codec.encode_body(message_body(message, where)), None
    unknown = sorted(set(message) - _KEYS)
    if unknown:
        raise DataError(f"{where} has unknown key(s) {unknown}; valid: {sorted(_KEYS)}")
    if message.get("value") is None:
        raise DataError(f"{where} has no 'value'; every message needs a body")
    key = message.get("routing_key")
    return encode_row(message, where), None if key is None else str(key)


def publish(
    conn: Any,
    messages: Iterable[Any],
    *,
    stream: str | None = None,
    superstream: str | None = None,
    settings: WriteSettings | None = None,
    batch: int = BATCH,
) -> dict[str, int]:
    """Publish `messages` in order and wait for every confirm; messages per partition stream."""
    target = Target.of(stream, superstream)
    is_super = target.is_super
    with StreamProducer(
        conn, target.name, superstream=is_super, settings=settings or WriteSettings()
    ) as producer:
        msgs: list[bytes] = []
        keys: list[str | None] = []
        for i, m in enumerate(messages):
            data, key = encode_message(m, i)
            if is_super and key is None:
                raise DataError(
                    f"message {i} has no 'routing_key': publishing to {target.describe()} routes every "
                    "message by its key (yield a dict with 'value' and 'routing_key')"
                )
            msgs.append(data)
            keys.append(key)
            if len(msgs) >= batch:
                producer.send(msgs, keys if is_super else None)
                msgs, keys = [], []
        if msgs:
            producer.send(msgs, keys if is_super else None)
        producer.flush()
        counts = producer.message_counts()
        return (
            {p: counts.get(p, 0) for p in producer.partitions}
            if is_super
            else {target.name: counts.get(target.name, 0)}
        )
