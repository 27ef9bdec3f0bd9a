"""Spark drivers the cluster tier runs in processes of their own, as an orchestrator's worker would.

    python -m tests.spark_cluster.jobs <job> CONFIG_JSON

Jobs: `airflow-read` (RabbitMQStreamReadOperator), `airflow-drain` (RabbitMQStreamDrainOperator),
`airflow-dag` (an example DAG of dags/ under `dag.test()`), `dagster` (a
`build_stream_asset(engine="spark")` materialized with `SparkSessionResource(master=...)`),
`dagster-pipes` (the Pipes example running spark-submit), `time-read` (the best of a few batch
reads of a super stream, on any master: the tier compares the cluster with `local[2]`),
`spec-write` (a batch or streaming write with `spark.speculation=true`, one slow partition). Each
prints `RESULT {json}` last.

In a process of its own because a driver with a `spark://` master cannot share its process with
another session (a SparkContext per JVM), and because that is how Airflow and Dagster run them: the
task's or step's process is the client-mode driver, the executors run on the cluster. The broker's
Airflow connection comes from the environment (`AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT`).
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import Any

# The cluster session's settings, for every driver here (tests/spark_cluster/conftest.py).
DRIVER_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}


def _target(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: cfg[k] for k in ("stream", "superstream") if cfg.get(k)}


def airflow_read(cfg: dict[str, Any]) -> dict[str, Any]:
    from airflow_rmqs.operators import RabbitMQStreamReadOperator

    op = RabbitMQStreamReadOperator(
        task_id="read",
        consumer_name=cfg["consumer"],
        output_path=cfg["out"],
        spark_master=cfg["master"],
        spark_conf=DRIVER_CONF,
        **_target(cfg),
    )
    return dict(op.execute({"ti": SimpleNamespace(dag_id="cluster", task_id="read", try_number=1)}))


def airflow_drain(cfg: dict[str, Any]) -> dict[str, Any]:
    from airflow_rmqs.operators import RabbitMQStreamDrainOperator

    op = RabbitMQStreamDrainOperator(
        task_id="drain",
        consumer_name=cfg["consumer"],
        checkpoint_location=cfg["ckpt"],
        output_path=cfg["out"],
        source_options={"maxRecordsPerTrigger": "1000"},
        timeout=600,
        spark_master=cfg["master"],
        spark_conf=DRIVER_CONF,
        **_target(cfg),
    )
    return dict(op.execute({"ti": SimpleNamespace(dag_id="cluster", task_id="drain", try_number=1)}))


def airflow_dag(cfg: dict[str, Any]) -> dict[str, Any]:
    """`dag.test()` of the example DAG `cfg["dag"]` (dags/), read from the bundle folder the
    environment names (AIRFLOW__CORE__DAGS_FOLDER): the run's state, each task's, the XCom of
    `cfg["xcom"]`, and the rendered `env_vars` of `cfg["rendered"]` (what the UI would show)."""
    import importlib.util
    import os
    from pathlib import Path

    from airflow.utils import db

    db.initdb()
    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{cfg['dag']}.py"
    spec = importlib.util.spec_from_file_location(cfg["dag"], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag_run = module.dag.test()
    tis = {ti.task_id: ti for ti in dag_run.get_task_instances()}
    result: dict[str, Any] = {
        "state": str(dag_run.state),
        "states": {k: str(ti.state) for k, ti in tis.items()},
        "xcom": tis[cfg["xcom"]].xcom_pull(task_ids=cfg["xcom"]),
    }
    if cfg.get("rendered"):
        from airflow.models.renderedtifields import RenderedTaskInstanceFields

        fields = RenderedTaskInstanceFields.get_templated_fields(tis[cfg["rendered"]]) or {}
        result["rendered_env"] = fields.get("env_vars")
    return result


def dagster(cfg: dict[str, Any]) -> dict[str, Any]:
    from dagster import materialize

    from dagster_rmqs import RabbitMQStreamsResource, SparkSessionResource, build_stream_asset

    asset = build_stream_asset(
        "events", consumer_name=cfg["consumer"], output_path=cfg["out"], engine="spark", **_target(cfg)
    )
    resources = {
        "rabbitmq": RabbitMQStreamsResource(**cfg["broker"]),
        "spark": SparkSessionResource(master=cfg["master"], spark_conf=DRIVER_CONF),
    }
    result = materialize([asset], resources=resources)
    (m,) = result.asset_materializations_for_node("events")
    return {k: v.value for k, v in m.metadata.items() if isinstance(v.value, int | float | str | bool)}


def dagster_pipes(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Pipes example (dagster_rmqs/examples/pipes_spark_submit.py, configured by the RMQS_DEMO_*
    environment) materialized: spark-submit runs the job, which reports through `dagster_pipes`.
    Returns the materialization's metadata (JSON values as they are)."""
    from dagster import materialize

    from dagster_rmqs.examples import pipes_spark_submit as example

    result = materialize(
        [example.orders_on_the_cluster],
        resources={"pipes_subprocess_client": example.PipesSubprocessClient()},
        raise_on_error=False,
    )
    if not result.success:
        failures = [str(e.event_specific_data) for e in result.all_events if e.is_failure]
        raise RuntimeError(f"the Pipes asset failed: {failures}")
    (m,) = result.asset_materializations_for_node("orders_on_the_cluster")
    return {k: v.value for k, v in m.metadata.items()}


