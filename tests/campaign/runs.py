"""One try of a run through the public Airflow operator, and what a pipeline's output holds.

Every run is `RabbitMQStreamConsumeOperator(...).execute({})` (the Spark consumer's:
`RabbitMQStreamReadOperator`, on the process's local SparkSession), as an Airflow worker calls it: a
watermark run (`start="watermark"`), a backfill over explicit offsets (stores nothing) or a run
with an explicit start that stores (`store_watermark=True`). What it returned or raised is kept
whole in an `Attempt`; the machine decides what that means for the model.

Outputs are read as their users read them: an at-least-once function sink's list as the function
saw it, an exactly-once Parquet folder through rmqs's committed reader (`pyspark_rmqs.committed`:
only files a commit names), never by listing the folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamReadOperator
from pyspark_rmqs.committed import committed_dataset, committed_files
from pyspark_rmqs.core.errors import ConsumerBusyError, DataLossError, LeaseLostError, RmqsError
from pyspark_rmqs.errors import classify
from tests.campaign.faults import Hooks, function_sink
from tests.campaign.model import PipelineModel, TargetModel
from tests.campaign.object_store import sink_options, storage_options
from tests.support.broker import BrokerSettings

CONN_ID = "rmqs_campaign"

Row = tuple[bytes, str, int]  # (body, partition stream, offset)
LOST = re.compile(r"offsets \[(\d+), (\d+)\) of stream '([^']+)' are lost")


def use_broker(settings: BrokerSettings) -> None:
    """The operators' Airflow connection `rmqs_campaign`, from the environment (no metadata DB)."""
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = settings.uri


@dataclass
class Attempt:
    """One `execute()`: the summary it returned or the exception it raised."""

    kind: str  # "watermark" | "capped" (max_messages) | "backfill" | "explicit" | "timed" (time range)
    started_seq: int  # the model's publish counter when the try began
    summary: dict[str, Any] | None = None
    error: BaseException | None = None
    rows: list[Row] = field(default_factory=list)  # what a backfill's own sink received

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def error_class(self) -> str | None:
        """The rmqs error class the failure is (or an Airflow fail exception names), else None."""
        if self.error is None:
            return None
        if isinstance(self.error, RmqsError):
            return type(self.error).__name__
        if isinstance(self.error, Exception):
            return classify(self.error).error
        return None

    @property
    def cause(self) -> str | None:
        """The class name of what the run raised (through Dagster: of the step's innermost cause)."""
        if self.error is None:
            return None
        return getattr(self.error, "cause", None) or type(self.error).__name__

    @property
    def label(self) -> str:
        """`ok`, the rmqs error class, or the exception's class (the stats' outcome names)."""
        if self.error is None:
            return "ok"
        return self.error_class or self.cause or "?"

    @property
    def busy(self) -> bool:
        """Stopped before planning: another run holds the consumer name."""
        if isinstance(self.error, ConsumerBusyError):
            return not isinstance(self.error, LeaseLostError)
        return self.cause == "ConsumerBusyError"

    @property
    def retryable(self) -> bool:
        """A typed failure the orchestrator retries (busy, broker unavailable or timed out)."""
        return (
            self.error_class is not None
            and isinstance(self.error, Exception)
            and classify(self.error).retryable
        )

    @property
    def data_loss(self) -> bool:
        return isinstance(self.error, DataLossError) or self.error_class == "DataLossError"

    @property
    def lost_spans(self) -> dict[str, list[int]]:
        """The offsets `[start, end)` per stream the try reported lost: its summary's `data_loss`, or
        the spans a `DataLossError` names (rmqs's one wording, `core.errors.lost_message`)."""
        spans: dict[str, list[int]] = {}
        for stream, span in ((self.summary or {}).get("data_loss") or {}).items():
            spans[str(stream)] = [int(span[0]), int(span[1])]
        if self.data_loss and self.error is not None:
            for start, end, stream in LOST.findall(str(self.error)):
                spans[stream] = [int(start), int(end)]
        return spans

    @property
    def resumed(self) -> bool:
        return bool(self.summary and self.summary.get("resumed_plan"))

    @property
    def ends(self) -> dict[str, int]:
        """The end of the range the run read, per partition stream (its summary's `end_offsets`)."""
        found = (self.summary or {}).get("end_offsets") or {}
        return {str(s): int(e) for s, e in found.items()}

    def describe(self) -> str:
        if self.error is None:
            keep = ("rows", "mode", "resumed_plan", "sink_skipped", "start_offsets", "end_offsets")
            return f"ok { ({k: self.summary[k] for k in keep if self.summary and k in self.summary}) }"
        return f"{type(self.error).__name__}: {str(self.error)[:300]}"


