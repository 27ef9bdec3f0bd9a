"""OpenLineage (issue 17): every operator reports its stream and paths as datasets and its offset ranges.

A stream's dataset is `namespace = rabbitmq-stream://host:port`, `name = vhost/stream`: joined with
"/" they are the stream's Airflow asset URI. The end-to-end test runs a real DAG with the
OpenLineage provider's file transport and reads the emitted COMPLETE events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_rmqs.assets import asset_uri, convert_asset_to_openlineage, create_asset
from airflow_rmqs.get_provider_info import get_provider_info
from airflow_rmqs.operators import (
    RabbitMQStreamConsumeOperator,
    RabbitMQStreamDrainOperator,
    RabbitMQStreamProduceOperator,
    RabbitMQStreamPublishOperator,
    RabbitMQStreamReadOperator,
)
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = [pytest.mark.airflow]

pytest.importorskip("airflow.providers.openlineage", reason="the rmqs[openlineage] extra is not installed")


def joined(ds: Any) -> str:
    return f"{ds.namespace}/{ds.name}"


def test_the_asset_converter_is_registered_and_round_trips_the_uri() -> None:
    (entry,) = get_provider_info()["asset-uris"]
    assert entry["to_openlineage_converter"] == "airflow_rmqs.assets.convert_asset_to_openlineage"
    asset = create_asset(host="Broker.example", port=5552, vhost="/", stream="orders")
    ds = convert_asset_to_openlineage(asset, None)
    assert (ds.namespace, ds.name) == ("rabbitmq-stream://broker.example:5552", "%2F/orders")
    assert joined(ds) == asset.uri


def test_consume_reports_the_stream_the_files_and_the_ranges(
    broker: BrokerSettings, streams: Any, tmp_path: Path
) -> None:
    s = streams.stream("ol")
    publish(broker, s, [b"a"] * 25)
    op = RabbitMQStreamConsumeOperator(
        task_id="c", stream=s, consumer_name="ol", output_path=str(tmp_path / "out"), metadata_fields=""
    )
    op.execute({})
    lineage = op.get_openlineage_facets_on_complete(None)
    (stream_ds,) = lineage.inputs
    assert joined(stream_ds) == asset_uri(host=broker.host, port=broker.port, vhost=broker.vhost, stream=s)
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file", str(tmp_path / "out"))]
    facet = lineage.run_facets["rabbitmqStream"]
    assert facet.ranges == {s: [0, 25]} and facet.rows == 25 and facet.rowsPerStream == {s: 25}
    assert facet.operation == "read" and facet.watermarkStored is True


def test_produce_reports_the_stream_as_output(broker: BrokerSettings, streams: Any) -> None:
    s = streams.stream("olp")
    op = RabbitMQStreamProduceOperator(task_id="p", stream=s, producer_function=lambda: [b"x", b"y"])
    op.execute({})
    lineage = op.get_openlineage_facets_on_complete(None)
    assert lineage.inputs == []
    assert [joined(d) for d in lineage.outputs] == [
        asset_uri(host=broker.host, port=broker.port, vhost=broker.vhost, stream=s)
    ]
    assert lineage.run_facets["rabbitmqStream"].rowsPerStream == {s: 2}


def test_spark_operators_report_streams_and_paths_before_and_after_a_run(broker: BrokerSettings) -> None:
    uri = asset_uri(host=broker.host, port=broker.port, vhost=broker.vhost, stream="orders")
    read = RabbitMQStreamReadOperator(
        task_id="r", superstream="orders", consumer_name="c", output_path="s3://lake/o"
    )
    lin = read.get_openlineage_facets_on_complete(None)
    assert [joined(d) for d in lin.inputs] == [uri] and [(d.namespace, d.name) for d in lin.outputs] == [
        ("s3://lake", "/o")
    ]
    assert lin.run_facets == {}  # not run: no ranges to report
    read._summary = {
        "target": "orders",
        "start_offsets": {"orders-0": 5},
        "end_offsets": {"orders-0": 9},
        "rows": 4,
    }
    assert read.get_openlineage_facets_on_complete(None).run_facets["rabbitmqStream"].ranges == {
        "orders-0": [5, 9]
    }
    drain = RabbitMQStreamDrainOperator(
        task_id="d", stream="orders", consumer_name="c", checkpoint_location="/cp", output_path="/lake/d"
    )
    lin = drain.get_openlineage_facets_on_complete(None)
    assert [joined(d) for d in lin.inputs] == [uri] and [d.name for d in lin.outputs] == ["/lake/d"]
    pub = RabbitMQStreamPublishOperator(task_id="p", stream="orders", input_path="/lake/in")
    lin = pub.get_openlineage_facets_on_complete(None)
    assert [d.name for d in lin.inputs] == ["/lake/in"] and [joined(d) for d in lin.outputs] == [uri]


DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamProduceOperator

with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    produce = RabbitMQStreamProduceOperator(
        task_id="produce", stream="{stream}", producer_function=lambda: [f"m{{i}}" for i in range(30)]
    )
    consume = RabbitMQStreamConsumeOperator(
        task_id="consume", stream="{stream}", consumer_name="lineage", output_path="{out}"
    )
    produce >> consume
"""

