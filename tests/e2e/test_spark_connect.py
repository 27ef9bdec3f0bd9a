"""The cluster path: Spark Connect against a local Connect server (PySpark's bundled one).

The server auto-registers `rabbitmq_streams` from the installed package; a separate client
process reads and runs the watermark protocol over Connect, as the Airflow operator
(`spark_remote=`) and the Dagster `SparkSessionResource(remote=)` do through `jobs.spark_session`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerSettings
from tests.support.connect_server import start_connect_server
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

TOKEN = "rmqs-e2e-connect-token"


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared test server (tests/support/connect_server.py), token-protected as in production."""
    server = start_connect_server(tmp_path_factory.mktemp("connect"), TOKEN)
    try:
        yield f"{server.url}/;token={TOKEN}"
    finally:
        server.stop()


CLIENT = textwrap.dedent(
    """
    import json, sys
    from pyspark_rmqs.jobs import plan_read, run_read, spark_session, write_output
    from pyspark_rmqs.options import parse_connection_options

    url, stream, out, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    conn = parse_connection_options(options)
    spark = spark_session(remote=url)
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    count = spark.read.format("rabbitmq_streams").options(**conn.to_options(), stream=stream).load().count()
    plan = plan_read(conn, stream=stream, consumer="over-connect")
    summary = run_read(spark, conn, plan, write_output(out))
    print("RESULT " + json.dumps({"count": count, "summary": summary.to_dict()}))
    """
)


def test_read_and_watermark_over_spark_connect(
    connect_url: str,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    s = streams.stream()
    publish(broker, s, [f"c{i}".encode() for i in range(300)])
    out = tmp_path / "out"
    options = conn_of(broker).to_options()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_CONNECT")}
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, connect_url, s, str(out), json.dumps(options)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["count"] == 300
    assert result["summary"]["start_offsets"] == {s: 0} and result["summary"]["end_offsets"] == {s: 300}
    assert client(broker).stored_offset("over-connect", s) == 299
    import pyarrow.dataset as ds

    values = sorted(
        ds.dataset(str(out), format="parquet").to_table(columns=["value"]).column("value").to_pylist()
    )
    assert values == sorted(f"c{i}".encode() for i in range(300))
