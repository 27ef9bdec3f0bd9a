"""Sample order events and how `rmqs publish` (and the demo) turn records into messages.

Public because the demo uses them too (the demo uses the CLI's pieces, never the reverse).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REGIONS = ("eu", "us", "apac")
PRODUCTS = ("keyboard", "monitor", "laptop", "mouse", "headset", "dock")


def sample_orders(count: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """Deterministic sample order events (the demo's data)."""
    rnd = random.Random(seed)
    for i in range(count):
        customer = f"c{rnd.randrange(5000):04d}"
        yield {
            "order_id": f"o-{i:07d}",
            "customer": customer,
            "product": rnd.choice(PRODUCTS),
            "quantity": rnd.randint(1, 5),
            "amount": round(rnd.uniform(5, 900), 2),
            "currency": "EUR",
            "region": rnd.choice(REGIONS),
        }


def file_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines or Parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()
    else:
        with path.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def send_records(producer: Any, records: Sequence[dict[str, Any]], key: str) -> int:
    """Send `records` as JSON messages with properties through a `StreamProducer`; returns how many.

    Each message gets `message_id` (the record's `order_id`, else a UUID), `content_type`
    application/json and `creation_time`; application properties `region` and `routing_key`
    (the record's `key` field, also the routing key on a super stream).
    """
    from pyspark_rmqs.core.codec import encode

    now = datetime.now(UTC)
    msgs = []
    keys = []
    for rec in records:
        k = str(rec.get(key, ""))
        props = {
            "message_id": str(rec.get("order_id") or uuid.uuid4()),
            "content_type": "application/json",
            "creation_time": now,
        }
        app_props = {"region": str(rec.get("region", "")), "routing_key": k}
        msgs.append(encode(json.dumps(rec, default=str).encode(), props, app_props))
        keys.append(k)
    producer.send(msgs, keys if producer.superstream else None)
    return len(msgs)
