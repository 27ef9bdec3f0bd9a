"""A watermark run as a Spark cluster job from Dagster, through Dagster Pipes.

    RMQS_URI=rabbitmq-stream://user:pass@host:5552/%2F RMQS_DEMO_SPARK_MASTER=spark://master:7077 \\
        dagster dev -m dagster_rmqs.examples.pipes_spark_submit

The asset's step does not run Spark: `PipesSubprocessClient` runs `spark-submit` of rmqs's
application (`pyspark_rmqs.jobs.APPLICATION`) with `--dagster-pipes`, and the job runs the whole
watermark run in its driver (lease, plan or resume the unfinished run record, read on the cluster,
commit the exactly-once output, then store: docs/deployment.md, "Cluster jobs"), then reports its
run summary as the asset's materialization metadata through `dagster_pipes`. A retried step
submits again and the job resumes the same range; a second run on the consumer exits 75 before it
starts Spark (Dagster's pool `rmqs-<consumer>` keeps runs apart first).

The broker connection reaches the job through the environment it inherits (RMQS_URI, or
RMQS_ENDPOINTS / RMQS_USERNAME / RMQS_PASSWORD / RMQS_VHOST), never its arguments. Pipes' default
channels are temp files on this machine: the job's driver must run here (client mode). Environment
(defaults in brackets): RMQS_DEMO_SUPERSTREAM [orders], RMQS_DEMO_OUTPUT
[demo-output/dagster/orders-spark-submit], RMQS_DEMO_CONSUMER [dagster-spark-submit],
RMQS_DEMO_SPARK_MASTER [local[2]], RMQS_DEMO_SPARK_CONF [{}] (JSON: spark-submit --conf).
"""

import json
import os
import shutil
import sys
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    Backoff,
    Definitions,
    MaterializeResult,
    PipesSubprocessClient,
    RetryPolicy,
    asset,
)

from pyspark_rmqs.jobs import APPLICATION

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
OUTPUT = os.path.abspath(os.environ.get("RMQS_DEMO_OUTPUT", "demo-output/dagster/orders-spark-submit"))
CONSUMER = os.environ.get("RMQS_DEMO_CONSUMER", "dagster-spark-submit")
MASTER = os.environ.get("RMQS_DEMO_SPARK_MASTER", "local[2]")
SPARK_CONF: dict[str, str] = json.loads(os.environ.get("RMQS_DEMO_SPARK_CONF", "{}"))


def spark_submit() -> str:
    """`spark-submit` on the PATH, else the one beside this interpreter (pyspark installs it)."""
    return shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")


@asset(
    pool=f"rmqs-{CONSUMER}",  # one run per consumer name at a time
    retry_policy=RetryPolicy(max_retries=2, delay=10, backoff=Backoff.LINEAR),
)
def orders_on_the_cluster(
    context: AssetExecutionContext, pipes_subprocess_client: PipesSubprocessClient
) -> MaterializeResult:
    """The new messages of the super stream, read by a Spark job into exactly-once Parquet."""
    conf = [arg for k, v in SPARK_CONF.items() for arg in ("--conf", f"{k}={v}")]
    command = [
        spark_submit(),
        "--master",
        MASTER,
        *conf,
        APPLICATION,
        "--superstream",
        SUPERSTREAM,
        "--consumer",
        CONSUMER,
        "--output",
        OUTPUT,
        # The run's identity, the same on every retry of this step: recorded with the run.
        "--pipeline",
        f"{context.asset_key.to_user_string()}/{context.run_id}",
        "--retry-count",
        str(context.retry_number),
        "--dagster-pipes",
    ]
    return pipes_subprocess_client.run(command=command, context=context).get_materialize_result()


defs = Definitions(
    assets=[orders_on_the_cluster],
    resources={"pipes_subprocess_client": PipesSubprocessClient()},
)
