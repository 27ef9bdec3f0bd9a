"""Least privilege at the Airflow edge (issue 46): a team allowed only its own streams (and read and
write on the existing `rmqs.runs`) runs watermark runs; a refusal fails the task for good
(`AirflowFailException`, never retried) naming the stream, the permission and the fix."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs.operators import (
    RabbitMQStreamConsumeOperator,
    RabbitMQStreamDrainOperator,
    RabbitMQStreamProduceOperator,
    RabbitMQStreamReadOperator,
)
from airflow_rmqs.sensors import RabbitMQStreamLagSensor
from airflow_rmqs.triggers import RabbitMQStreamLagTrigger
from pyspark_rmqs.errors import AccessRefusedError
from pyspark_rmqs.runs import record
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish
from tests.support.permissions import RUNS, limited_user, team_prefix

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]


def refused(run: Callable[[], Any], stream: str, permission: str) -> str:
    """Run a task that must fail for good on a refused `permission` on `stream`; its message."""
    with pytest.raises(AirflowFailException) as e:  # not retried: AirflowFailException skips retries
        run()
    text = str(e.value)
    assert text.startswith("AccessRefusedError: access refused"), text
    assert f"stream '{stream}'" in text and f"needs the {permission} permission" in text, text
    assert "rabbitmqctl set_permissions" in text, text
    return text


@pytest.fixture
def team(broker: BrokerSettings, streams: StreamFactory) -> tuple[str, str]:
    """(team regex, one of the team's streams holding 300 messages); `rmqs.runs` exists."""
    prefix = team_prefix()
    s = streams.stream(prefix)
    publish(broker, s, [f"m-{i}".encode() for i in range(300)])
    record.ensure_stream(conn_of(broker))
    return f"^{prefix}-.*", s


def _watermark_run(
    got: list[pa.RecordBatch], *, stream: str | None = None, superstream: str | None = None
) -> RabbitMQStreamConsumeOperator:
    """Consumer `etl`'s watermark run of `stream` or `superstream` into `got`, as team A's connection."""
    return RabbitMQStreamConsumeOperator(
        task_id="c",
        stream=stream,
        superstream=superstream,
        consumer_name="etl",
        apply_function=got.append,
        rabbitmq_stream_conn_id="team_a",
    )


def test_watermark_run_with_only_its_streams_fails_for_good_naming_rmqs_runs(
    broker: BrokerSettings, team: tuple[str, str], conn_env: Any
) -> None:
    own, s = team
    with limited_user(broker, configure=own, write=own, read=own) as t:
        conn_env("team_a", t.uri)
        got: list[pa.RecordBatch] = []
        op = _watermark_run(got, stream=s)
        text = refused(lambda: op.execute({}), "rmqs.runs", "read")
        assert "needs read and write on it" in text and t.password not in text
    assert got == [] and client(broker).stored_offset("etl", s) is None


def test_watermark_run_with_read_and_write_on_the_existing_rmqs_runs_delivers_every_offset(
    broker: BrokerSettings, team: tuple[str, str], conn_env: Any
) -> None:
    own, s = team
    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t:
        conn_env("team_a", t.uri)
        got: list[pa.RecordBatch] = []
        op = _watermark_run(got, stream=s)
        out = op.execute({})
        offsets = sorted(o for b in got for o in b["offset"].to_pylist())
        assert out["rows"] == 300 and out["watermark_stored"] is True and offsets == list(range(300))
        assert client(broker).stored_offset("etl", s) == 299
        sensor = RabbitMQStreamLagSensor(
            task_id="lag", stream=s, consumer_name="etl", max_lag=0, rabbitmq_stream_conn_id="team_a"
        )
        assert sensor.poke({}).is_done


def test_backfill_needs_only_read_on_its_stream(
    broker: BrokerSettings, team: tuple[str, str], conn_env: Any
) -> None:
    """A run that stores no watermark keeps no record: no `rmqs.runs`, no write anywhere."""
    own, s = team
    with limited_user(broker, configure="^$", write="^$", read=own) as t:
        conn_env("team_r", t.uri)
        got: list[pa.RecordBatch] = []
        op = RabbitMQStreamConsumeOperator(
            task_id="b",
            stream=s,
            start="earliest",
            end="latest",
            store_watermark=False,
            apply_function=got.append,
            rabbitmq_stream_conn_id="team_r",
        )
        out = op.execute({})
        assert out["rows"] == 300 and sorted(o for b in got for o in b["offset"].to_pylist()) == list(
            range(300)
        )
    with limited_user(broker, configure="^$", write="^$", read="^$") as t:
        conn_env("team_r", t.uri)
        refused(lambda: op.execute({}), s, "read")


def test_sensor_trigger_and_produce_refusals_are_final(
    broker: BrokerSettings, team: tuple[str, str], conn_env: Any
) -> None:
    own, s = team
    with limited_user(broker, configure="^$", write="^$", read="^$") as t:
        conn_env("nobody", t.uri)
        sensor = RabbitMQStreamLagSensor(
            task_id="lag", stream=s, consumer_name="etl", max_lag=0, rabbitmq_stream_conn_id="nobody"
        )
        refused(lambda: sensor.poke({}), s, "read")
        trigger = RabbitMQStreamLagTrigger(
            stream=s, consumer_name="etl", max_lag=0, rabbitmq_stream_conn_id="nobody", poll_interval=0.1
        )

        async def first_event() -> Any:
            return await asyncio.wait_for(anext(aiter(trigger.run())), 30)

        with pytest.raises(AccessRefusedError) as e:  # the triggerer ends the trigger: the task fails
            asyncio.run(first_event())
        assert (e.value.resource, e.value.permission) == (s, "read")
    with limited_user(broker, configure="^$", write="^$", read=own) as t:
        conn_env("reader", t.uri)
        produce = RabbitMQStreamProduceOperator(
            task_id="p", stream=s, producer_function=lambda: [b"x"], rabbitmq_stream_conn_id="reader"
        )
        refused(lambda: produce.execute({}), s, "write")
    assert client(broker).tail(s) == 300


def test_a_named_produce_run_needs_read_and_write_on_rmqs_runs(
    broker: BrokerSettings, team: tuple[str, str], conn_env: Any
) -> None:
    own, s = team
    with limited_user(broker, configure="^$", write=own, read=own) as t:
        conn_env("team_w", t.uri)
        named = RabbitMQStreamProduceOperator(
            task_id="p",
            stream=s,
            producer_name="loader",
            producer_function=lambda: [b"x"] * 50,
            rabbitmq_stream_conn_id="team_w",
        )
        refused(lambda: named.execute({}), "rmqs.runs", "read")
        assert client(broker).tail(s) == 300  # refused before it sent anything
    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t:
        conn_env("team_w", t.uri)
        assert named.execute({})["rows"] == 50
        assert client(broker).tail(s) == 350


@pytest.mark.spark
def test_spark_drain_and_read_need_read_and_write_on_rmqs_runs(
    spark: Any, broker: BrokerSettings, team: tuple[str, str], conn_env: Any, tmp_path: Path
) -> None:
    """The Spark operators as the Spark-free one: refused for good without `rmqs.runs`, every offset
    with read and write on it (executors connect as the same limited user)."""
    own, s = team

    def drain(name: str) -> RabbitMQStreamDrainOperator:
        return RabbitMQStreamDrainOperator(
            task_id="drain",
            stream=s,
            consumer_name="team-drain",
            checkpoint_location=str(tmp_path / f"cp-{name}"),
            output_path=str(tmp_path / f"drain-{name}"),
            rabbitmq_stream_conn_id="team_s",
            timeout=120,
        )

    with limited_user(broker, configure=own, write=own, read=own) as t:
        conn_env("team_s", t.uri)
        refused(lambda: drain("refused").execute({}), "rmqs.runs", "read")
    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t:
        conn_env("team_s", t.uri)
        assert drain("allowed").execute({})["rows"] == 300
        read = RabbitMQStreamReadOperator(
            task_id="read",
            stream=s,
            consumer_name="team-read",
            output_path=str(tmp_path / "read"),
            rabbitmq_stream_conn_id="team_s",
        ).execute({})
        assert read["rows"] == 300 and read["watermark_stored"] is True
    for folder in ("drain-allowed", "read"):
        got = sorted(pq.read_table(tmp_path / folder, columns=["offset"])["offset"].to_pylist())
        assert got == list(range(300)), folder  # every offset once
    assert client(broker).stored_offsets("team-read", [s]) == {s: 299}


def test_a_super_stream_partition_outside_the_team_pattern_fails_the_run_for_good(
    broker: BrokerSettings, streams: StreamFactory, conn_env: Any
) -> None:
    """The consume operator on a super stream `<team>-...` one of whose partitions the team may not
    read: the task fails for good naming that partition, before anything is read or stored."""
    prefix = team_prefix()
    ss, parts = streams.super_stream(2, prefix=prefix)
    other = streams.add_partition(ss, 2, name=f"other{prefix}-{ss}-2")
    for p in (*parts, other):
        publish(broker, p, [b"m"] * 30)
    record.ensure_stream(conn_of(broker))
    own = f"^{prefix}-.*"
    got: list[pa.RecordBatch] = []

    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t:
        conn_env("team_a", t.uri)
        refused(lambda: _watermark_run(got, superstream=ss).execute({}), other, "read")
    assert got == [] and set(client(broker).stored_offsets("etl", [*parts, other]).values()) == {None}
    read = f"{own}|^other{prefix}-.*|{RUNS}"
    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=read) as t:
        conn_env("team_a", t.uri)
        assert _watermark_run(got, superstream=ss).execute({})["rows"] == 90
    pairs = sorted(
        pair for b in got for pair in zip(b["stream"].to_pylist(), b["offset"].to_pylist(), strict=True)
    )
    assert pairs == sorted((p, o) for p in (*parts, other) for o in range(30))  # each offset once
    assert client(broker).stored_offsets("etl", [*parts, other]) == dict.fromkeys((*parts, other), 29)
