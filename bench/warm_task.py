"""One scheduled task in a new process, as a worker runs it: the child `bench.warm_spark` starts.

    python -m bench.warm_task KIND SUPERSTREAM OUT URI CONSUMER REMOTE [--breakdown]

Kept apart from `bench.warm_spark` so that the process imports only what the task itself imports
(Python, the operator or asset, its libraries): the bench's own plumbing (`bench.common`, the test
support) is not in the process time it measures, and neither is the other product (an Airflow task
does not import Dagster). With `--breakdown`, the functions in PHASES of the task's own product are
wrapped to time its phases (imported before the task starts, outside `execute`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

PARTITIONS = 3
SPARK_KINDS = {"connect": "consume", "dagster-connect": "dagster-arrow", "spark-floor": "consume"}

# Where a Spark task's `execute` goes: (module, attribute, label). Patched in the task's process
# only (the bench's child), where the code looks the names up.
PHASES = (
    ("airflow_rmqs.operators", "connect_session", "session"),
    ("dagster_rmqs.resources.SparkSessionResource", "get_session", "session"),
    ("pyspark_rmqs.jobs", "plan_read", "plan (lease, record)"),
    ("pyspark_rmqs.runs.spark_io", "read_dataframe", "dataframe (source resolved, schema)"),
    ("pyspark_rmqs.runs.spark_io.FileOutput", "write_to", "spark action (read + write)"),
    ("pyspark_rmqs.runs.outputs.delivery.FileCommits", "publish", "publish"),
    ("pyspark_rmqs.runs.outputs.delivery.FileCommits", "commit", "commit record"),
    ("pyspark_rmqs.runs.steps", "store_watermarks_checked", "watermark store"),
    ("pyspark_rmqs.runs.record", "advance", "record writes"),
    ("pyspark_rmqs.runs.steps", "watermarks", "lag"),
)


def _patch_phases(spent: dict[str, float], kind: str) -> None:
    """Wrap each PHASES function so its wall time adds up in `spent` (nested calls count once);
    the other product's modules are left out (an Airflow task never imports Dagster)."""
    import importlib

    other = "airflow_rmqs" if kind.startswith("dagster") else "dagster_rmqs"
    for target, attr, label in PHASES:
        if target.startswith(other):
            continue
        module_name, _, cls = target.rpartition(".")
        try:
            owner: Any = importlib.import_module(target)
        except ImportError:
            try:
                owner = getattr(importlib.import_module(module_name), cls)
            except (ImportError, AttributeError):
                continue
        fn = getattr(owner, attr, None)
        if fn is None:
            continue
        setattr(owner, attr, _timed(fn, label, spent))


def _timed(fn: Callable[..., Any], label: str, spent: dict[str, float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

    return wrapper


def _child(
    kind: str, superstream: str, out: str, uri: str, consumer: str, remote: str, breakdown: bool
) -> None:
    """In a new process: one task's `execute()` (or one asset materialization); print JSON."""
    started = time.perf_counter()
    os.environ["AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT"] = uri
    address, _, token = remote.partition("/;token=")
    host, _, port = address.rpartition(":")
    spark_conn = {"conn_type": "spark", "host": host, "port": int(port), "password": token}
    os.environ["AIRFLOW_CONN_SPARK_WARM"] = json.dumps(spark_conn)
    spent: dict[str, float] = {}
    if kind in ("connect", "consume"):
        run = _airflow_task(kind, superstream, out, consumer)
    elif kind == "spark-floor":
        run = _spark_floor(superstream, out, remote, spent)
    else:
        run = _dagster_asset(kind, superstream, out, consumer, uri, remote)
    imported = time.perf_counter() - started
    if breakdown and kind in ("connect", "dagster-connect"):  # the floor times its own two phases
        _patch_phases(spent, kind)
    t0 = time.perf_counter()
    rows = run()
    seconds = time.perf_counter() - t0
    result = {"imports_s": imported, "execute_s": seconds, "rows": rows, "phases": spent}
    result["ended"] = time.time()
    print("bench-result " + json.dumps(result), flush=True)


def _airflow_task(kind: str, superstream: str, out: str, consumer: str) -> Callable[[], int]:
    if kind == "connect":
        from airflow_rmqs.operators import RabbitMQStreamReadOperator

        op: Any = RabbitMQStreamReadOperator(
            task_id="bench_connect",
            superstream=superstream,
            consumer_name=consumer,
            output_path=out,
            metadata_fields="",
            spark_conn_id="spark_warm",
        )
    else:
        from airflow_rmqs.plain_operators import RabbitMQStreamConsumeOperator

        op = RabbitMQStreamConsumeOperator(
            task_id="bench_consume",
            superstream=superstream,
            consumer_name=consumer,
            output_path=out,
            metadata_fields="",
        )
    return lambda: int(op.execute({})["rows"])


def _spark_floor(superstream: str, out: str, remote: str, spent: dict[str, float]) -> Callable[[], int]:
    """The least any Spark Connect task does, with no rmqs: open the session (the Airflow task's:
    same URL, app and conf, so the same server-side session), then have Spark write as many rows
    like the read's into Parquet (`spark.range` made into `value` of 100 bytes, as the bench's
    bodies, `stream`, `offset`, `chunk_timestamp`). Timed: both, each also in `spent` (`session`,
    `spark write`), so a Spark task's ratio to the Spark-free one is read against this floor's."""
    n = int(os.environ["BENCH_MESSAGES"])

    def run() -> int:
        t0 = time.perf_counter()
        from pyspark.sql import functions as F

        from pyspark_rmqs.runs.connect_sessions import connect

        spark = connect(remote, "rmqs", {}, new=True)
        t1 = time.perf_counter()
        df = spark.range(n).select(
            F.expr("cast(repeat('x', 100) as binary)").alias("value"),
            F.concat(F.lit(superstream + "-"), (F.col("id") % PARTITIONS).cast("string")).alias("stream"),
            F.col("id").alias("offset"),
            F.current_timestamp().alias("chunk_timestamp"),
        )
        df.write.mode("overwrite").parquet(out)
        spent["session"], spent["spark write"] = t1 - t0, time.perf_counter() - t1
        return n

    return run


def _dagster_asset(
    kind: str, superstream: str, out: str, consumer: str, uri: str, remote: str
) -> Callable[[], int]:
    from dagster import materialize

    from dagster_rmqs import RabbitMQStreamsResource, SparkSessionResource, build_stream_asset

    engine: Literal["spark", "arrow"] = "spark" if kind == "dagster-connect" else "arrow"
    asset = build_stream_asset(
        name="bench_" + kind.replace("-", "_"),
        superstream=superstream,
        consumer_name=consumer,
        output_path=out,
        engine=engine,
        metadata_fields="",
    )
    resources: dict[str, Any] = {"rabbitmq": RabbitMQStreamsResource(uris=uri)}
    if engine == "spark":
        resources["spark"] = SparkSessionResource(remote=remote)

    def run() -> int:
        result = materialize([asset], resources=resources)
        assert result.success
        mats = result.asset_materializations_for_node(asset.op.name)
        return int(str(mats[0].metadata["dagster/row_count"].value))

    return run


def main() -> None:
    args = sys.argv[1:]
    breakdown = "--breakdown" in args
    kind, superstream, out, uri, consumer, remote = [a for a in args if a != "--breakdown"]
    _child(kind, superstream, out, uri, consumer, remote, breakdown)


if __name__ == "__main__":
    main()
