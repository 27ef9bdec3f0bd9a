"""Airflow task processes over Spark Connect, run by test_spark_connect_operators.py in a fresh Python.

`python -m tests.airflow.connect_tasks <scenario> '<json kwargs>'` runs one scenario and prints its
result as the last `RESULT {json}` line. The Spark connections come from the environment
(`AIRFLOW_CONN_SPARK_CONNECT...`), the broker's from `AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT`; every
logger writes at DEBUG to stderr, so the test sees all the process logged.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import sys
import threading
import time
import traceback
from typing import Any

from tests.support.threads import start_capturing


class JobWatch:
    """A Spark Connect progress handler: the operations the server reported Spark stages for.

    Interrupting a Connect operation before the server submitted its Spark job is best effort on
    the server's side (an adaptive query's stage job submitted after the interrupt runs on, with no
    live operation left to interrupt): the test kills a task whose job the server reported, as
    Airflow kills a task in the middle of its work.
    """

    def __init__(self) -> None:
        self.ops: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, stages: Any, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        if operation_id and not done and any(s.num_tasks for s in stages or ()):
            with self._lock:
                self.ops.setdefault(operation_id, time.monotonic())

    def known(self) -> set[str]:
        with self._lock:
            return set(self.ops)

    def wait_for_new(self, known: set[str], alive: threading.Thread, timeout: float = 240.0) -> str:
        """The first operation not in `known` with a Spark job on the server."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = self.known() - known
            if new:
                return new.pop()
            if not alive.is_alive():
                raise AssertionError("the thread ended before its Spark job ran")
            time.sleep(0.2)
        raise AssertionError("no Spark job started")


WATCH = JobWatch()


def long_job(df: Any, context: Any) -> None:
    """A `process` sink whose Spark job runs until it is interrupted (10^13 rows)."""
    spark = df.sparkSession
    spark.registerProgressHandler(WATCH)
    spark.range(0, 10**13, 1, 2).selectExpr("sum(id % 7)").collect()


def kill(stream: str, consumer: str, url: str, token: str) -> dict[str, Any]:
    """A read whose sink runs a long Spark job, `on_kill()` from another thread while it runs.

    Meanwhile another client session runs a long query on the same server: it must outlive the
    kill. Afterwards the server must serve a new session.
    """
    from urllib.parse import quote

    from pyspark.sql import SparkSession

    from airflow_rmqs.operators import RabbitMQStreamReadOperator

    op = RabbitMQStreamReadOperator(
        task_id="read_killed",
        stream=stream,
        consumer_name=consumer,
        process=long_job,
        spark_conn_id="spark_connect",
    )
    t0 = time.monotonic()
    task, failure = start_capturing(lambda: op.execute({}))
    try:
        task_op = WATCH.wait_for_new(set(), task)
    except AssertionError as e:
        raise AssertionError(f"{e}: {failure!r}") from None
    started_after = time.monotonic() - t0
    spark = op._spark
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    task_session = spark.session_id

    # Another session on the server (another task, another user) with a long query of its own.
    other_session = SparkSession.builder.remote(f"{url}/;token={quote(token, safe='')}").create()
    other_session.registerProgressHandler(WATCH)
    other_result: list[Any] = []

    def other_query() -> None:
        other_session.addTag("other")
        other_result.append(other_session.range(0, 10**13, 1, 2).selectExpr("sum(id % 5)").collect())

    other, other_failure = start_capturing(other_query)
    other_op = WATCH.wait_for_new({task_op}, other)  # submitted; its tasks wait for the task's cores
    assert task.is_alive() and other.is_alive(), (failure, other_failure)

    killed_at = time.monotonic()
    op.on_kill()
    task.join(30)
    kill_took = time.monotonic() - killed_at
    task_alive = task.is_alive()
    if task_alive:  # on_kill failed: stop it all, so that the checks below still run
        spark.interruptAll()
        task.join(30)
    time.sleep(3.0)  # the other session's query runs on (it has the cores now)
    other_survived = other.is_alive() and not other_failure and not other_result
    interrupted = other_session.interruptTag("other")  # now stop it ourselves
    other.join(60)

    fresh = SparkSession.builder.remote(f"{url}/;token={quote(token, safe='')}").create()
    fresh_sum = fresh.range(10).selectExpr("sum(id)").collect()[0][0]
    return {
        "started_after_s": round(started_after, 1),
        "operations": [task_op, other_op],
        "task_alive": task_alive,
        "kill_took_s": round(kill_took, 2),
        "error_type": type(failure[0]).__name__ if failure else None,
        "error": str(failure[0])[:2000] if failure else None,
        "task_session_released": spark.is_stopped,
        "other_survived": other_survived,
        "other_interrupted_ops": len(interrupted),
        "other_alive_after_own_interrupt": other.is_alive(),
        "other_error": str(other_failure[0])[:500] if other_failure else None,
        "fresh_session_sum": fresh_sum,
        "sessions_differ": len({task_session, other_session.session_id, fresh.session_id}),
    }


