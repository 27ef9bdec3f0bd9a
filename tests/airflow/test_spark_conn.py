"""Spark from an Airflow connection (issue 17): `spark_conn_id` holds the Connect URL and token; `on_kill`
interrupts the task's Spark jobs (locally, and over Spark Connect).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from airflow_rmqs.operators import RabbitMQStreamReadOperator, connect_secrets, spark_connect_url
from tests.support.broker import BrokerSettings
from tests.support.data import client, publish
from tests.support.threads import start_capturing

pytestmark = [pytest.mark.airflow]


class Conn:
    def __init__(
        self, host: str, port: int | None = None, password: str | None = None, extra: str = ""
    ) -> None:
        self.conn_id, self.host, self.port, self.password, self.extra = "spark", host, port, password, extra

    @property
    def extra_dejson(self) -> dict[str, Any]:
        import json

        return json.loads(self.extra) if self.extra else {}


def test_connect_url_from_a_connection_carries_the_token_and_ssl() -> None:
    url, master = spark_connect_url(Conn("sc://spark.example", 443, "t0k3n", '{"use_ssl": true}'))
    assert (url, master) == ("sc://spark.example:443/;use_ssl=true;token=t0k3n", None)
    url, _ = spark_connect_url(Conn("spark.example", None, None, '{"token": "x", "user_id": "etl"}'))
    assert url == "sc://spark.example:15002/;user_id=etl;token=x"
    assert spark_connect_url(Conn("local[2]")) == (None, "local[2]")
    assert spark_connect_url(Conn("spark://master", 7077)) == (None, "spark://master:7077")


def test_a_token_with_reserved_characters_survives_the_connect_url() -> None:
    """PySpark splits the URL's parameters on ';' and '=' and percent-decodes each value."""
    from pyspark.sql.connect.client import DefaultChannelBuilder

    token = "a/b+c=d;e%f"
    url, _ = spark_connect_url(Conn("sc://spark.example", 15002, token, '{"user_id": "etl;x"}'))
    assert url is not None and token not in url
    parsed = DefaultChannelBuilder(url)
    assert (parsed.token, parsed.userId, parsed.endpoint) == (token, "etl;x", "spark.example:15002")
    # What is masked in logs and redacted from errors: the URL and the token, as typed and encoded.
    hidden = connect_secrets(url, token)
    assert {url, token, "a%2Fb%2Bc%3Dd%3Be%25f"} <= set(hidden)


def test_spark_conn_id_and_spark_remote_are_exclusive() -> None:
    with pytest.raises(ValueError, match="not both"):
        RabbitMQStreamReadOperator(
            task_id="r",
            stream="s",
            consumer_name="c",
            output_path="/x",
            spark_conn_id="a",
            spark_remote="sc://b",
        )


def _long_job(df: Any, context: Any) -> None:
    df.sparkSession.range(0, 10**13, 1, 2).selectExpr("sum(id % 7)").collect()


def _run_and_kill(
    op: RabbitMQStreamReadOperator, wait_s: float = 120.0
) -> tuple[BaseException | None, float]:
    t, failure = start_capturing(lambda: op.execute({}))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:  # until the long job runs (a kill before it would not stop it)
        spark = op._spark
        if spark is not None and spark.sparkContext.statusTracker().getActiveJobsIds():
            break
        time.sleep(0.2)
    time.sleep(1.0)
    killed_at = time.monotonic()
    op.on_kill()
    t.join(wait_s)
    assert not t.is_alive(), "on_kill did not stop the Spark job"
    return (failure[0] if failure else None), time.monotonic() - killed_at


@pytest.mark.slow
def test_on_kill_interrupts_the_local_spark_job(
    spark: Any, broker: BrokerSettings, streams: Any, conn_env: Any, tmp_path: Path
) -> None:
    s = streams.stream("kill")
    publish(broker, s, [b"x"] * 10)
    conn_env("spark_local", "generic://local%5B2%5D")  # host local[2]: a local driver
    op = RabbitMQStreamReadOperator(
        task_id="r", stream=s, consumer_name="k", process=_long_job, spark_conn_id="spark_local"
    )
    err, took = _run_and_kill(op)
    assert err is not None and took < 60
    assert "cancel" in str(err).lower() or "interrupt" in str(err).lower(), err
    assert client(broker).stored_offset("k", s) is None  # the watermark stays: nothing was stored


def test_a_failed_drain_releases_its_job_tag(spark: Any, broker: BrokerSettings, tmp_path: Path) -> None:
    """A drain that fails still ends its try's Spark work: its job tag is dropped (and a Connect
    session it created is released), so later jobs of the process are not interrupted with it."""
    from airflow_rmqs.operators import RabbitMQStreamDrainOperator

    op = RabbitMQStreamDrainOperator(
        task_id="d",
        stream="rmqs-no-such-stream",
        consumer_name="c",
        checkpoint_location=str(tmp_path / "ck"),
        output_path=str(tmp_path / "out"),
    )
    with pytest.raises(Exception, match="does not exist"):
        op.execute({})
    assert op._job_tag is not None
    assert op._job_tag not in spark.sparkContext.getJobTags()
