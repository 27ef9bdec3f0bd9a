"""Exactly-once for a Dagster stream asset: its process SIGKILLed at each point of a run, then re-executed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dagster import materialize

from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset
from pyspark_rmqs.runs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import conn_of, publish

pytestmark = [pytest.mark.spark, pytest.mark.broker]


@pytest.mark.parametrize("kill", ["sink", "commit", "stored"])
def test_an_asset_run_killed_anywhere_then_reexecuted_writes_every_offset_once(
    spark: Any, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, kill: str
) -> None:
    if broker.external or broker.username != "guest":
        pytest.skip("the killed process connects with the local broker's defaults")
    s = streams.stream("eod")
    publish(broker, s, [f"m{i}".encode() for i in range(300)])
    out = tmp_path / "out"
    cfg = {
        "endpoints": f"{broker.host}:{broker.port}",
        "stream": s,
        "consumer": "eod",
        "out": str(out),
        "kill": kill,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.faults.dagster_job", json.dumps(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -9, f"the run was not killed ({done.returncode}): {done.stderr[-3000:]}"
    asset = build_stream_asset("eo", stream=s, consumer_name="eod", output_path=str(out))
    rabbitmq = RabbitMQStreamsResource(endpoints=f"{broker.host}:{broker.port}")
    result = materialize([asset], resources={"rabbitmq": rabbitmq, "spark": spark})
    assert result.success
    meta = result.asset_materializations_for_node("eo")[0].metadata
    rows = spark.read.parquet(str(out)).select("stream", "offset").collect()
    assert sorted((r.stream, r.offset) for r in rows) == [(s, o) for o in range(300)]  # each offset once
    assert watermarks(conn_of(broker), "eod", stream=s).partitions[0].stored == 299
    written = meta["rmqs/records_written"].value
    assert written == {"sink": 300, "commit": 0, "stored": 0}[kill]
    assert meta["rmqs/delivery"].value == "exactly_once" and meta["rmqs/pipeline"].value == "eo"
