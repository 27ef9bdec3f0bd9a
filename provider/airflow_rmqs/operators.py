"""Operators: bounded read, AvailableNow drain and publish, each a thin wrapper over `pyspark_rmqs.jobs`.

The watermark protocol (DESIGN §4) lives in `jobs`: the read range is fixed before reading, the
sink runs, and only after it succeeded are the watermarks stored. These operators render
templates, resolve the connection, pick a SparkSession and map errors to Airflow's retry rules;
their return value (XCom) is `RunSummary.to_dict()` and never holds connection details.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_rmqs import values
from airflow_rmqs.failures import airflow_failures
from airflow_rmqs.hooks import RabbitMQStreamHook, check_target, secret_values
from pyspark_rmqs import jobs
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.options import ConnectionOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class _SparkOperator(BaseOperator):
    """Connection and SparkSession plumbing shared by the operators.

    :param spark_master: master of the local session (default `local[2]`); ignored with `spark_remote`.
    :param spark_conf: extra Spark configuration for the session.
    :param spark_remote: a Spark Connect URL (`sc://host:15002`) to run on a cluster instead.
    """

    def __init__(
        self,
        *,
        stream: str | None = None,
        superstream: str | None = None,
        rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
        spark_master: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
        spark_remote: str | None = None,
        spark_app_name: str = "rmqs",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_target(stream, superstream)
        self.stream = stream
        self.superstream = superstream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.spark_master = spark_master
        self.spark_conf = dict(spark_conf or {})
        self.spark_remote = spark_remote
        self.spark_app_name = spark_app_name

    def _target(self) -> dict[str, str | None]:
        return {
            "stream": values.optional_str(self.stream),
            "superstream": values.optional_str(self.superstream),
        }

    def connection(self) -> ConnectionOptions:
        """The parsed connection; a bad connection definition fails the task without retries."""
        with airflow_failures():
            return RabbitMQStreamHook(self.rabbitmq_stream_conn_id).get_conn()

    def spark_session(self) -> SparkSession:
        """A local session (reusing the process's active one) or a Spark Connect session."""
        return jobs.spark_session(
            master=self.spark_master, conf=self.spark_conf, remote=self.spark_remote, app=self.spark_app_name
        )


class RabbitMQStreamReadOperator(_SparkOperator):
    """Reads `[start, end)` of a stream or super stream with Spark into a sink, then advances the watermark.

    :param consumer_name: whose broker-stored offset is the watermark (needed for `start="watermark"`).
    :param start: "watermark" (stored offset + 1; `starting_offsets` where none is stored yet),
        "earliest", "latest", per-stream offsets (dict or JSON), or a timestamp (datetime, ISO-8601
        string such as `{{ data_interval_start }}`, or epoch milliseconds).
    :param end: "latest" (the tails when the task starts), per-stream offsets, or a timestamp.
    :param max_messages: cap on the messages one run reads, split across partitions by backlog.
    :param output_path: write the rows there with `output_format` / `output_mode` / `output_options`.
    :param process: instead of `output_path`, `process(df, context)` is the sink.
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
        process: Callable[[DataFrame, Any], Any] | None = None,
        store_watermark: bool = True,
        fail_on_data_loss: bool = True,
        metadata_fields: str | None = None,
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

    def _sink(self, context: Any) -> Callable[[DataFrame], Any]:
        if self.process is not None:
            process = self.process
            return lambda df: process(df, context)
        return jobs.write_output(
            str(self.output_path),
            self.output_format,
            self.output_mode,
            values.options(self.output_options, "output_options"),
            self.output_partition_by,
        )

    def execute(self, context: Any) -> dict[str, Any]:
        conn = self.connection()
        with airflow_failures(secret_values(conn)):
            plan = jobs.plan_read(
                conn,
                **self._target(),
                consumer=values.optional_str(self.consumer_name),
                start=values.position(self.start, "start", "watermark"),
                end=values.position(self.end, "end", "latest"),
                max_messages=values.optional_int(self.max_messages, "max_messages"),
                starting_offsets=str(self.starting_offsets).strip().lower(),
                fail_on_data_loss=self.fail_on_data_loss,
                persist=self.store_watermark,
            )
            self.log.info(
                "rmqs: reading '%s' ranges %s%s",
                plan.target,
                plan.ranges or "(nothing new)",
                " (the pending plan of a failed try)" if plan.resumed else "",
            )
            summary = jobs.run_read(
                self.spark_session(),
                conn,
                plan,
                self._sink(context),
                store_watermark=self.store_watermark,
                metadata_fields=self.metadata_fields,
            )
        return summary.to_dict()


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

    def execute(self, context: Any) -> dict[str, Any]:
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
        return summary.to_dict()


class RabbitMQStreamPublishOperator(_SparkOperator):
    """Publishes a dataset to a stream or super stream through the `rabbitmq_streams` Spark sink.

    The DataFrame needs a `value` column (binary or string) and may carry the sink's other columns
    (`routing_key`, `properties`, `application_properties`, ...).

    :param input_path: read the dataset from there with `input_format` / `input_options`.
    :param dataframe_callable: instead of `input_path`, `dataframe_callable(spark, context)` returns it.
    :param sink_options: sink options such as `producerName` (broker-side deduplication of a re-run),
        `routingStrategy`, `compression`, `batchSize`.
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

    def execute(self, context: Any) -> dict[str, Any]:
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
            (
                df.write.format("rabbitmq_streams")
                .options(**conn.to_options())
                .options(**target)
                .options(**values.options(self.sink_options, "sink_options"))
                .mode("append")
                .save()
            )
        counts = jobs._observed(observation)
        summary = {
            "target": next(iter(target.values())),
            "rows": counts["rows"] if counts else None,
            "bytes": counts["bytes"] if counts else None,
            "seconds": round(time.monotonic() - t0, 3),
        }
        self.log.info("rmqs: published %s", summary)
        return summary
