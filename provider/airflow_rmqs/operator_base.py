"""What every rmqs operator shares, and the bounded read the read and consume operators share.

`_StreamOperator`: a stream or super stream (checked when the DAG is parsed: exactly one of
`stream` / `superstream`) on an rmqs connection, and the OpenLineage facets of a run.
`_BoundedReadOperator`: the parameters of a bounded read under the watermark protocol (DESIGN §4),
their checks, template fields and plan. `RabbitMQStreamReadOperator` (Spark) and
`RabbitMQStreamConsumeOperator` (no Spark) add only their sinks.

Each class names its parameters explicitly in `__init__` and passes the rest on, so Airflow still
rejects an unknown argument when the DAG is parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_rmqs import values
from airflow_rmqs.failures import airflow_failures
from airflow_rmqs.hooks import RabbitMQStreamHook
from pyspark_rmqs import jobs
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options import ConnectionOptions


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
        Target.of(stream, superstream)  # fails at DAG parse time unless exactly one is given
        self.stream = stream
        self.superstream = superstream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id

    def _target(self) -> Target:
        """The stream or super stream, from the rendered template fields."""
        return Target.of(values.optional_str(self.stream), values.optional_str(self.superstream))

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

        stream = lineage.stream_dataset(self.connection(), self._target().name)
        in_paths, out_paths = self._lineage_paths()
        inputs = [lineage.path_dataset(p) for p in in_paths]
        outputs = [lineage.path_dataset(p) for p in out_paths]
        if self._operation == "read":
            inputs.insert(0, stream)
        else:
            outputs.insert(0, stream)
        return lineage.operator_lineage(inputs, outputs, self._operation, self._summary)


# Templated on every operator and sensor, as the Airflow Kafka provider templates `kafka_config_id`:
# one DAG can pick a team's or an environment's connection from params or a Variable.
CONNECTION_FIELDS: tuple[str, ...] = ("rabbitmq_stream_conn_id",)
BOUNDED_READ_FIELDS: tuple[str, ...] = (
    "stream",
    "superstream",
    "consumer_name",
    "start",
    "end",
    "starting_offsets",
    "max_messages",
    *CONNECTION_FIELDS,
)
BOUNDED_READ_RENDERERS = {"start": "json", "end": "json"}


class _BoundedReadOperator(_StreamOperator):
    """Reads `[start, end)` and, after the sink succeeded, stores `end - 1` as the watermark.

    :param consumer_name: whose broker-stored offset is the watermark (needed for `start="watermark"`).
    :param start: "watermark" (stored offset + 1; `starting_offsets` where none is stored yet),
        "earliest", "latest", per-stream offsets (dict or JSON), or a timestamp (datetime, ISO-8601
        string such as `{{ data_interval_start }}`, or epoch milliseconds).
    :param end: "latest" (the tails when the task starts), per-stream offsets, or a timestamp
        (`{{ data_interval_end }}`): the first offset the broker timestamped at or after it, where
        the next interval starts. A time the broker's clock has not reached yet fails the run with
        the retryable `OpenWindowError` before anything is read (the interval is still open).
    :param starting_offsets: where a consumer without a stored watermark starts: "earliest" or "latest".
    :param max_messages: cap on the messages one run reads, split across partitions by backlog.
    :param store_watermark: store `end - 1` per stream after the sink succeeded. Default: the runs
        that start at the watermark store it; a run of explicit offsets or times is a backfill and
        stores nothing (its summary says `mode: backfill`). True makes such a run store too, never
        moving a watermark backwards (`watermark_kept` names the partitions it left alone); False
        stores nothing. A storing run holds the consumer name's lease and writes its run record in
        the broker before reading: a retry resumes exactly that run, and a second run on the same
        name fails with `ConsumerBusyError` before it reads.
    :param fail_on_data_loss: fail when retention removed part of the range (else skip it, logged).
    :param metadata_fields: the source's `metadataFields` option (default: all metadata columns).
    :param rabbitmq_stream_conn_id: the Airflow connection (type `rabbitmq_stream`) of the broker
        (templated, default `rabbitmq_stream_default`).
    """

    template_fields: Sequence[str] = BOUNDED_READ_FIELDS
    template_fields_renderers = BOUNDED_READ_RENDERERS

    def __init__(
        self,
        *,
        consumer_name: str | None = None,
        start: Any = "watermark",
        end: Any = "latest",
        starting_offsets: str = "earliest",
        max_messages: int | str | None = None,
        store_watermark: bool | None = None,
        fail_on_data_loss: bool = True,
        metadata_fields: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)  # one run per consumer name at a time
        super().__init__(**kwargs)
        if start == "watermark" and not consumer_name:
            raise ValueError("start='watermark' needs a consumer_name (its stored offset is the watermark)")
        self.consumer_name = consumer_name
        self.start = start
        self.end = end
        self.starting_offsets = starting_offsets
        self.max_messages = max_messages
        self.store_watermark = store_watermark
        self.fail_on_data_loss = fail_on_data_loss
        self.metadata_fields = metadata_fields

    def plan(self, conn: ConnectionOptions, verb: str, context: Any = None) -> jobs.ReadPlan:
        """This run's plan from the rendered parameters, through `jobs.plan_read` (logged).

        An `end` given as a time (`{{ data_interval_end }}`) must have passed by the broker's clock
        (`plan_read` checks it first): before it has, the run fails with the retryable
        `OpenWindowError`, having read and recorded nothing; Airflow's retries (`retries`,
        `retry_delay`) run it again once the interval has ended.
        """
        target = self._target()
        start = values.position(self.start, "start", "watermark")
        end = values.position(self.end, "end", "latest")
        plan = jobs.plan_read(
            conn,
            pipeline=pipeline_of(context) if context is not None else None,
            **target.kw(),
            consumer=values.optional_str(self.consumer_name),
            start=start,
            end=end,
            max_messages=values.optional_int(self.max_messages, "max_messages"),
            starting_offsets=str(self.starting_offsets).strip().lower(),
            fail_on_data_loss=self.fail_on_data_loss,
            persist=self.store_watermark,
        )
        self.log.info(
            "rmqs: %s '%s' ranges %s (%s)%s",
            verb,
            plan.target,
            plan.ranges or "(nothing new)",
            plan.mode,
            " (resuming the run record of a failed try)" if plan.resumed else "",
        )
        return plan

    @property
    def stores(self) -> bool:
        """`store_watermark` for the run functions: the plan decides; only an explicit False stops it."""
        return self.store_watermark is not False


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