def count_rows(df: Any, context: Any) -> None:
    """A `process` sink that succeeds; it logs what it read and, carelessly, its Spark connection."""
    from airflow.sdk import BaseHook

    log = logging.getLogger("airflow.task")
    log.info("sink got %s rows", df.count())
    for conn_id in ("spark_connect", "spark_connect_extra"):
        log.info("sink used %s", BaseHook.get_connection(conn_id).get_uri())
    log.info("sink's client token %s", df.sparkSession.client.token)


def fail_sink(df: Any, context: Any) -> None:
    """A `process` sink that fails after its Spark job ran."""
    raise RuntimeError(f"injected sink failure after {df.count()} rows")


def publish_frame(spark: Any, context: Any) -> Any:
    return spark.createDataFrame([(f"p{i}",) for i in range(7)], "value string")


def dag_run(dag_file: str, direct: list[str]) -> dict[str, Any]:
    """`dag.test()` of `dag_file` (Airflow's task runner in this process), then its task states,
    XCom values, rendered fields, log files, and the OpenLineage facets of the successful tasks.
    The tasks named in `direct` run again through `execute()`, to get their exception as raised.
    """
    import importlib.util
    import os
    from pathlib import Path

    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.sdk.log import configure_logging
    from airflow.utils import db

    # The logging of a task log: Airflow's processors with its secrets masker (in a deployment the
    # supervisor applies them to what the task process sends it), at DEBUG.
    configure_logging(log_level="DEBUG", output=sys.stderr, colored_console_log=False)
    db.initdb()
    spec = importlib.util.spec_from_file_location("connect_dag", dag_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.dag.test()
    states, xcoms, rendered, lineage = {}, {}, {}, {}
    for ti in run.get_task_instances():
        states[ti.task_id] = str(ti.state)
        xcoms[ti.task_id] = ti.xcom_pull(task_ids=ti.task_id)
        rendered[ti.task_id] = RenderedTaskInstanceFields.get_templated_fields(ti)
    raised: dict[str, str | None] = {}
    for task_id in direct:
        try:
            module.dag.get_task(task_id).execute({})
        except BaseException as e:
            raised[task_id] = "".join(traceback.format_exception(e))
        else:
            raised[task_id] = None
    for task_id, state in states.items():
        if state == "success":
            lineage[task_id] = repr(module.dag.get_task(task_id).get_openlineage_facets_on_complete(None))
    logs = {
        str(p): p.read_text(errors="replace")
        for p in Path(os.environ["AIRFLOW_HOME"], "logs").rglob("*")
        if p.is_file()
    }
    return {
        "states": states,
        "xcoms": xcoms,
        "rendered": rendered,
        "raised": raised,
        "lineage": lineage,
        "logs": logs,
    }


def read(stream: str, consumer: str, out: str, conn_id: str) -> dict[str, Any]:
    """One read task into Parquet: its rows and the server-side session it ran on."""
    from airflow_rmqs.operators import RabbitMQStreamReadOperator

    op = RabbitMQStreamReadOperator(
        task_id="read", stream=stream, consumer_name=consumer, output_path=out, spark_conn_id=conn_id
    )
    summary = op.execute({})
    return {"rows": summary["rows"], "session": op._spark.session_id, "stopped": op._spark.is_stopped}


def release(url: str, token: str, session: str) -> dict[str, Any]:
    """Release a server-side session, as its idle timeout or an administrator would."""
    from urllib.parse import quote

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(f"{url}/;token={quote(token, safe='')};session_id={session}").create()
    spark.stop()  # release_session_on_close: the session is closed on the server
    return {"released": session}


SCENARIOS = {"kill": kill, "dag_run": dag_run, "read": read, "release": release}


def main() -> None:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    scenario, args = sys.argv[1], json.loads(sys.argv[2])
    faulthandler.dump_traceback_later(float(args.pop("stacks_after_s", 240)), exit=True)  # where it hangs
    try:
        result = SCENARIOS[scenario](**args)
    except BaseException:
        traceback.print_exc()
        raise
    sys.stdout.write("RESULT " + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
