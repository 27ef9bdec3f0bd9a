"""Operators: thin wrappers over `pyspark_rmqs.jobs` (Spark) and `consume` / `produce` (plain Python).

The watermark protocol (DESIGN §4) lives in `jobs`: the read range is fixed before reading, the
sink runs, and only after it succeeded are the watermarks stored. These operators render
templates, resolve the connection, pick a SparkSession and map errors to Airflow's retry rules;
their return value (XCom) is `RunSummary.to_dict()` and never holds connection details.

With Spark: `RabbitMQStreamReadOperator`, `RabbitMQStreamDrainOperator`,
`RabbitMQStreamPublishOperator` (need the `rmqs[spark]` extra on the worker; `spark_conn_id` names a
connection holding a Spark Connect URL and token). Without Spark (no JVM, no pyspark):
`RabbitMQStreamConsumeOperator` (Arrow batches to a callable or Parquet files) and
`RabbitMQStreamProduceOperator` (messages yielded by a callable). Every operator reports
OpenLineage datasets and a run facet with its offset ranges (`airflow_rmqs.lineage`).
"""

from __future__ import annotations

import importlib
import importlib.util
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs import values
from airflow_rmqs.failures import airflow_failures
from airflow_rmqs.hooks import RabbitMQStreamHook, check_target, secret_values
from pyspark_rmqs import jobs
from pyspark_rmqs.delivery import check_delivery, takes_token
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.options import ConnectionOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SPARK_EXTRA = "rmqs[spark]"


def require_pyspark(operator: str) -> None:
    """Fail the task at once, naming the extra, where pyspark is not installed."""
    if importlib.util.find_spec("pyspark") is None:
        raise AirflowFailException(
            f"{operator} runs Spark, but pyspark is not installed on this worker: install "
            f"'{SPARK_EXTRA}' (or '{SPARK_EXTRA[:-1]},connect]' for Spark Connect), or use "
            "RabbitMQStreamConsumeOperator / RabbitMQStreamProduceOperator, which need no Spark"
        )


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


def spark_connect_url(conn: Any) -> tuple[str | None, str | None]:
    """(Spark Connect URL, master) from an Airflow connection; the URL holds the token.

    Host `sc://host` or `host` (port default 15002) with the token in Password (or extra `token`),
    extra `use_ssl` / `user_id` -> `sc://host:15002/;use_ssl=true;token=...`. A host that is a
    Spark master (`local[...]`, `spark://`, `yarn`, `k8s://`) starts a local driver on it instead.
    """
    extra = conn.extra_dejson if conn.extra else {}
    host = (conn.host or "").strip()
    if not host:
        raise AirflowFailException(f"Spark connection '{conn.conn_id}' has no host")
    if host.startswith(("local", "spark://", "yarn", "k8s://", "mesos://")):
        return None, host if not conn.port or "://" not in host else f"{host}:{conn.port}"
    base = host[len("sc://") :] if host.startswith("sc://") else host
    base = base.rstrip("/")
    if ":" not in base.split("/")[0]:
        base = f"{base}:{conn.port or 15002}"
    params = []
    token = conn.password or extra.get("token")
    if str(extra.get("use_ssl", "")).lower() in ("true", "1", "yes"):
        params.append("use_ssl=true")
    if extra.get("user_id"):
        params.append(f"user_id={extra['user_id']}")
    if token:
        params.append(f"token={token}")
    return f"sc://{base}/" + (";" + ";".join(params) if params else ""), None


def _is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


