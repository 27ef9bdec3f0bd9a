"""Operators: thin wrappers over `pyspark_rmqs.runs.steps` (Spark) and `consume` / `produce` (plain Python).

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

Modules by reason to change: this one holds the Spark operators; `airflow_rmqs.spark_sessions`
how they get a SparkSession (pyspark present, a Connect URL and token from a connection);
`airflow_rmqs.plain_operators` the operators without Spark (imported here, so every operator is
`from airflow_rmqs.operators import ...`); `airflow_rmqs.operator_base` what they share (the
stream target, lineage, the bounded-read parameters of the read and consume operators).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
from airflow_rmqs.plain_operators import RabbitMQStreamConsumeOperator, RabbitMQStreamProduceOperator
from airflow_rmqs.spark_sessions import (
    SPARK_EXTRA,
    connect_secrets,
    connect_session,
    is_connect,
    require_pyspark,
    reuse_session,
    spark_connect_url,
)
from pyspark_rmqs import jobs
from pyspark_rmqs.core.redact import redact_text
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.runs.outputs.delivery import check_delivery, takes_token

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The Spark operators' templated Spark settings: a connection id and `spark_conf` from params or Variables.
SPARK_FIELDS: tuple[str, ...] = ("spark_conn_id", "spark_conf")
SPARK_RENDERERS = {"spark_conf": "json"}

__all__ = [
    "SPARK_EXTRA",
    "RabbitMQStreamConsumeOperator",
    "RabbitMQStreamDrainOperator",
    "RabbitMQStreamProduceOperator",
    "RabbitMQStreamPublishOperator",
    "RabbitMQStreamReadOperator",
    "connect_secrets",
    "require_pyspark",
    "spark_connect_url",
]


class _SparkOperator(_StreamOperator):
    """Connection and SparkSession plumbing shared by the Spark operators (the `rmqs[spark]` extra).

    :param spark_conn_id: an Airflow connection of type `spark_connect` (the Apache Spark provider's
        Spark Connect connection: Host `sc://host` or `host`, Port default 15002, Token in Password,
        User ID in Login, extra `use_ssl`), or of type `spark` whose Host is a master URL
        (`local[4]`, `spark://host` with Port, `yarn`, `k8s://...`). Only these fields are read, so
        a `generic` connection laid out the same way works too. Keeps the token out of DAG code; it
        is masked in task logs. Templated.
    :param spark_master: master of the local session (default `local[2]`); ignored with a remote.
    :param spark_conf: extra Spark configuration for the session (templated: its values may be
        Jinja, e.g. `{"spark.executor.memory": "{{ var.value.etl_memory }}"}`).
    :param spark_remote: a Spark Connect URL (`sc://host:15002`); prefer `spark_conn_id`, which
        keeps a token out of DAG code.

    `on_kill` (a task marked failed or timed out) interrupts this run's Spark jobs, locally and
    over Spark Connect, and stops a running streaming query. Over Spark Connect each try has a
    session of its own, released when its Spark work ends.
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

    _spark_secrets: list[str] = []
    _reuse_session = True  # the Spark connection's extra `reuse_session`
    _owns_session = False  # a Connect session this try created, released when it ends

    def _remote_and_master(self) -> tuple[str | None, str | None]:
        if not self.spark_conn_id:
            self._spark_secrets = connect_secrets(self.spark_remote)
            return self.spark_remote, self.spark_master
        from airflow.sdk import BaseHook
        from airflow.sdk.log import mask_secret

        conn = BaseHook.get_connection(self.spark_conn_id)
        remote, master = spark_connect_url(conn)
        self._reuse_session = reuse_session(conn)
        token = (conn.extra_dejson if conn.extra else {}).get("token")
        self._spark_secrets = connect_secrets(remote, conn.password, token)
        for secret in self._spark_secrets:
            mask_secret(secret)
        return remote, master or self.spark_master

    def spark_session(self) -> SparkSession:
        """A local session (reusing the process's active one) or a Spark Connect session.

        The session carries a job tag for this task try, so `on_kill` interrupts only its jobs.
        """
        require_pyspark(type(self).__name__)
        remote, master = self._remote_and_master()
        try:
            if remote:
                spark = connect_session(
                    remote, self.spark_conf, self.spark_app_name, reuse_session=self._reuse_session
                )
                self._owns_session = True
            else:
                spark = jobs.spark_session(master=master, conf=self.spark_conf, app=self.spark_app_name)
        except Exception as e:  # PySpark quotes the whole URL, token included, in some errors
            text = str(e)
            clean = redact_text(text, self._spark_secrets)
            if clean == text:
                raise
            what = f"{type(e).__name__}: {clean}"
            if isinstance(e, ValueError):  # an invalid Connect URL: the same on every retry
                raise AirflowFailException(what) from None
            raise RuntimeError(what) from None
        self._job_tag = f"rmqs-{self.task_id}-{uuid.uuid4().hex[:8]}".replace(".", "-")
        # Spark Connect tags the session's operations; a local driver tags this thread's jobs
        # (SparkContext job tags: the session's interruptTag does not reach Dataset actions there).
        if is_connect(spark):
            spark.addTag(self._job_tag)
        else:
            spark.sparkContext.addJobTag(self._job_tag)
        self._spark = spark
        return spark

    def _untag(self) -> None:
        """The end of this try's Spark work: drop its job tag, release the Connect session it created."""
        if self._spark is not None and self._job_tag is not None:
            try:
                if is_connect(self._spark):
                    self._spark.removeTag(self._job_tag)
                else:
                    self._spark.sparkContext.removeJobTag(self._job_tag)
            except Exception:
                self.log.debug("removing the job tag failed", exc_info=True)
        if self._spark is not None and self._owns_session:
            self._spark.stop()  # best effort, never raises; no longer the process's default session
            self._owns_session = False

    def _spark_stopped(self) -> bool:
        return bool(getattr(self._spark, "is_stopped", False))  # a released Connect session

    def on_kill(self) -> None:
        """Stop this run's streaming query and interrupt its Spark jobs (local or Spark Connect)."""
        if self._query is not None:
            try:
                self._query.stop()
                self.log.info("rmqs: stopped the streaming query %s", self._query.id)
            except Exception:
                self.log.warning("rmqs: stopping the streaming query failed", exc_info=True)
        if self._spark is not None and self._job_tag is not None and not self._spark_stopped():
            try:
                if is_connect(self._spark):
                    interrupted = self._spark.interruptTag(self._job_tag)
                else:
                    interrupted = self._spark.sparkContext.cancelJobsWithTag(self._job_tag)
                self.log.info("rmqs: interrupted Spark operations %s (tag %s)", interrupted, self._job_tag)
            except Exception:
                self.log.warning("rmqs: interrupting the Spark jobs failed", exc_info=True)