def _session(master: str, conf: dict[str, str] | None = None) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(f"rmqs-cluster-job-{master}")
    for k, v in {**DRIVER_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def time_read(cfg: dict[str, Any]) -> dict[str, Any]:
    """The best of `rounds` full reads (a `noop` write runs every task to its end), after one warm-up
    read that starts the executors' Python workers: the steady cost of a read, not the start-up."""
    spark = _session(cfg["master"])
    df = spark.read.format("rabbitmq_streams").options(**cfg["options"]).load()
    df.write.format("noop").mode("overwrite").save()
    took = []
    for _ in range(cfg["rounds"]):
        t0 = time.monotonic()
        df.write.format("noop").mode("overwrite").save()
        took.append(time.monotonic() - t0)
    spark.stop()
    return {"best_s": min(took), "all_s": took}


def spec_write(cfg: dict[str, Any]) -> dict[str, Any]:
    """A write with speculation on: partition 0 is slow (paced), so its speculative copy runs on the
    other executor and both copies write the same rows. Returns the speculative attempts seen."""
    from tests.spark_cluster.checks import task_attempts

    spark = _session(
        cfg["master"],
        {
            "spark.speculation": "true",
            "spark.speculation.interval": "200ms",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.minTaskRuntime": "1s",
            # The sink gets the slow partition's rows 50 at a time as they come (not one batch at
            # the end): both copies are publishing when the first one finishes.
            "spark.sql.execution.arrow.maxRecordsPerBatch": "50",
            "spark.buffer.size": "256",
            "spark.ui.enabled": "true",
            "spark.ui.port": str(cfg["ui_port"]),
        },
    )
    delay_s, n, parts = cfg["delay_s"], cfg["rows"], cfg["partitions"]

    def slow_first(batches: Any) -> Any:
        from pyspark import TaskContext

        slow = TaskContext.get().partitionId() == 0  # type: ignore[union-attr]
        for b in batches:
            for i in range(0, b.num_rows, 50):
                if slow:
                    time.sleep(delay_s)
                yield b.slice(i, 50)

    sink = {**cfg["options"], **({"producerName": cfg["producer"]} if cfg.get("producer") else {})}
    if cfg["mode"] == "batch":
        df = spark.range(0, n, 1, parts).selectExpr("format_string('v%06d', id) as value")
        df.mapInArrow(slow_first, "value string").write.format("rabbitmq_streams").options(**sink).mode(
            "append"
        ).save()
    else:
        src = spark.readStream.format("rabbitmq_streams").options(**cfg["source"]).load().select("value")
        q = (
            src.mapInArrow(slow_first, src.schema)
            .writeStream.format("rabbitmq_streams")
            .options(**sink)
            .option("checkpointLocation", cfg["ckpt"])
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
    attempts = task_attempts(f"http://127.0.0.1:{cfg['ui_port']}")
    spark.stop()
    copies = [
        {k: a.get(k) for k in ("stage", "index", "attempt", "executorId", "status", "duration", "launchTime")}
        for a in attempts
        if a.get("speculative")
    ]
    return {"speculative": len(copies), "attempts": len(attempts), "copies": copies}


JOBS = {
    "airflow-read": airflow_read,
    "airflow-drain": airflow_drain,
    "airflow-dag": airflow_dag,
    "dagster": dagster,
    "dagster-pipes": dagster_pipes,
    "time-read": time_read,
    "spec-write": spec_write,
}

if __name__ == "__main__":
    result = JOBS[sys.argv[1]](json.loads(sys.argv[2]))
    print("RESULT " + json.dumps(result, default=str), flush=True)
