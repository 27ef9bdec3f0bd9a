"""How a stream asset reads a planned range: with Spark, or with Arrow batches and no Spark.

Both engines run the same watermark protocol (DESIGN §4): the plan is fixed by `jobs.plan_read`,
the rows reach the output, and only then (for a watermark run) the watermark is stored, checked
against concurrent runs. `SparkEngine` uses `jobs.run_read` with a DataFrame sink; `ArrowEngine`
uses the Spark-free core `pyspark_rmqs.consume.run_consume` (one Parquet file per partition stream
and range, or a function per `pyarrow.RecordBatch`) and never imports pyspark.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dagster import AssetExecutionContext

from dagster_rmqs.resources import session_of
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.jobs import ReadPlan, RunSummary
from pyspark_rmqs.options import ConnectionOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EngineName = Literal["spark", "arrow"]
ENGINES: tuple[EngineName, ...] = ("spark", "arrow")


@dataclass(frozen=True)
class Output:
    """Where the rows go: files under `path`, or a `sink` function (engine-specific argument)."""

    path: str | None = None
    format: str = "parquet"
    mode: str = "append"
    options: Mapping[str, str] = field(default_factory=dict)
    partition_by: Sequence[str] = ()
    sink: Callable[[Any], Any] | None = None
    delivery: str = "exactly_once"
    # A time window's folder, replaced whole by each materialization: every run writes its whole
    # range (no skipping of offsets an earlier, about-to-be-removed run committed there).
    replaces: bool = False

    @property
    def uri(self) -> str | None:
        return self.path


class Engine(Protocol):
    @property
    def name(self) -> EngineName: ...

    @property
    def output(self) -> Output: ...

    @property
    def spark_key(self) -> str | None:
        """The resource key of the SparkSession the engine reads with; None: it needs no Spark."""
        ...

    def read(
        self,
        context: AssetExecutionContext,
        conn: ConnectionOptions,
        plan: ReadPlan,
        *,
        store_watermark: bool,
    ) -> RunSummary: ...

    def with_output(self, output: Output) -> "Engine":
        """The same engine writing to `output` (a time window's own folder)."""
        ...


@dataclass(frozen=True)
class SparkEngine:
    """`jobs.run_read`: one Spark job reading `[start, end)`; the sink takes the DataFrame."""

    output: Output
    spark_key: str = "spark"
    metadata_fields: str | None = None
    name: EngineName = "spark"

    def with_output(self, output: Output) -> "SparkEngine":
        return replace(self, output=output)

    def writer(self) -> "Callable[[DataFrame], Any]":
        if self.output.sink is not None:
            return self.output.sink
        from pyspark_rmqs.jobs import write_output

        o = self.output
        parts = list(o.partition_by) or None
        out = write_output(str(o.path), o.format, o.mode, dict(o.options), parts, delivery=o.delivery)
        return replace(out, skip_committed=not o.replaces)

    def read(
        self,
        context: AssetExecutionContext,
        conn: ConnectionOptions,
        plan: ReadPlan,
        *,
        store_watermark: bool,
    ) -> RunSummary:
        from pyspark_rmqs.jobs import run_read

        # Nothing to read: no session (run_read touches Spark only for a non-empty plan).
        spark = None if plan.is_empty else session_of(getattr(context.resources, self.spark_key))
        return run_read(
            spark,
            conn,
            plan,
            self.writer(),
            store_watermark=store_watermark,
            metadata_fields=self.metadata_fields,
            pipeline=context.asset_key.to_user_string(),
            retry_count=context.retry_number,
        )


@dataclass(frozen=True)
class ArrowEngine:
    """`consume.run_consume`: Arrow batches, no Spark; Parquet files per range or a batch function."""

    output: Output
    metadata_fields: str | None = None
    source_options: Mapping[str, str] = field(default_factory=dict)
    name: EngineName = "arrow"
    spark_key: None = None
    # The resource key of an `ObjectStoreResource` holding the output's credentials (None: the
    # process's own, e.g. the AWS environment, or a local folder).
    storage_key: str | None = None

    def with_output(self, output: Output) -> "ArrowEngine":
        return replace(self, output=output)

    def storage_options(self, context: AssetExecutionContext) -> dict[str, Any] | None:
        """fsspec options from the `ObjectStoreResource` under `storage_key` (None without one)."""
        if not self.storage_key:
            return None
        options: dict[str, Any] = getattr(context.resources, self.storage_key).fsspec_options()
        return options

    def read(
        self,
        context: AssetExecutionContext,
        conn: ConnectionOptions,
        plan: ReadPlan,
        *,
        store_watermark: bool,
    ) -> RunSummary:
        from pyspark_rmqs.consume import ParquetSink, run_consume  # pyarrow, loaded only in a run

        o = self.output
        options = self.storage_options(context)
        sink: Any = o.sink
        if sink is None:
            sink = ParquetSink(str(o.path), skip_committed=not o.replaces, storage_options=options)
        return run_consume(
            conn,
            plan,
            sink,
            store_watermark=store_watermark,
            metadata_fields=self.metadata_fields,
            source_options=dict(self.source_options),
            pipeline=context.asset_key.to_user_string(),
            retry_count=context.retry_number,
        )


def make_engine(
    engine: str,
    output: Output,
    *,
    spark_key: str,
    metadata_fields: str | None,
    source_options: Mapping[str, str] | None,
    storage_key: str | None = None,
) -> Engine:
    if engine == "spark" and storage_key:
        raise ConfigurationError(
            "output_storage_key is for engine='arrow': Spark writes through its own file systems "
            "(for s3a://, Hadoop's S3A settings in the Spark configuration)"
        )
    if engine == "spark":
        return SparkEngine(output, spark_key, metadata_fields)
    if engine == "arrow":
        if output.sink is None and output.format != "parquet":
            raise ConfigurationError(
                f"engine='arrow' writes Parquet (one file per partition stream and range); "
                f"got output_format={output.format!r}: use engine='spark' or a sink function"
            )
        if output.partition_by or output.mode != "append" or output.options:
            raise ConfigurationError(
                "engine='arrow' names its files by range (a retried range replaces its file): "
                "output_mode, output_options and partition_by are for engine='spark'"
            )
        return ArrowEngine(output, metadata_fields, dict(source_options or {}), storage_key=storage_key)
    raise ConfigurationError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