class RabbitMQStreamReadOperator(_BoundedReadOperator, _SparkOperator):
    """Reads `[start, end)` of a stream or super stream with Spark into a sink, then advances the watermark.

    :param output_path: write the rows there with `output_format` / `output_mode` / `output_options`.
    :param process: instead of `output_path`, `process(df, context)` is the sink; a `process` taking a
        `token` keyword also gets the run's range token
        (`pyspark_rmqs.runs.outputs.delivery.RunToken`), the same for every retry of the range, to make
        its own writes idempotent (MERGE on stream and offset).
    :param delivery: "exactly_once" (default) stages, publishes and commits `output_path`'s files
        under the run's range token, so a retry of a committed range writes nothing again;
        "at_least_once" writes straight to `output_path` (a retry may write a range twice).
    The bounded-read parameters (`consumer_name`, `start`, `end`, `starting_offsets`,
    `max_messages`, `store_watermark`, `fail_on_data_loss`, `metadata_fields`) are documented on
    `airflow_rmqs.operator_base._BoundedReadOperator`, shared with `RabbitMQStreamConsumeOperator`;
    the Spark ones (`spark_conn_id`, ...) on `_SparkOperator`.
    """

    template_fields: Sequence[str] = (
        *BOUNDED_READ_FIELDS,
        "output_path",
        "output_format",
        "output_mode",
        "output_options",
        *SPARK_FIELDS,
    )
    template_fields_renderers = {**BOUNDED_READ_RENDERERS, "output_options": "json", **SPARK_RENDERERS}

    def __init__(
        self,
        *,
        output_path: str | None = None,
        output_format: str = "parquet",
        output_mode: str = "append",
        output_options: Mapping[str, str] | str | None = None,
        output_partition_by: list[str] | None = None,
        process: Callable[..., Any] | None = None,
        delivery: str = "exactly_once",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (output_path is None) == (process is None):
            raise ValueError("give exactly one of 'output_path' or 'process'")
        self.output_path = output_path
        self.output_format = output_format
        self.output_mode = output_mode
        self.output_options = output_options
        self.output_partition_by = output_partition_by
        self.process = process
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
            plan = self.plan(conn, "reading", context)
            try:
                # Nothing to read: no session. A local one is a new JVM, 4-9 s of a task that
                # otherwise takes a fraction of a second (docs/performance.md, the cost of starting Spark).
                summary = jobs.run_read(
                    None if plan.is_empty else self.spark_session(),
                    conn,
                    plan,
                    self._sink(context),
                    store_watermark=self.stores,
                    metadata_fields=self.metadata_fields,
                    pipeline=pipeline_of(context),
                    retry_count=retries_of(context),
                )
            finally:
                plan.release()  # run_read releases too; this covers a session that failed to start
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
        *CONNECTION_FIELDS,
        *SPARK_FIELDS,
    )
    template_fields_renderers = {"output_options": "json", "source_options": "json", **SPARK_RENDERERS}

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
            try:
                summary = jobs.run_drain(
                    self.spark_session(),
                    conn,
                    **self._target().kw(),
                    consumer=self.consumer_name,
                    checkpoint=self.checkpoint_location,
                    output_path=self.output_path,
                    output_format=self.output_format,
                    output_options=values.options(self.output_options, "output_options"),
                    source_options=values.options(self.source_options, "source_options"),
                    timeout_s=float(self.timeout),
                    pipeline=pipeline_of(context),
                    retry_count=retries_of(context),
                )
            finally:  # a failed drain releases its job tag and its Connect session too
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
        *CONNECTION_FIELDS,
        *SPARK_FIELDS,
    )
    template_fields_renderers = {"input_options": "json", "sink_options": "json", **SPARK_RENDERERS}

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
        target = self._target()
        t0 = time.monotonic()
        with airflow_failures(secret_values(conn)):
            spark = self.spark_session()
            df = self._dataframe(spark, context)
            if "value" not in df.columns:
                raise ConfigurationError(
                    f"the dataset to publish needs a 'value' column (binary or string); it has {df.columns}"
                )
            df, observation = jobs.observe_counts(df)
            try:
                (
                    df.write.format("rabbitmq_streams")
                    .options(**conn.to_options())
                    .options(**target.kw())
                    .options(**values.options(self.sink_options, "sink_options"))
                    .mode("append")
                    .save()
                )
            finally:
                self._untag()
        counts = jobs.observed_counts(observation)
        summary = {
            "target": target.name,
            "rows": counts["rows"] if counts else None,
            "bytes": counts["bytes"] if counts else None,
            "seconds": round(time.monotonic() - t0, 3),
        }
        self.log.info("rmqs: published %s", summary)
        self._summary = summary
        return summary
