"""One try of a run through Dagster: `build_stream_asset(...)` materialized in process.

The same watermark protocol as the Airflow operator, reached through Dagster's public factory and
`materialize()`: the arrow engine (no Spark: Parquet files and commit records, in a local folder or
in `s3://` through an `ObjectStoreResource` under `output_storage_key`), or the Spark engine (c9:
`SparkSessionResource`, the process's local session, Spark's exactly-once file commit). Dagster keeps the
exception to itself (a step failure event); its innermost cause's class and message become a
`DagsterStepError`, whose message starts `<Class>: ` so `classify` reads rmqs's errors from it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster import DagsterEventType, DagsterInstance, materialize

from dagster_rmqs import (
    ObjectStoreResource,
    RabbitMQStreamsResource,
    SparkSessionResource,
    build_stream_asset,
)
from tests.campaign import object_store
from tests.campaign.model import PipelineModel, TargetModel
from tests.campaign.runs import Attempt
from tests.support.broker import BrokerSettings


class DagsterStepError(Exception):
    """A failed materialization: `cause` is the class name of the exception the step raised."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause


class DagsterRuns:
    """Materializes one asset per pipeline on one ephemeral Dagster instance (per sequence)."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.resource = RabbitMQStreamsResource(
            endpoints=f"{settings.host}:{settings.port}",
            username=settings.username,
            password=settings.password,
            vhost=settings.vhost,
        )
        self._instance: DagsterInstance | None = None
        self._owner = threading.get_ident()

    @property
    def resources(self) -> dict[str, Any]:
        """What the assets take: the broker; the Spark engine's session (the process's local one, got
        or created as the Airflow Spark consumer's is); and, once a sequence writes to `s3://`, the
        object store's credentials (`lake`, moto's server: object_store.py)."""
        found: dict[str, Any] = {
            "rabbitmq": self.resource,
            "spark": SparkSessionResource(spark_conf={"spark.ui.showConsoleProgress": "false"}),
        }
        if object_store.started():
            s3 = object_store.server()
            found["lake"] = ObjectStoreResource(
                aws_access_key_id=s3.key,
                aws_secret_access_key=s3.secret,
                endpoint_url=s3.endpoint,
                region_name=s3.region,
            )
        return found

    @property
    def instance(self) -> DagsterInstance:
        if self._instance is None:
            self._instance = DagsterInstance.ephemeral()
        return self._instance

    @contextlib.contextmanager
    def _run_instance(self) -> Iterator[DagsterInstance]:
        """The sequence's instance in its own thread; in another (the first of two concurrent runs), an
        instance of its own, as a second run worker has (SQLite storage stays in its thread)."""
        if threading.get_ident() == self._owner:
            yield self.instance
            return
        instance = DagsterInstance.ephemeral()
        try:
            yield instance
        finally:
            instance.dispose()

    def close(self) -> None:
        """Dispose of the instance here (its SQLite storage refuses to be closed from the thread a
        garbage collection happens to run in)."""
        if self._instance is not None:
            self._instance.dispose()
            self._instance = None

    def execute(
        self,
        target: TargetModel,
        pipeline: PipelineModel,
        *,
        output: Path | str,
        started_seq: int,
        lenient: bool = False,
    ) -> Attempt:
        """Materialize `pipeline`'s asset once (`lenient`: fail_on_data_loss=False, as a user accepting
        a reported loss rebuilds it); never raises what the step raised."""
        name, asset = self.asset(target, pipeline, output=output, lenient=lenient)
        return self.materialize(asset, name, Attempt("watermark", started_seq))

    def asset(
        self, target: TargetModel, pipeline: PipelineModel, *, output: Path | str, lenient: bool = False
    ) -> tuple[str, Any]:
        """`pipeline`'s asset (`build_stream_asset`: the Spark engine for the `dagster-spark` consumer,
        else the arrow engine) and its node name."""
        where: dict[str, Any] = (
            {"superstream": target.name} if target.superstream else {"stream": target.name}
        )
        name = f"campaign_{pipeline.consumer}_{pipeline.target}"
        asset = build_stream_asset(
            name,
            consumer_name=pipeline.consumer,
            output_path=str(output),
            engine="spark" if pipeline.engine == "dagster-spark" else "arrow",
            output_storage_key="lake" if str(output).startswith("s3://") else None,
            starting_offsets="latest" if pipeline.starting == "latest" else "earliest",
            fail_on_data_loss=not lenient,
            **where,
        )
        return name, asset

    def new_data_requested(self, asset: Any) -> bool:
        """One tick of Dagster's new-data sensor of `asset` (`build_new_data_sensor`, no cursor, as
        after a restart of the daemon): whether it requests a run."""
        from dagster import build_sensor_context

        from dagster_rmqs import build_new_data_sensor

        tick = build_new_data_sensor(asset)(
            build_sensor_context(resources=self.resources, instance=self.instance)
        )
        return bool(getattr(tick, "run_requests", None))

    def observed_lag(self, asset: Any) -> int | None:
        """One tick of Dagster's observation sensor of `asset` (`build_observation_sensor`, no cursor):
        the `total_lag` its observation records (None: it recorded none)."""
        from dagster import build_sensor_context

        from dagster_rmqs import build_observation_sensor

        tick = build_observation_sensor(asset)(
            build_sensor_context(resources=self.resources, instance=self.instance)
        )
        events = getattr(tick, "asset_events", None) or []
        if not events:
            return None
        lag = events[0].metadata.get("total_lag")
        return None if lag is None else int(lag.value)

    def lag_check_passes(self, asset: Any) -> bool:
        """Dagster's blocking lag check of `asset` (`build_lag_check(max_lag=0)`), run once: whether
        it passed (downstream assets would materialize)."""
        from dagster import build_asset_check_context

        from dagster_rmqs import build_lag_check

        check = build_lag_check(asset, max_lag=0)
        result: Any = check(build_asset_check_context(resources=self.resources, instance=self.instance))
        return bool(result.passed)

    def materialize(
        self, asset: Any, name: str, attempt: Attempt, partition_key: str | None = None
    ) -> Attempt:
        """Materialize `asset` (node `name`, one partition key or none) into `attempt`: its metadata as
        the summary, or the innermost cause of the step's failure as a `DagsterStepError`."""
        with self._run_instance() as instance:
            result = materialize(
                [asset],
                resources=self.resources,
                instance=instance,
                partition_key=partition_key,
                raise_on_error=False,
            )
            if result.success:
                (m,) = result.asset_materializations_for_node(name)
                attempt.summary = {k: v.value for k, v in m.metadata.items()}
                return attempt
            attempt.error = DagsterStepError("DagsterRunFailure", "the run failed without a step failure")
            for event in result.all_events:
                if event.event_type == DagsterEventType.STEP_FAILURE and event.step_failure_data:
                    error = event.step_failure_data.error
                    while error is not None and error.cause is not None:
                        error = error.cause
                    if error is not None:
                        message = error.message.split(": ", 1)[-1].strip()
                        attempt.error = DagsterStepError(error.cls_name or "Exception", message)
            return attempt