def execute(
    target: TargetModel,
    pipeline: PipelineModel,
    *,
    output: Path | str | None,
    hooks: Hooks,
    rows: list[Row],
    started_seq: int,
    kind: str = "watermark",
    start: Any = "watermark",
    end: Any = "latest",
    store_watermark: bool | None = None,
    max_messages: int | None = None,
    fail_on_data_loss: bool = True,
    iceberg_catalog: dict[str, str] | None = None,
) -> Attempt:
    """Run the consume operator once for `pipeline`; never raises what the run raised (`output`: a
    folder, or an Iceberg table in `iceberg_catalog` for the Iceberg consumer)."""
    where: dict[str, Any] = {"superstream": target.name} if target.superstream else {"stream": target.name}
    sink: dict[str, Any] = (
        sink_options(str(output)) if output is not None else {"apply_function": function_sink(hooks, rows)}
    )
    attempt = Attempt(kind, started_seq, rows=rows)
    if pipeline.sink == "iceberg":
        sink = {"output_path": str(output), "output_format": "iceberg", "iceberg_catalog": iceberg_catalog}
    if pipeline.engine == "spark":
        assert output is not None, "the Spark consumer writes an exactly-once Parquet folder"
        # No console progress bars between the runner's lines (read when the session starts).
        sink = {"output_path": str(output), "spark_conf": {"spark.ui.showConsoleProgress": "false"}}
    try:
        operator = RabbitMQStreamReadOperator if pipeline.engine == "spark" else RabbitMQStreamConsumeOperator
        op = operator(
            task_id=f"campaign-{pipeline.consumer}",
            rabbitmq_stream_conn_id=CONN_ID,
            consumer_name=pipeline.consumer,
            starting_offsets=pipeline.starting,
            start=start,
            end=end,
            store_watermark=store_watermark,
            max_messages=max_messages,
            fail_on_data_loss=fail_on_data_loss,
            **where,
            **sink,
        )
        attempt.summary = op.execute({})
    except BaseException as e:  # the injected Crash is a BaseException on purpose
        attempt.error = e
    return attempt


def parquet_rows(path: Path | str) -> list[Row]:
    """Every (body, stream, offset) in the committed files of an exactly-once folder (a local one,
    or `s3://`), repeats kept."""
    options = storage_options(str(path))
    if isinstance(path, Path) and not path.exists():
        return []
    if not committed_files(str(path), storage_options=options):
        return []
    return table_rows(committed_dataset(str(path), storage_options=options).to_table(columns=list(COLUMNS)))


def is_typed(error: BaseException) -> bool:
    """An rmqs error, or a failure naming one (Airflow's fail exception, a Dagster step's cause)."""
    if isinstance(error, RmqsError):
        return True
    return isinstance(error, Exception) and classify(error).error is not None


def iceberg_rows(catalog: dict[str, str], table: str) -> list[Row]:
    """Every (body, stream, offset) in an Iceberg table (its current snapshot), repeats kept."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    try:
        found = load_catalog(catalog.get("name", "rmqs"), **catalog).load_table(table)  # as IcebergSink
    except NoSuchTableError:
        return []
    return table_rows(found.scan(selected_fields=COLUMNS).to_arrow())


COLUMNS = ("value", "stream", "offset")


def table_rows(t: Any) -> list[Row]:
    """(body, stream, offset) of every row of an Arrow table with `COLUMNS`."""
    return [
        (bytes(v), s, int(o)) for v, s, o in zip(*(t.column(c).to_pylist() for c in COLUMNS), strict=True)
    ]
