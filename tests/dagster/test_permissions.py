"""Least privilege at the Dagster edge (issue 46): a refused permission fails an asset's or a lag
check's step for good (`Failure(allow_retries=False)`: no retry even under a RetryPolicy) and a
sensor's tick (new data, observation) with `AccessRefusedError`, naming the stream, the permission
and the fix; read and write on the existing `rmqs.runs` are enough for a watermark run, read on the
stream for a sensor or a lag check."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from dagster import (
    AssetSelection,
    DagsterEventType,
    Definitions,
    RetryPolicy,
    build_sensor_context,
    define_asset_job,
    materialize,
)

from dagster_rmqs import (
    build_lag_check,
    build_new_data_sensor,
    build_observation_sensor,
    build_stream_asset,
)
from pyspark_rmqs.errors import AccessRefusedError, classify
from pyspark_rmqs.runs import record
from tests.conftest import StreamFactory
from tests.dagster.conftest import resource_of
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish
from tests.support.permissions import RUNS, grant, limited_user, team_prefix

pytestmark = [pytest.mark.dagster, pytest.mark.timeout(300)]


def _team_stream(broker: BrokerSettings, streams: StreamFactory, messages: list[bytes]) -> tuple[Any, ...]:
    """A team's stream holding `messages` (and `rmqs.runs`, as an administrator made it), its
    permission pattern, and the Arrow watermark asset (collecting its batches), its lag check and
    its new-data sensor."""
    prefix = team_prefix()
    s = streams.stream(prefix)
    publish(broker, s, messages)
    record.ensure_stream(conn_of(broker))
    got: list[pa.RecordBatch] = []
    asset = _arrow_asset(s, got)
    return s, f"^{prefix}-.*", got, asset, build_lag_check(asset, max_lag=0), build_new_data_sensor(asset)


def _arrow_asset(stream: str, got: list[pa.RecordBatch], **kwargs: Any) -> Any:
    """Consumer `dg-team`'s Arrow watermark asset of `stream`, collecting its batches in `got`."""
    return build_stream_asset(
        "team_orders", stream=stream, consumer_name="dg-team", sink=got.append, engine="arrow", **kwargs
    )