RUNNER = """
import importlib.util, json, sys
from airflow.utils import db
db.initdb()
spec = importlib.util.spec_from_file_location("lineage_dag", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
run = module.dag.test()
print("RESULT " + json.dumps({ti.task_id: str(ti.state) for ti in run.get_task_instances()}))
"""


@pytest.mark.slow
def test_a_dag_run_emits_complete_events_with_rmqs_datasets_and_facets(
    broker: BrokerSettings, streams: Any, tmp_path: Path
) -> None:
    s = streams.stream("oldag")
    home, out, events = tmp_path / "airflow", tmp_path / "lake", tmp_path / "events"
    (home / "dags").mkdir(parents=True)
    events.mkdir()
    dag_file = home / "dags" / "lineage_dag.py"
    dag_file.write_text(DAG.format(dag_id=f"lineage_{s}".replace("-", "_"), stream=s, out=out))
    (tmp_path / "runner.py").write_text(textwrap.dedent(RUNNER))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": broker.uri,
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "rmqs-test",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(events / "ol.jsonl"), "append": True}
            ),
            "TZ": "UTC",
        }
    )
    done = subprocess.run(
        [sys.executable, str(tmp_path / "runner.py"), str(dag_file)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    result = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, f"the DAG run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert json.loads(result[0]) == {"produce": "success", "consume": "success"}
    emitted = [
        json.loads(line) for f in events.iterdir() for line in f.read_text().splitlines() if line.strip()
    ]
    complete = {
        e["job"]["name"].rsplit(".", 1)[-1]: e
        for e in emitted
        if e.get("eventType") == "COMPLETE" and e["job"]["name"].rsplit(".", 1)[-1] in ("produce", "consume")
    }
    assert set(complete) == {"produce", "consume"}, [(e.get("eventType"), e["job"]["name"]) for e in emitted]
    uri = asset_uri(host=broker.host, port=broker.port, vhost=broker.vhost, stream=s)
    consume, produce = complete["consume"], complete["produce"]
    assert [f"{d['namespace']}/{d['name']}" for d in produce["outputs"]] == [uri]
    assert [f"{d['namespace']}/{d['name']}" for d in consume["inputs"]] == [uri]
    assert [(d["namespace"], d["name"]) for d in consume["outputs"]] == [("file", str(out))]
    facet = consume["run"]["facets"]["rabbitmqStream"]
    assert facet["rows"] == 30 and facet["ranges"] == {s: [0, 30]} and facet["watermarkStored"] is True
    assert produce["run"]["facets"]["rabbitmqStream"]["rowsPerStream"] == {s: 30}
