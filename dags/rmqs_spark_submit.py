"""A watermark run as a Spark cluster job: SparkSubmitOperator -> the run's outcome -> downstream.

The Spark driver is not the Airflow worker's process: `SparkSubmitOperator` runs `spark-submit`
of rmqs's application (`pyspark_rmqs.jobs.APPLICATION`), and the job runs the whole watermark run
in its driver: it takes the consumer's lease, plans `[watermark + 1, tail)` or resumes the
consumer's unfinished run record whole, reads on the cluster into the exactly-once Parquet output,
commits it, and only then stores the watermark (docs/deployment.md, "Cluster jobs"). A retried
task submits the same job again and it resumes the same range; a second run on the consumer fails
with exit code 75 before it starts Spark. The worker's side only submits, then reads where the run
stands from the broker (`jobs.job_outcome`: the run record and the lag) into XCom, and gates on lag.

The broker connection reaches the job through its environment (`env_vars`, rendered from the
Airflow connection and masked in the UI), never its arguments, which spark-submit logs. Environment
(defaults in brackets): RMQS_DEMO_SUPERSTREAM [orders], RMQS_DEMO_OUTPUT
[demo-output/orders-spark-submit], RMQS_DEMO_CONSUMER [rmqs-demo-spark-submit], RMQS_DEMO_CONN_ID
[rabbitmq_stream_default], RMQS_DEMO_SPARK_CONN_ID [spark_default] (a Spark connection, e.g.
AIRFLOW_CONN_SPARK_DEFAULT='spark://master-host:7077?deploy-mode=client'; `spark-submit` on the
worker's PATH), RMQS_DEMO_SPARK_CONF [{}] (JSON: spark-submit --conf), RMQS_DEMO_MAX_LAG [1000].
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, task

from pyspark_rmqs.jobs import APPLICATION

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
OUTPUT = os.path.abspath(os.environ.get("RMQS_DEMO_OUTPUT", "demo-output/orders-spark-submit"))
CONSUMER = os.environ.get("RMQS_DEMO_CONSUMER", "rmqs-demo-spark-submit")
CONN_ID = os.environ.get("RMQS_DEMO_CONN_ID", "rabbitmq_stream_default")
SPARK_CONN_ID = os.environ.get("RMQS_DEMO_SPARK_CONN_ID", "spark_default")
SPARK_CONF = json.loads(os.environ.get("RMQS_DEMO_SPARK_CONF", "{}"))
MAX_LAG = int(os.environ.get("RMQS_DEMO_MAX_LAG", "1000"))


def broker(field: str, default: str = "") -> str:
    """A field of the rmqs connection, as a template rendered when the task runs (not at parse)."""
    return "{{ conn.get('" + CONN_ID + "')." + field + (f" or '{default}'" if default else "") + " }}"


with DAG(
    dag_id="rmqs_spark_submit",
    schedule="@hourly",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one run per consumer name at a time (a second one would be turned away)
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    tags=["rmqs", "example"],
) as dag:
    read = SparkSubmitOperator(
        task_id="read_on_the_cluster",
        conn_id=SPARK_CONN_ID,
        application=APPLICATION,
        name="rmqs-{{ dag.dag_id }}",
        conf=SPARK_CONF,
        application_args=[
            "--superstream",
            SUPERSTREAM,
            "--consumer",
            CONSUMER,
            "--output",
            OUTPUT,
            # The run's identity, the same on every try of this task: recorded with the run.
            "--pipeline",
            "{{ dag.dag_id }}/{{ task.task_id }}/{{ run_id }}",
            "--retry-count",
            "{{ ti.try_number - 1 }}",
        ],
        # RMQS_* as the `rmqs` command reads them. The password is masked in the rendered fields
        # (Airflow masks a connection's password, and keys named like a password).
        env_vars={
            "RMQS_ENDPOINTS": broker("host") + ":" + broker("port", "5552"),
            "RMQS_USERNAME": broker("login"),
            "RMQS_PASSWORD": broker("password"),
            "RMQS_VHOST": broker("schema", "/"),
        },
    )

    @task
    def outcome(**context: Any) -> dict[str, Any]:
        """Where the job left the run, from the broker: stored, its range, the lag now (XCom)."""
        from airflow_rmqs.hooks import RabbitMQStreamHook
        from pyspark_rmqs.jobs import job_outcome

        got = job_outcome(RabbitMQStreamHook(CONN_ID).get_conn(), CONSUMER, superstream=SUPERSTREAM)
        pipeline = f"{context['dag'].dag_id}/read_on_the_cluster/{context['run_id']}"
        if not got.finished:
            raise RuntimeError(f"the job left its run {got.state}: the next try of the job resumes it")
        if got.lag is not None and got.lag > MAX_LAG:
            raise RuntimeError(f"consumer '{CONSUMER}' is {got.lag} messages behind (max {MAX_LAG})")
        return {**got.to_dict(), "this_run": got.pipeline == pipeline}

    read >> outcome()
