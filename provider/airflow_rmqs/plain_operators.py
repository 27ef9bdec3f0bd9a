"""Operators without Spark (no JVM, no pyspark): rmqs's own reader and producer in the worker.

`RabbitMQStreamConsumeOperator` reads a bounded range as Arrow batches into a callable, Parquet
files or an Iceberg table; `RabbitMQStreamProduceOperator` publishes what a callable yields. Both
work on an `rmqs[airflow]` worker without the `rmqs[spark]` extra. Import them from
`airflow_rmqs.operators`, with the Spark operators.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs import values
from airflow_rmqs.failures import airflow_failures
from airflow_rmqs.hooks import secret_values
from airflow_rmqs.operator_base import (
    BOUNDED_READ_FIELDS,
    BOUNDED_READ_RENDERERS,
    CONNECTION_FIELDS,
    _BoundedReadOperator,
    _StreamOperator,
    pipeline_of,
    retries_of,
)
from pyspark_rmqs.runs.outputs.objectstore import storage_secrets


def resolve_callable(value: Callable[..., Any] | str, param: str) -> Callable[..., Any]:
    """A callable, or a dotted path `package.module.function` to one (as the Kafka provider takes)."""
    if callable(value):
        return value
    if not isinstance(value, str) or "." not in value:
        raise AirflowFailException(
            f"{param} must be a callable or a dotted path 'module.function'; got {value!r}"
        )
    module, _, name = value.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise AirflowFailException(f"{param} {value!r} cannot be imported: {e}") from e
    if not callable(found):
        raise AirflowFailException(f"{param} {value!r} is not callable")
    return found


def run_identity_of(context: Any) -> str | None:
    """`dag_id/task_id/run_id[/map_index]`: the same for every try of one task instance; None
    without a task instance (then every call is a new run)."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None or getattr(ti, "run_id", None) is None:
        return None
    identity = f"{ti.dag_id}/{ti.task_id}/{ti.run_id}"
    map_index = getattr(ti, "map_index", -1)
    return identity if map_index is None or int(map_index) < 0 else f"{identity}/{map_index}"