class _StreamOperator(BaseOperator):
    """A stream or super stream on an rmqs connection; lineage of what the run read or wrote."""

    _operation = "read"
    _summary: dict[str, Any] | None = None

    def __init__(
        self,
        *,
        stream: str | None = None,
        superstream: str | None = None,
        rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_target(stream, superstream)
        self.stream = stream
        self.superstream = superstream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id

    def _target(self) -> dict[str, str | None]:
        return {
            "stream": values.optional_str(self.stream),
            "superstream": values.optional_str(self.superstream),
        }

    def connection(self) -> ConnectionOptions:
        """The parsed connection; a bad connection definition fails the task without retries."""
        with airflow_failures():
            return RabbitMQStreamHook(self.rabbitmq_stream_conn_id).get_conn()

    # ------------------------------------------------------------------ lineage

    def _lineage_paths(self) -> tuple[list[str], list[str]]:
        """(input paths, output paths) of the run, besides the stream."""
        return [], []

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs and outputs as OpenLineage datasets, the offset ranges and rows as a run facet."""
        from airflow_rmqs import lineage

        name = values.optional_str(self.superstream) or str(values.optional_str(self.stream))
        stream = lineage.stream_dataset(self.connection(), name)
        in_paths, out_paths = self._lineage_paths()
        inputs = [lineage.path_dataset(p) for p in in_paths]
        outputs = [lineage.path_dataset(p) for p in out_paths]
        if self._operation == "read":
            inputs.insert(0, stream)
        else:
            outputs.insert(0, stream)
        return lineage.operator_lineage(inputs, outputs, self._operation, self._summary)


class _SparkOperator(_StreamOperator):
    """Connection and SparkSession plumbing shared by the Spark operators (the `rmqs[spark]` extra).

    :param spark_conn_id: an Airflow connection holding the Spark Connect URL and token (Host
        `sc://host`, Port 15002, token in Password, extra `use_ssl`), or a master URL in Host
        (`local[4]`, `spark://...`). Keeps the token out of DAG code; it is masked in task logs.
    :param spark_master: master of the local session (default `local[2]`); ignored with a remote.
    :param spark_conf: extra Spark configuration for the session.
    :param spark_remote: a Spark Connect URL (`sc://host:15002`); prefer `spark_conn_id`, which
        keeps a token out of DAG code.

    `on_kill` (a task marked failed or timed out) interrupts this run's Spark jobs, locally and
    over Spark Connect, and stops a running streaming query.
    """

    def __init__(
        self,
        *,
        spark_conn_id: str | None = None,
        spark_master: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
        spark_remote: str | None = None,
        spark_app_name: str = "rmqs",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if spark_conn_id and spark_remote:
            raise ValueError("give 'spark_conn_id' or 'spark_remote', not both")
        self.spark_conn_id = spark_conn_id
        self.spark_master = spark_master
        self.spark_conf = dict(spark_conf or {})
        self.spark_remote = spark_remote
        self.spark_app_name = spark_app_name
        self._spark: Any = None
        self._job_tag: str | None = None
        self._query: Any = None

    def _remote_and_master(self) -> tuple[str | None, str | None]:
        if not self.spark_conn_id:
            return self.spark_remote, self.spark_master
        from airflow.sdk import BaseHook
        from airflow.sdk.log import mask_secret

        conn = BaseHook.get_connection(self.spark_conn_id)
        remote, master = spark_connect_url(conn)
        for secret in (conn.password, (conn.extra_dejson if conn.extra else {}).get("token"), remote):
            if secret:
                mask_secret(secret)
        return remote, master or self.spark_master

    def spark_session(self) -> SparkSession:
        """A local session (reusing the process's active one) or a Spark Connect session.

        The session carries a job tag for this task try, so `on_kill` interrupts only its jobs.
        """
        require_pyspark(type(self).__name__)
        remote, master = self._remote_and_master()
        spark = jobs.spark_session(
            master=master, conf=self.spark_conf, remote=remote, app=self.spark_app_name
        )
        self._job_tag = f"rmqs-{self.task_id}-{uuid.uuid4().hex[:8]}".replace(".", "-")
        # Spark Connect tags the session's operations; a local driver tags this thread's jobs
        # (SparkContext job tags: the session's interruptTag does not reach Dataset actions there).
        if _is_connect(spark):
            spark.addTag(self._job_tag)
        else:
            spark.sparkContext.addJobTag(self._job_tag)
        self._spark = spark
        return spark

    def _untag(self) -> None:
        if self._spark is not None and self._job_tag is not None:
            try:
                if _is_connect(self._spark):
                    self._spark.removeTag(self._job_tag)
                else:
                    self._spark.sparkContext.removeJobTag(self._job_tag)
            except Exception:
                self.log.debug("removing the job tag failed", exc_info=True)

    def on_kill(self) -> None:
        """Stop this run's streaming query and interrupt its Spark jobs (local or Spark Connect)."""
        if self._query is not None:
            try:
                self._query.stop()
                self.log.info("rmqs: stopped the streaming query %s", self._query.id)
            except Exception:
                self.log.warning("rmqs: stopping the streaming query failed", exc_info=True)
        if self._spark is not None and self._job_tag is not None:
            try:
                if _is_connect(self._spark):
                    interrupted = self._spark.interruptTag(self._job_tag)
                else:
                    interrupted = self._spark.sparkContext.cancelJobsWithTag(self._job_tag)
                self.log.info("rmqs: interrupted Spark operations %s (tag %s)", interrupted, self._job_tag)
            except Exception:
                self.log.warning("rmqs: interrupting the Spark jobs failed", exc_info=True)


class RabbitMQStreamReadOperator(_SparkOperator):
    """Reads `[start, end)` of a stream or super stream with Spark into a sink, then advances the watermark.

    :param consumer_name: whose broker-stored offset is the watermark (needed for `start="watermark"`).
    :param start: "watermark" (stored offset + 1; `starting_offsets` where none is stored yet),
        "earliest", "latest", per-stream offsets (dict or JSON), or a timestamp (datetime, ISO-8601
        string such as `{{ data_interval_start }}`, or epoch milliseconds).
    :param end: "latest" (the tails when the task starts), per-stream offsets, or a timestamp.
    :param max_messages: cap on the messages one run reads, split across partitions by backlog.
    :param output_path: write the rows there with `output_format` / `output_mode` / `output_options`.
    :param process: instead of `output_path`, `process(df, context)` is the sink; a `process` taking a
        `token` keyword also gets the run's range token (`pyspark_rmqs.delivery.RunToken`), the same
        for every retry of the range, to make its own writes idempotent (MERGE on stream and offset).
    :param delivery: "exactly_once" (default) stages, publishes and commits `output_path`'s files
        under the run's range token, so a retry of a committed range writes nothing again;
        "at_least_once" writes straight to `output_path` (a retry may write a range twice).
    :param store_watermark: store `end - 1` per stream after the sink succeeded (False for backfills).
        A watermark run records its plan in the broker first: a retry reads exactly the same range.
        Runs are serialised (`max_active_tis_per_dag=1` unless given): two runs on one consumer
        name would read the same range, and the later store fails with `WatermarkConflictError`.
    :param metadata_fields: the source's `metadataFields` option (default: all metadata columns).
    """

    template_fields: Sequence[str] = (
        "stream",
        "superstream",
        "consumer_name",
        "start",
        "end",
        "starting_offsets",
        "max_messages",
        "output_path",
        "output_format",
        "output_mode",
        "output_options",
    )
    template_fields_renderers = {"start": "json", "end": "json", "output_options": "json"}

    def __init__(
        self,
        *,
        consumer_name: str | None = None,
        start: Any = "watermark",
        end: Any = "latest",
        starting_offsets: str = "earliest",
        max_messages: int | str | None = None,
        output_path: str | None = None,
        output_format: str = "parquet",
        output_mode: str = "append",
        output_options: Mapping[str, str] | str | None = None,
        output_partition_by: list[str] | None = None,
        process: Callable[..., Any] | None = None,
        store_watermark: bool = True,
        fail_on_data_loss: bool = True,
        metadata_fields: str | None = None,
        delivery: str = "exactly_once",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)  # one run per consumer name at a time
        super().__init__(**kwargs)
        if (output_path is None) == (process is None):
            raise ValueError("give exactly one of 'output_path' or 'process'")
        if start == "watermark" and not consumer_name:
            raise ValueError("start='watermark' needs a consumer_name (its stored offset is the watermark)")
        self.consumer_name = consumer_name
        self.start = start
        self.end = end
        self.starting_offsets = starting_offsets
        self.max_messages = max_messages
        self.output_path = output_path
        self.output_format = output_format
        self.output_mode = output_mode
        self.output_options = output_options
        self.output_partition_by = output_partition_by
        self.process = process
        self.store_watermark = store_watermark
        self.fail_on_data_loss = fail_on_data_loss
        self.metadata_fields = metadata_fields
        self.delivery = check_delivery(delivery)

    def _sink(self, context: Any) -> Callable[..., Any]:
        if self.process is not None:
            process = self.process
            if takes_token(process):
                return lambda df, token: process(df, context, token=token)
            return lambda df: process(df, context)
        return jobs.write_output(
            str(self.output_path),
            self.output_format,
            self.output_mode,
            values.options(self.output_options, "output_options"),
            self.output_partition_by,
            delivery=self.delivery,
        )

    def _lineage_paths(self) -> tuple[list[str], list[str]]:
        return [], [str(self.output_path)] if self.output_path else []

    def execute(self, context: Any) -> dict[str, Any]:
        require_pyspark(type(self).__name__)
        conn = self.connection()
        with airflow_failures(secret_values(conn)):
            plan = plan_bounded_read(self, conn, "reading")
            try:
                summary = jobs.run_read(
                    self.spark_session(),
                    conn,
                    plan,
                    self._sink(context),
                    store_watermark=self.store_watermark,
                    metadata_fields=self.metadata_fields,
                    pipeline=pipeline_of(context),
                    retry_count=retries_of(context),
                )
            finally:
                self._untag()
        self._summary = summary.to_dict()
        return self._summary


class RabbitMQStreamDrainOperator(_SparkOperator):
    """Drains everything after the checkpoint with a Structured Streaming `Trigger.AvailableNow` query.

    The checkpoint (`checkpoint_location`) is the source of truth for where the next drain starts;
    the consumer's broker-stored offset follows it (for sensors and lag). Returns the run summary.

    :param source_options: extra source options (e.g. `maxRecordsPerTrigger`, `metadataFields`).
    :param timeout: seconds before the query is stopped and the task fails (retryable).
    """

    template_fields: Sequence[str] = (
        "stream",
        "superstream",
        "consumer_name",
        "checkpoint_location",
        "output_path",
        "output_format",
        "output_options",
        "source_options",
    )
    template_fields_renderers = {"output_options": "json", "source_options": "json"}

    def __init__(
        self,
        *,
        consumer_name: str,
        checkpoint_location: str,
        output_path: str,
        output_format: str = "parquet",
        output_options: Mapping[str, str] | str | None = None,
        source_options: Mapping[str, str] | str | None = None,
        timeout: float = 3600.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)  # one drain per consumer name at a time
        super().__init__(**kwargs)
        self.consumer_name = consumer_name
        self.checkpoint_location = checkpoint_location
        self.output_path = output_path
        self.output_format = output_format
        self.output_options = output_options
        self.source_options = source_options
        self.timeout = timeout

    def _lineage_paths(self) -> tuple[list[str], list[str]]:
        return [], [str(self.output_path)]

    def on_kill(self) -> None:
        """Stop the drain's streaming query (the session's active queries), then interrupt its jobs."""
        if self._spark is not None:
            for q in list(self._spark.streams.active):
                self._query = q
                super().on_kill()
        self._query = None
        super().on_kill()

    def execute(self, context: Any) -> dict[str, Any]:
        require_pyspark(type(self).__name__)
        conn = self.connection()
        with airflow_failures(secret_values(conn)):
            summary = jobs.run_drain(
                self.spark_session(),
                conn,
                **self._target(),
                consumer=self.consumer_name,
                checkpoint=self.checkpoint_location,
                output_path=self.output_path,
                output_format=self.output_format,
                output_options=values.options(self.output_options, "output_options"),
                source_options=values.options(self.source_options, "source_options"),
                timeout_s=float(self.timeout),
            )
            self._untag()
        self._summary = summary.to_dict()
        return self._summary


class RabbitMQStreamPublishOperator(_SparkOperator):
    """Publishes a dataset to a stream or super stream through the `rabbitmq_streams` Spark sink.

    The DataFrame needs a `value` column (binary or string) and may carry the sink's other columns
    (`routing_key`, `properties`, `application_properties`, ...).

    :param input_path: read the dataset from there with `input_format` / `input_options`.
    :param dataframe_callable: instead of `input_path`, `dataframe_callable(spark, context)` returns it.
    :param sink_options: sink options such as `producerName` (the broker drops rows a retried Spark
        task re-sends within this run; another run, an Airflow retry included, publishes all its rows
        again: at-least-once), `routingStrategy`, `compression`, `batchSize`.
    """

    template_fields: Sequence[str] = (
        "stream",
        "superstream",
        "input_path",
        "input_format",
        "input_options",
        "sink_options",
    )
    template_fields_renderers = {"input_options": "json", "sink_options": "json"}

    def __init__(
        self,
        *,
        input_path: str | None = None,
        input_format: str = "parquet",
        input_options: Mapping[str, str] | str | None = None,
        dataframe_callable: Callable[[SparkSession, Any], DataFrame] | None = None,
        sink_options: Mapping[str, str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (input_path is None) == (dataframe_callable is None):
            raise ValueError("give exactly one of 'input_path' or 'dataframe_callable'")
        self.input_path = input_path
        self.input_format = input_format
        self.input_options = input_options
        self.dataframe_callable = dataframe_callable
        self.sink_options = sink_options

    def _dataframe(self, spark: SparkSession, context: Any) -> DataFrame:
        if self.dataframe_callable is not None:
            return self.dataframe_callable(spark, context)
        opts = values.options(self.input_options, "input_options")
        return spark.read.format(self.input_format).options(**opts).load(self.input_path)

    _operation = "write"

    def _lineage_paths(self) -> tuple[list[str], list[str]]:
        return [str(self.input_path)] if self.input_path else [], []

    def execute(self, context: Any) -> dict[str, Any]:
        require_pyspark(type(self).__name__)
        conn = self.connection()
        target = {k: v for k, v in self._target().items() if v is not None}
        t0 = time.monotonic()
        with airflow_failures(secret_values(conn)):
            spark = self.spark_session()
            df = self._dataframe(spark, context)
            if "value" not in df.columns:
                raise ConfigurationError(
                    f"the dataset to publish needs a 'value' column (binary or string); it has {df.columns}"
                )
            df, observation = jobs._observe(df)
            try:
                (
                    df.write.format("rabbitmq_streams")
                    .options(**conn.to_options())
                    .options(**target)
                    .options(**values.options(self.sink_options, "sink_options"))
                    .mode("append")
                    .save()
                )
            finally:
                self._untag()
        counts = jobs._observed(observation)
        summary = {
            "target": next(iter(target.values())),
            "rows": counts["rows"] if counts else None,
            "bytes": counts["bytes"] if counts else None,
            "seconds": round(time.monotonic() - t0, 3),
        }
        self.log.info("rmqs: published %s", summary)
        self._summary = summary
        return summary


# ------------------------------------------------------------------------------- without Spark


class RabbitMQStreamConsumeOperator(_StreamOperator):
    """A bounded read without Spark: Arrow batches to `apply_function`, or Parquet files to `output_path`.

    The same range and watermark protocol as `RabbitMQStreamReadOperator` (start at the watermark,
    end at the tails when the task starts, a persisted plan re-read exactly by a retry, watermarks
    stored only after the sink succeeded), read by rmqs's own reader in the worker process: no JVM,
    no pyspark, memory bounded by `queueCapacity` whatever the range.

    :param apply_function: a callable or a dotted path (`my_pkg.sink.handle`) called with every
        `pyarrow.RecordBatch` of the source schema (`value`, `stream`, `offset`, `chunk_timestamp`
        and the `metadata_fields`), then `*apply_function_args, **apply_function_kwargs`.
    :param output_path: instead, a directory (or `s3://...` URI pyarrow can write): one Parquet file
        per partition stream and run, `<stream>-<start>-<end>.parquet`, written under a temporary
        name and renamed when complete; a retry of the same range replaces it. A local folder also
        gets a commit record per run (`_rmqs_commits/`): a retry of a committed range reads nothing.
    :param output_format: "parquet" (default) or "iceberg": then `output_path` is an Iceberg table
        (`namespace.table`, created from the source schema) in the pyiceberg catalog configured by
        `iceberg_catalog` (pyiceberg catalog properties, e.g. `{"type": "sql", "uri": "sqlite:///...",
        "warehouse": "file:///..."}`, and optionally its `name`, default "rmqs"); each run is one
        atomic append whose snapshots carry its range token, so a replayed range is recognised from
        the table itself and not appended again.
    :param source_options: reader options: `queueCapacity`, `initialCredits`, `pollTimeoutMs`,
        `maxWaitMs`, `filterValues`, `filterMatchUnfiltered`, `strictDecoding`.
    The other parameters are the read operator's.
    """

    template_fields: Sequence[str] = (
        "stream",
        "superstream",
        "consumer_name",
        "start",
        "end",
        "starting_offsets",
        "max_messages",
        "output_path",
        "apply_function_args",
        "apply_function_kwargs",
        "source_options",
    )
    template_fields_renderers = {"start": "json", "end": "json", "source_options": "json"}

    def __init__(
        self,
        *,
        consumer_name: str | None = None,
        start: Any = "watermark",
        end: Any = "latest",
        starting_offsets: str = "earliest",
        max_messages: int | str | None = None,
        apply_function: Callable[..., Any] | str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        output_path: str | None = None,
        output_format: str = "parquet",
        iceberg_catalog: Mapping[str, str] | None = None,
        store_watermark: bool = True,
        fail_on_data_loss: bool = True,
        metadata_fields: str | None = None,
        source_options: Mapping[str, str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)  # one run per consumer name at a time
        super().__init__(**kwargs)
        if (output_path is None) == (apply_function is None):
            raise ValueError("give exactly one of 'output_path' or 'apply_function'")
        if output_format not in ("parquet", "iceberg"):
            raise ValueError(f"output_format must be 'parquet' or 'iceberg'; got {output_format!r}")
        if start == "watermark" and not consumer_name:
            raise ValueError("start='watermark' needs a consumer_name (its stored offset is the watermark)")
        self.consumer_name = consumer_name
        self.start = start
        self.end = end
        self.starting_offsets = starting_offsets
        self.max_messages = max_messages
        self.apply_function = apply_function
        self.apply_function_args = apply_function_args
        self.apply_function_kwargs = apply_function_kwargs
        self.output_path = output_path
        self.output_format = output_format
        self.iceberg_catalog = dict(iceberg_catalog or {})
        self.store_watermark = store_watermark
        self.fail_on_data_loss = fail_on_data_loss
        self.metadata_fields = metadata_fields
        self.source_options = source_options

    def _lineage_paths(self) -> tuple[list[str], list[str]]:
        return [], [str(self.output_path)] if self.output_path else []

    def _sink(self) -> Any:
        from pyspark_rmqs import consume

        if self.output_path is not None and self.output_format == "iceberg":
            from pyspark_rmqs.iceberg import IcebergSink

            return IcebergSink(str(self.output_path), self.iceberg_catalog)
        if self.output_path is not None:
            return consume.ParquetSink(str(self.output_path))
        fn = resolve_callable(self.apply_function, "apply_function")  # type: ignore[arg-type]
        return consume.FunctionSink(
            fn, *(self.apply_function_args or ()), **(self.apply_function_kwargs or {})
        )

    def execute(self, context: Any) -> dict[str, Any]:
        from pyspark_rmqs import consume

        conn = self.connection()
        with airflow_failures(secret_values(conn)):
            plan = plan_bounded_read(self, conn, "consuming")
            summary = consume.run_consume(
                conn,
                plan,
                self._sink(),
                store_watermark=self.store_watermark,
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
    :param producer_name: the broker-side producer name (deduplication of re-sent messages within
        the publisher's sequence; a later run continues after the last stored publishing id).
    :param routing_strategy: `hash` (default, as the Java and Go clients), `key` (the super stream's
        bindings) or `custom` with `partitioner_class`.
    Returns `{"target", "messages": {partition stream: count}, "rows", "seconds"}` once every
    message is confirmed.
    """

    _operation = "write"
    template_fields: Sequence[str] = (
        "stream",
        "superstream",
        "producer_function_args",
        "producer_function_kwargs",
        "producer_name",
    )

    def __init__(
        self,
        *,
        producer_function: Callable[..., Iterable[Any]] | str,
        producer_function_args: Sequence[Any] | None = None,
        producer_function_kwargs: Mapping[str, Any] | None = None,
        producer_name: str | None = None,
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
        self.routing_strategy = routing_strategy
        self.partitioner_class = partitioner_class
        self.compression = compression
        self.batch_size = batch_size
        self.confirm_timeout_ms = confirm_timeout_ms

    def execute(self, context: Any) -> dict[str, Any]:
        from pyspark_rmqs import produce
        from pyspark_rmqs.broker.writer import WriteSettings

        conn = self.connection()
        fn = resolve_callable(self.producer_function, "producer_function")
        t0 = time.monotonic()
        with airflow_failures(secret_values(conn)):
            settings = WriteSettings(
                producer_name=values.optional_str(self.producer_name),
                routing_strategy=self.routing_strategy,
                partitioner_class=self.partitioner_class,
                compression=self.compression,
                batch_size=int(self.batch_size),
                confirm_timeout_ms=int(self.confirm_timeout_ms),
            )
            messages = fn(*(self.producer_function_args or ()), **(self.producer_function_kwargs or {}))
            counts = produce.publish(
                conn,
                messages or (),
                stream=values.optional_str(self.stream),
                superstream=values.optional_str(self.superstream),
                settings=settings,
            )
        target = values.optional_str(self.superstream) or str(values.optional_str(self.stream))
        self._summary = {
            "target": target,
            "messages": counts,
            "rows": sum(counts.values()),
            "seconds": round(time.monotonic() - t0, 3),
        }
        self.log.info("rmqs: produced %s", self._summary)
        return self._summary


def pipeline_of(context: Any) -> str | None:
    """`dag_id/task_id` of the running task (the pipeline identity in run summaries)."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None:
        return None
    return f"{ti.dag_id}/{ti.task_id}"


def retries_of(context: Any) -> int:
    """How many tries of this task ran before this one."""
    ti = context.get("ti") if hasattr(context, "get") else None
    try:
        return max(0, int(ti.try_number) - 1) if ti is not None else 0
    except (TypeError, ValueError):
        return 0


def plan_bounded_read(op: Any, conn: ConnectionOptions, verb: str) -> jobs.ReadPlan:
    """The read and consume operators' plan: their parameters, rendered, through `jobs.plan_read`."""
    plan = jobs.plan_read(
        conn,
        **op._target(),
        consumer=values.optional_str(op.consumer_name),
        start=values.position(op.start, "start", "watermark"),
        end=values.position(op.end, "end", "latest"),
        max_messages=values.optional_int(op.max_messages, "max_messages"),
        starting_offsets=str(op.starting_offsets).strip().lower(),
        fail_on_data_loss=op.fail_on_data_loss,
        persist=op.store_watermark,
    )
    op.log.info(
        "rmqs: %s '%s' ranges %s%s",
        verb,
        plan.target,
        plan.ranges or "(nothing new)",
        " (the pending plan of a failed try)" if plan.resumed else "",
    )
    return plan