def test_arrow_asset_refused_then_allowed_with_read_and_write_on_rmqs_runs(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    prefix = team_prefix()
    s = streams.stream(prefix)
    publish(broker, s, [f"m-{i}".encode() for i in range(200)])
    record.ensure_stream(conn_of(broker))
    own = f"^{prefix}-.*"
    got: list[pa.RecordBatch] = []

    def asset() -> Any:
        return _arrow_asset(s, got, retry_policy=RetryPolicy(max_retries=2))

    with limited_user(broker, configure=own, write=own, read=own) as t:
        result = materialize([asset()], resources={"rabbitmq": resource_of(t)}, raise_on_error=False)
        assert not result.success
        assert not [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
        (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        text = str(failure.step_failure_data.error)
        assert "AccessRefusedError: access refused" in text and "stream 'rmqs.runs'" in text
        assert "needs the read permission" in text and "rabbitmqctl set_permissions" in text
        assert t.password not in text
    assert got == [] and client(broker).stored_offset("dg-team", s) is None

    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t:
        result = materialize([asset()], resources={"rabbitmq": resource_of(t)}, raise_on_error=False)
        assert result.success
    assert sorted(o for b in got for o in b["offset"].to_pylist()) == list(range(200))
    assert client(broker).stored_offset("dg-team", s) == 199


def _offsets(got: list[pa.RecordBatch]) -> list[int]:
    return sorted(o for b in got for o in b["offset"].to_pylist())


def test_sensor_asset_and_lag_check_with_the_team_permissions_deliver_every_offset_once(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    """`^team-.*` everywhere plus read and write on the existing `rmqs.runs`: the new-data sensor
    requests a run per new range, the asset delivers each offset once and moves the watermark, and
    the lag check measures the lag before and after; a user who may only read the stream runs the
    sensor and the check as well."""
    s, own, got, asset, check, sensor = _team_stream(broker, streams, [f"m-{i}".encode() for i in range(120)])

    def tick(cursor: str | None, resources: dict[str, Any]) -> Any:
        return sensor(build_sensor_context(cursor=cursor, resources=resources))

    def lag_alone(resources: dict[str, Any]) -> int:
        alone = materialize(
            [asset, check], resources=resources, selection=AssetSelection.checks(check), raise_on_error=False
        )
        (evaluation,) = alone.get_asset_check_evaluations()
        assert evaluation.passed is (evaluation.metadata["total_lag"].value == 0)
        return int(evaluation.metadata["total_lag"].value)

    with (
        limited_user(broker, configure=own, write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t,
        limited_user(
            broker, configure="^$", write="^$", read=own
        ) as ro,  # the sensor and check need only this
    ):
        team, reader = {"rabbitmq": resource_of(t)}, {"rabbitmq": resource_of(ro)}
        first = tick(None, team)
        (request,) = first.run_requests
        assert request.tags["rmqs/lag"] == "120" and json.loads(first.cursor) == {s: 120}
        assert lag_alone(team) == 120
        run = materialize([asset, check], resources=team)
        (evaluation,) = run.get_asset_check_evaluations()
        assert evaluation.passed and evaluation.metadata["total_lag"].value == 0
        assert _offsets(got) == list(range(120)) and client(broker).stored_offset("dg-team", s) == 119
        assert not tick(first.cursor, team).run_requests  # nothing new: no request

        publish(broker, s, [f"n-{i}".encode() for i in range(80)])
        tail = client(broker).tail(s)  # 202: the run's two tracking entries took offsets 120 and 121
        second = tick(first.cursor, reader)
        (request,) = second.run_requests
        assert request.tags["rmqs/lag"] == str(tail - 120) and json.loads(second.cursor) == {s: tail}
        assert request.run_key != first.run_requests[0].run_key
        assert lag_alone(reader) == tail - 120  # lag counts offsets, tracking entries included
        assert materialize([asset, check], resources=team).success
        assert lag_alone(reader) == 0 and not tick(second.cursor, reader).run_requests
    # Every message offset exactly once over both runs; the watermark at the last one.
    assert _offsets(got) == [*range(120), *range(tail - 80, tail)]
    assert client(broker).stored_offset("dg-team", s) == tail - 1


def test_lag_check_and_sensor_refusals_are_typed_and_never_retried(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    """Without read on the stream, the lag check fails its step for good (no retry under the job's
    RetryPolicy) and the sensors' ticks raise `AccessRefusedError`, each naming stream, permission
    and fix; the asset, allowed to read but not to write `rmqs.runs`, commits nothing and runs
    once granted."""
    s, own, got, asset, check, sensor = _team_stream(broker, streams, [b"m"] * 30)
    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=RUNS) as t:
        resources = {"rabbitmq": resource_of(t)}
        job = define_asset_job(
            "lag_only", selection=AssetSelection.checks(check), op_retry_policy=RetryPolicy(max_retries=2)
        )
        defs = Definitions(assets=[asset], asset_checks=[check], jobs=[job], resources=resources)
        result = defs.resolve_job_def("lag_only").execute_in_process(raise_on_error=False)
        assert not result.success
        assert not [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
        (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        text = str(failure.step_failure_data.error)
        assert "AccessRefusedError: access refused" in text and f"stream '{s}'" in text, text
        assert "needs the read permission" in text and "rabbitmqctl set_permissions" in text
        assert t.password not in text

        for sx in (sensor, build_observation_sensor(asset)):
            with pytest.raises(AccessRefusedError) as e:
                sx(build_sensor_context(resources=resources))
            assert (e.value.resource, e.value.permission) == (s, "read")
            assert not classify(e.value).retryable and "rabbitmqctl set_permissions" in str(e.value)

    retried = _arrow_asset(s, got, retry_policy=RetryPolicy(max_retries=2))
    with limited_user(broker, configure="^$", write=own, read=f"{own}|{RUNS}") as t:
        team = {"rabbitmq": resource_of(t)}
        result = materialize([retried], resources=team, raise_on_error=False)
        assert not result.success
        assert not [e for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
        (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
        text = str(failure.step_failure_data.error)
        assert "AccessRefusedError: access refused" in text and "stream 'rmqs.runs'" in text, text
        assert "needs the write permission" in text
        assert got == [] and client(broker).stored_offset("dg-team", s) is None
        # Granted in place, the same process runs at once (the lease was freed), every offset once.
        grant(broker, t, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}")
        assert materialize([retried], resources=team).success
    assert _offsets(got) == list(range(30)) and client(broker).stored_offset("dg-team", s) == 29