class RabbitMQStreamConsumeOperator(_BoundedReadOperator):
    """A bounded read without Spark: Arrow batches to `apply_function`, or Parquet files to `output_path`.

    The same range and watermark protocol as `RabbitMQStreamReadOperator` (start at the watermark,
    end at the tails when the task starts, a persisted plan re-read exactly by a retry, watermarks
    stored only after the sink succeeded), read by rmqs's own reader in the worker process: no JVM,
    no pyspark, memory bounded by `queueCapacity` whatever the range.

    :param apply_function: a callable or a dotted path (`my_pkg.sink.handle`) called with every
        `pyarrow.RecordBatch` of the source schema (`value`, `stream`, `offset`, `chunk_timestamp`
        and the `metadata_fields`), then `*apply_function_args, **apply_function_kwargs`.
    :param output_path: instead, a directory or an object store URI (`s3://bucket/orders`): one
        Parquet file per partition stream and run, `<stream>-<start>-<end>-<run>.parquet` (`<run>`:
        the run's token), complete or absent (renamed into place; an object's upload completes
        whole); a retry of the same run replaces it, another consumer or a re-created stream never
        does. Then a commit record per run (`_rmqs_commits/<token>.json`, the manifest of its
        files): a retry of a committed range reads nothing, and readers that must see committed
        runs only read through it (`pyspark_rmqs.committed.committed_dataset`).
    :param output_conn_id: the Airflow connection holding the output's credentials (templated), as
        `aws_conn_id` elsewhere: an `aws`-style connection (Login/Password = access key id/secret,
        extra `endpoint_url`, `region_name`) and/or extra `storage_options` (fsspec). Without it,
        `s3://` is reached with the worker's AWS environment (pyarrow). See `airflow_rmqs.storage`.
    :param output_format: "parquet" (default) or "iceberg": then `output_path` is an Iceberg table
        (`namespace.table`, created from the source schema) in the pyiceberg catalog configured by
        `iceberg_catalog` (pyiceberg catalog properties, e.g. `{"type": "sql", "uri": "sqlite:///...",
        "warehouse": "file:///..."}`, and optionally its `name`, default "rmqs"); each run is one
        atomic append whose snapshots carry its range token, so a replayed range is recognised from
        the table itself and not appended again.
    :param source_options: reader options: `queueCapacity`, `initialCredits`, `pollTimeoutMs`,
        `maxWaitMs`, `filterValues`, `filterMatchUnfiltered`, `strictDecoding`.
    The bounded-read parameters (`consumer_name`, `start`, `end`, `starting_offsets`,
    `max_messages`, `store_watermark`, `fail_on_data_loss`, `metadata_fields`) are the read
    operator's (`airflow_rmqs.operator_base._BoundedReadOperator`).
    """

    template_fields: Sequence[str] = (
        *BOUNDED_READ_FIELDS,
        "output_path",
        "output_conn_id",
        "apply_function_args",
        "apply_function_kwargs",
        "source_options",
    )
    template_fields_renderers = {**BOUNDED_READ_RENDERERS, "source_options": "json"}

    def __init__(
        self,
        *,
        apply_function: Callable[..., Any] | str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        output_path: str | None = None,
        output_format: str = "parquet",
        iceberg_catalog: Mapping[str, str] | None = None,
        output_conn_id: str | None = None,
        source_options: Mapping[str, str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (output_path is None) == (apply_function is None):
            raise ValueError("give exactly one of 'output_path' or 'apply_function'")
        if output_format not in ("parquet", "iceberg"):
            raise ValueError(f"output_format must be 'parquet' or 'iceberg'; got {output_format!r}")
        self.apply_function = apply_function
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.output_path = output_path
        self.output_format = output_format
        self.iceberg_catalog = dict(iceberg_catalog or {})
        self.output_conn_id = output_conn_id
        self.source_options = source_options

    def _lineage_paths(self) -> tuple[list[str], list[str]]:
        return [], [str(self.output_path)] if self.output_path else []

    def _storage_options(self) -> dict[str, Any]:
        """The output's credentials from `output_conn_id` (none without it)."""
        if not self.output_conn_id or self.output_path is None:
            return {}
        from airflow_rmqs import storage

        return storage.from_connection(self.output_conn_id)

    def _sink(self, options: Mapping[str, Any] | None = None) -> Any:
        from pyspark_rmqs.runs import consume

        options = options or {}
        if self.output_path is not None and self.output_format == "iceberg":
            from airflow_rmqs.storage import iceberg_properties
            from pyspark_rmqs.runs.outputs.iceberg import IcebergSink

            return IcebergSink(str(self.output_path), {**iceberg_properties(options), **self.iceberg_catalog})
        if self.output_path is not None:
            return consume.ParquetSink(str(self.output_path), storage_options=options or None)
        fn = resolve_callable(self.apply_function, "apply_function")  # type: ignore[arg-type]
        return consume.FunctionSink(
            fn, *(self.apply_function_args or ()), **(self.apply_function_kwargs or {})
        )

    def execute(self, context: Any) -> dict[str, Any]:
        from pyspark_rmqs.runs import consume

        conn = self.connection()
        with airflow_failures(secret_values(conn)):
            options = self._storage_options()
        with airflow_failures([*secret_values(conn), *storage_secrets(options)]):
            sink = self._sink(options)  # before planning: a bad output fails without holding the lease
            plan = self.plan(conn, "consuming", context)
            summary = consume.run_consume(
                conn,
                plan,
                sink,
                store_watermark=self.stores,
                metadata_fields=self.metadata_fields,
                source_options=values.options(self.source_options, "source_options"),
                pipeline=pipeline_of(context),
                retry_count=retries_of(context),
            )
        self._summary = summary.to_dict()
        return self._summary


class RabbitMQStreamProduceOperator(_StreamOperator):
    """Publishes the messages `producer_function` yields, with confirms, without Spark.

    :param producer_function: a callable or a dotted path, called with `*producer_function_args,
        **producer_function_kwargs`; it returns or yields messages: `bytes`, `str` (UTF-8), or a
        dict with `value` and optional `routing_key` (required for a super stream, routed by
        `routing_strategy`), `properties`, `application_properties`, `message_annotations`.
    :param producer_name: the broker-side producer name. With it the task is a produce run: it holds
        the name's lease on the stream or super stream while it sends (a second task producing under
        the same name there fails with `ProducerBusyError` before it sends, and Airflow retries it),
        and a retry of the same task instance numbers its messages as the failed try did, so the
        broker drops those the failed try had stored: each message once. `producer_function` must
        then yield the same messages in the same order on every try. Without it nothing is
        deduplicated: a retry publishes every message again.
    :param run_identity: what makes two tries the same run (templated); default
        `dag_id/task_id/run_id` (`/map_index` for a mapped task): the tries of one task instance.
    :param routing_strategy: `hash` (default, as the Java and Go clients), `key` (the super stream's
        bindings) or `custom` with `partitioner_class`.
    Returns `{"target", "messages": {partition stream: count}, "rows", "seconds"}` once every
    message is confirmed; with a producer name also `new` and `already_stored` per partition stream
    (what a retry found stored by its failed try), `run_identity` and `resumed` (a retry).
    """

    _operation = "write"
    template_fields: Sequence[str] = (
        "stream",
        "superstream",
        "producer_function_args",
        "producer_function_kwargs",
        "producer_name",
        "run_identity",
        *CONNECTION_FIELDS,
    )

    def __init__(
        self,
        *,
        producer_function: Callable[..., Iterable[Any]] | str,
        producer_function_args: Sequence[Any] | None = None,
        producer_function_kwargs: Mapping[str, Any] | None = None,
        producer_name: str | None = None,
        run_identity: str | None = None,
        routing_strategy: str = "hash",
        partitioner_class: str | None = None,
        compression: str = "none",
        batch_size: int = 500,
        confirm_timeout_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.producer_function = producer_function
        self.producer_function_args = producer_function_args
        self.producer_function_kwargs = producer_function_kwargs
        self.producer_name = producer_name
        self.run_identity = run_identity
        self.routing_strategy = routing_strategy
        self.partitioner_class = partitioner_class
        self.compression = compression
        self.batch_size = batch_size
        self.confirm_timeout_ms = confirm_timeout_ms

    def execute(self, context: Any) -> dict[str, Any]:
        from pyspark_rmqs.broker.writer import WriteSettings
        from pyspark_rmqs.runs import produce

        conn = self.connection()
        fn = resolve_callable(self.producer_function, "producer_function")
        t0 = time.monotonic()
        with airflow_failures(secret_values(conn)):
            target = self._target()
            settings = WriteSettings(
                producer_name=values.optional_str(self.producer_name),
                routing_strategy=self.routing_strategy,
                partitioner_class=self.partitioner_class,
                compression=self.compression,
                batch_size=int(self.batch_size),
                confirm_timeout_ms=int(self.confirm_timeout_ms),
            )
            messages = fn(*(self.producer_function_args or ()), **(self.producer_function_kwargs or {}))
            result = produce.run_produce(
                conn,
                messages or (),
                **target.kw(),
                settings=settings,
                run_identity=values.optional_str(self.run_identity) or run_identity_of(context),
                pipeline=pipeline_of(context),
            )
        self._summary = {
            "target": target.name,
            "messages": result.messages,
            "rows": sum(result.messages.values()),
            "seconds": round(time.monotonic() - t0, 3),
        }
        if result.run_identity is not None:
            self._summary.update(
                new=result.new,
                already_stored=result.already_stored,
                run_identity=result.run_identity,
                resumed=result.resumed,
            )
        self.log.info("rmqs: produced %s", self._summary)
        return self._summary
