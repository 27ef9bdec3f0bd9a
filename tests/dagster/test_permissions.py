"""Least privilege at the Dagster edge (issue 46): a refused permission fails the step for good
(`Failure(allow_retries=False)`: no retry even under a RetryPolicy) naming the stream, the
permission and the fix; read and write on the existing `rmqs.runs` are enough for a watermark run."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterEventType, RetryPolicy, materialize

from dagster_rmqs import build_stream_asset
from pyspark_rmqs.runs import record
from tests.conftest import StreamFactory
from tests.dagster.conftest import resource_of
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish
from tests.support.permissions import RUNS, limited_user, team_prefix

pytestmark = [pytest.mark.dagster, pytest.mark.timeout(300)]


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
        return build_stream_asset(
            "team_orders",
            stream=s,
            consumer_name="dg-team",
            sink=got.append,
            engine="arrow",
            retry_policy=RetryPolicy(max_retries=2),
        )

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
