"""Publishing without Spark: Python values -> AMQP 1.0 messages -> `StreamProducer` with confirms.

A message is `bytes`, `str` (UTF-8) or a dict with `value` (bytes or str) and optional
`routing_key`, `properties`, `application_properties`, `message_annotations`, encoded as the Spark
sink encodes a row (a `routing_key` is also stored as the application property `routing_key`, where
the source's `routing_key` column reads it from). Super streams route by `routing_key`.
`publish` returns only after every message was confirmed, with the count per partition stream;
`run_produce` does the same and says how many of them the broker held already.

With a producer name a call is a produce run (`runs.producer`): it holds the name's lease on the
stream or super stream while it sends (a second run of the name fails with `ProducerBusyError`
before it sends), and numbers its messages from its run identity's record, so a retry with the same
`run_identity` adds only what its failed try did not get stored: the messages must then be the same,
in the same order. On a super stream every try of a run routes over the partition list its first
try recorded, whatever was added since (a partition removed since, or another routing strategy:
`RoutingChangedError` before it sends). Without a producer name nothing is recorded or held, and
nothing deduplicated: a retry publishes everything again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core import codec
from pyspark_rmqs.core.batches import encode_row, message_body
from pyspark_rmqs.core.errors import ConfigurationError, DataError
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.runs import producer as producer_runs

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


@dataclass(frozen=True)
class ProduceResult:
    """What a produce call published, per partition stream, once every message was confirmed."""

    messages: dict[str, int]  # every message of the call, routed
    # Of those, what the broker held already: left out, or dropped as re-sent (a retry's stored part).
    already_stored: dict[str, int] = field(default_factory=dict)
    run_identity: str | None = None  # None without a producer name (no run, no deduplication)
    resumed: bool = False  # a retry of a recorded run

    @property
    def new(self) -> dict[str, int]:
        return {s: n - self.already_stored.get(s, 0) for s, n in self.messages.items()}


def publish(
    conn: Any,
    messages: Iterable[Any],
    *,
    stream: str | None = None,
    superstream: str | None = None,
    settings: WriteSettings | None = None,
    batch: int = BATCH,
    run_identity: str | None = None,
    pipeline: str | None = None,
    lease_wait_s: float | None = None,
) -> dict[str, int]:
    """Publish `messages` in order and wait for every confirm; messages per partition stream.

    See `run_produce` for `run_identity`, `pipeline` and `lease_wait_s` (used with a producer name).
    """
    return run_produce(
        conn,
        messages,
        stream=stream,
        superstream=superstream,
        settings=settings,
        batch=batch,
        run_identity=run_identity,
        pipeline=pipeline,
        lease_wait_s=lease_wait_s,
    ).messages


def run_produce(
    conn: Any,
    messages: Iterable[Any],
    *,
    stream: str | None = None,
    superstream: str | None = None,
    settings: WriteSettings | None = None,
    batch: int = BATCH,
    run_identity: str | None = None,
    pipeline: str | None = None,
    lease_wait_s: float | None = None,
) -> ProduceResult:
    """Publish `messages` in order and wait for every confirm.

    With `settings.producer_name` this is a produce run (module docstring): `run_identity` names it
    (the same on every retry of one logical run, e.g. Airflow's dag/task/run id; None: a new run),
    `pipeline` says who runs it in a busy error, `lease_wait_s` bounds the wait for another run of the
    name (default `runs.lease.DEFAULT_WAIT_S`). `messages` is iterated only once the lease is held.
    """
    target = Target.of(stream, superstream)
    is_super = target.is_super
    s = settings or WriteSettings()
    name = s.producer_name
    if name and s.sub_entry_size > 1:
        raise ConfigurationError(
            f"sub_entry_size={s.sub_entry_size} with producer name '{name}': a produce run numbers one "
            "publishing id per message, which sub-entry batching does not; use sub_entry_size=1"
        )
    with StreamProducer(conn, target.name, superstream=is_super, settings=s) as producer:
        streams = producer.partitions if is_super else [target.name]
        routing = producer_runs.routing_name(s.routing_strategy, s.partitioner_class)
        run = (
            producer_runs.begin(
                conn,
                name,
                target,
                streams,
                run_identity,
                wait_s=lease_wait_s,
                pipeline=pipeline,
                routing=routing,
            )
            if name
            else None
        )
        try:
            if run is not None:
                if run.run.partitions is not None:  # a super stream: as the run's first try routed
                    producer.pin_partitions(run.run.partitions, f"run '{run.run.identity}' of '{name}'")
                producer.number_from(run.run.bases, run.run.skip)
            _send_all(producer, messages, target, batch, run)
            producer.flush()
            counts, skipped = producer.message_counts(), producer.skipped_counts()
        finally:
            producer.close()  # every publisher of the name gone before another run may take the lease
            if run is not None:
                run.release()
    sent = {p: counts.get(p, 0) for p in streams}
    total = {p: sent[p] + skipped.get(p, 0) for p in streams}
    if run is None:
        return ProduceResult(total)
    held = run.already_stored(sent, skipped)
    return ProduceResult(total, {p: held.get(p, 0) for p in streams}, run.run.identity, run.resumed)


def _send_all(
    producer: StreamProducer,
    messages: Iterable[Any],
    target: Target,
    batch: int,
    run: producer_runs.ProducerTry | None,
) -> None:
    is_super = target.is_super
    msgs: list[bytes] = []
    keys: list[str | None] = []

    def send() -> None:
        if run is not None:
            run.check_held()
        producer.send(msgs, keys if is_super else None)

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
            send()
            msgs, keys = [], []
    if msgs:
        send()
