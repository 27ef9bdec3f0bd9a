"""Cluster jobs under the watermark protocol: `spark-submit` of `pyspark_rmqs/submit.py` (the
application `jobs.APPLICATION` names) against the standalone master, every offset counted.

The job runs the whole watermark run in its driver (plan or resume under the lease, read, commit the
exactly-once output, then record and store); the test, as an orchestrator would, only submits and
reads the outcome from the broker (`jobs.job_outcome`). Faults come from tests/spark_cluster/
submit_app.py: the job's process group SIGKILLed right after its output committed (before the
store) or in the middle of its read; a second submission while the first holds the lease.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pyspark_rmqs.jobs import APPLICATION, job_outcome
from tests.conftest import StreamFactory
from tests.spark_cluster.checks import (
    assert_each_offset_once,
    last_offsets,
    message_offsets,
    output_pairs,
    run_job,
    wait_until,
)
from tests.spark_cluster.jobs import DRIVER_CONF
from tests.spark_cluster.standalone import StandaloneCluster
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.slow]

FAULT_APP = str(REPO / "tests" / "spark_cluster" / "submit_app.py")
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")


def job_env(broker: BrokerSettings, fault: str = "") -> dict[str, str]:
    """The job's environment: the venv's Python on both sides, the broker from RMQS_* (not argv)."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "RMQS_ENDPOINTS": f"{broker.host}:{broker.port}",
        "RMQS_USERNAME": broker.username,
        "RMQS_PASSWORD": broker.password,
        "RMQS_VHOST": broker.vhost,
        "RMQS_TEST_JOB_FAULT": fault,
    }


def submit_cmd(cluster: StandaloneCluster, app: str, args: list[str]) -> list[str]:
    conf = [x for k, v in DRIVER_CONF.items() for x in ("--conf", f"{k}={v}")]
    return [SPARK_SUBMIT, "--master", cluster.url, "--deploy-mode", "client", *conf, app, *args]


def start(
    cluster: StandaloneCluster, broker: BrokerSettings, args: list[str], fault: str = ""
) -> subprocess.Popen[str]:
    """spark-submit in a process group of its own (what a kill of the job's machine takes down)."""
    return subprocess.Popen(
        submit_cmd(cluster, FAULT_APP if fault else APPLICATION, args),
        cwd=REPO,
        env=job_env(broker, fault),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 600) -> tuple[int, dict[str, Any] | None, str]:
    """(exit code, the printed summary or None, the output's tail). In client mode spark-submit
    passes the Python driver's stdout and stderr on as one stream, on its stdout."""
    import json

    out, err = proc.communicate(timeout=timeout_s)
    lines = [line for line in out.splitlines() if line.startswith("RMQS_SUMMARY ")]
    summary = json.loads(lines[-1][len("RMQS_SUMMARY ") :]) if lines else None
    return proc.returncode, summary, (out + err)[-6000:]


def submit(
    cluster: StandaloneCluster, broker: BrokerSettings, args: list[str], fault: str = ""
) -> tuple[int, dict[str, Any] | None, str]:
    rc = finish(start(cluster, broker, args, fault))
    cluster.wait_no_applications()  # the job's executors gone: the cores are free for the next one
    return rc


def job_args(name: str, consumer: str, out: Path, pipeline: str) -> list[str]:
    return ["--superstream", name, "--consumer", consumer, "--output", str(out), "--pipeline", pipeline]


def publish_round(broker: BrokerSettings, parts: list[str], tag: str, n: int) -> None:
    for k, p in enumerate(parts):
        publish(broker, p, [f"{p}:{tag}{i}".encode() for i in range(n + 41 * k)])


def assert_all_delivered(broker: BrokerSettings, parts: list[str], out: Path, consumer: str) -> None:
    """Every offset of every partition once in the committed output; the watermark at each tail."""
    assert_each_offset_once(output_pairs(out), message_offsets(broker, parts))
    assert client(broker).stored_offsets(consumer, parts) == last_offsets(broker, parts)


def test_a_submitted_job_runs_the_watermark_run_twice(
    free_cluster: StandaloneCluster, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    name, parts = streams.super_stream(3)
    out = tmp_path / "out"
    for tag in ("a", "b"):  # the second job reads only what is new
        publish_round(broker, parts, tag, 700)
        pipeline = f"dag/read/{tag}"
        rc, summary, err = submit(free_cluster, broker, job_args(name, "job", out, pipeline))
        assert rc == 0 and summary is not None, err
        assert summary["watermark_stored"] is True and summary["pipeline"] == pipeline, summary
        assert summary["lag_after"] == 0 and summary["delivery"] == "exactly_once", summary
        assert_all_delivered(broker, parts, out, "job")
        outcome = job_outcome(conn_of(broker), "job", superstream=name)
        assert outcome.finished and outcome.pipeline == pipeline and outcome.lag == 0, outcome
        assert outcome.run_id == summary["run_id"] and outcome.token == summary["token"], outcome


def test_a_job_killed_after_its_commit_is_resumed_by_the_next_submission(
    free_cluster: StandaloneCluster, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """SIGKILL of the whole spark-submit (JVM and Python driver) once the output's commit record is
    written: nothing stored, the record `planned`. The same submission again resumes that record
    (same ranges, same token), writes nothing twice and stores: every offset once, watermark at the tail."""
    name, parts = streams.super_stream(3)
    out = tmp_path / "out"
    publish_round(broker, parts, "a", 800)
    args = job_args(name, "killed", out, "dag/read/run-1")
    rc, summary, _ = submit(free_cluster, broker, args, fault="kill-after-commit")
    assert rc != 0 and summary is None
    before = job_outcome(conn_of(broker), "killed", superstream=name)
    assert (before.state, before.finished, before.attempt) == ("planned", False, 0), before
    assert client(broker).stored_offsets("killed", parts) == {p: None for p in parts}
    assert_each_offset_once(output_pairs(out), message_offsets(broker, parts))  # committed, not stored

    rc, summary, err = submit(free_cluster, broker, [*args, "--retry-count", "1"])
    assert rc == 0 and summary is not None, err
    assert summary["resumed_plan"] is True and summary["sink_skipped"] is True, summary
    assert summary["token"] == before.token and summary["run_id"] == before.run_id, summary
    ranges = {s: [summary["start_offsets"][s], summary["end_offsets"][s]] for s in before.ranges}
    assert ranges == before.ranges  # the very range the killed job planned
    assert_all_delivered(broker, parts, out, "killed")
    after = job_outcome(conn_of(broker), "killed", superstream=name)
    assert (after.state, after.attempt, after.lag) == ("stored", 1, 0), after


def test_a_second_job_is_turned_away_and_a_job_killed_mid_read_resumes(
    free_cluster: StandaloneCluster, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """A slow job holds the lease; a second submission on the same consumer exits 75 (retryable)
    with ConsumerBusyError naming the first, before it starts any Spark application. The first is
    then SIGKILLed mid-read; its resubmission reads the same range again, every offset once."""
    name, parts = streams.super_stream(3)
    out = tmp_path / "out"
    publish_round(broker, parts, "a", 600)
    conn = conn_of(broker)
    first = start(free_cluster, broker, job_args(name, "busy", out, "dag/read/first"), fault="paced:50:0.5")
    try:
        planned = wait_until(
            lambda: (o := job_outcome(conn, "busy", superstream=name)).pipeline == "dag/read/first" and o,
            120,
            "the first job's planned record",
        )
        apps_before = len(free_cluster.state().get("completedapps", []))  # type: ignore[arg-type]
        rc, summary, err = submit_busy(free_cluster, broker, name, out)
        assert rc == 75 and summary is None, err
        assert "ConsumerBusyError" in err and "dag/read/first" in err, err
        state = free_cluster.state()
        assert len(state["activeapps"]) == 1, state["activeapps"]  # type: ignore[arg-type]
        assert len(state["completedapps"]) == apps_before  # type: ignore[arg-type]

        wait_until(lambda: free_cluster.executors(), 120, "the first job's executors")
        time.sleep(3)  # inside its paced read
        assert first.poll() is None, "the first job ended before the kill"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    free_cluster.wait_no_applications()
    assert client(broker).stored_offsets("busy", parts) == {p: None for p in parts}

    rc, summary, err = submit(free_cluster, broker, job_args(name, "busy", out, "dag/read/first"))
    assert rc == 0 and summary is not None, err
    assert summary["resumed_plan"] is True and summary["token"] == planned.token, summary  # type: ignore[attr-defined]
    assert_all_delivered(broker, parts, out, "busy")


def submit_busy(
    cluster: StandaloneCluster, broker: BrokerSettings, name: str, out: Path
) -> tuple[int, dict[str, Any] | None, str]:
    """A second job on the consumer, waiting at most 1 s for the lease."""
    args = [*job_args(name, "busy", out, "dag/read/second"), "--lease-wait-s", "1"]
    return finish(start(cluster, broker, args))


def test_the_spark_submit_example_dag_on_the_cluster_twice(
    free_cluster: StandaloneCluster, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """dags/rmqs_spark_submit.py under `dag.test()` in a worker process of its own: its
    SparkSubmitOperator submits the job to the standalone master (a Spark connection from the
    environment), the outcome task reads the run record; twice, every offset once."""
    import json

    name, parts = streams.super_stream(3)
    out = tmp_path / "out"
    home = tmp_path / "airflow_home"
    bundle = home / "dags"
    bundle.mkdir(parents=True)
    (bundle / "rmqs_spark_submit.py").symlink_to(REPO / "dags" / "rmqs_spark_submit.py")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(bundle),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": broker.uri,
        "AIRFLOW_CONN_SPARK_DEFAULT": f"spark://127.0.0.1:{free_cluster.port}?deploy-mode=client",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # spark-submit on the PATH
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "RMQS_DEMO_SUPERSTREAM": name,
        "RMQS_DEMO_OUTPUT": str(out),
        "RMQS_DEMO_CONSUMER": "af-submit",
        "RMQS_DEMO_SPARK_CONF": json.dumps(DRIVER_CONF),
        "RMQS_DEMO_MAX_LAG": "0",
    }
    cfg = {"dag": "rmqs_spark_submit", "xcom": "outcome", "rendered": "read_on_the_cluster"}
    for tag in ("a", "b"):  # the second run reads only what is new
        publish_round(broker, parts, tag, 600)
        result = run_job(["airflow-dag", json.dumps(cfg)], env=env)
        free_cluster.wait_no_applications()
        assert result["state"] == "success", result
        outcome = result["xcom"]
        assert outcome["finished"] is True and outcome["this_run"] is True and outcome["lag"] == 0, outcome
        assert outcome["pipeline"].startswith("rmqs_spark_submit/read_on_the_cluster/"), outcome
        assert result["rendered_env"]["RMQS_PASSWORD"] == "***", result["rendered_env"]
        assert_all_delivered(broker, parts, out, "af-submit")
        assert outcome["offsets"] == sum(b - a for a, b in outcome["ranges"].values()) > 0


def test_the_dagster_pipes_example_on_the_cluster_twice(
    free_cluster: StandaloneCluster, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """dagster_rmqs/examples/pipes_spark_submit.py materialized in a process of its own:
    PipesSubprocessClient runs spark-submit against the standalone master, the job reports its
    summary through dagster_pipes; twice, every offset once, the metadata the job's own."""
    import json

    name, parts = streams.super_stream(3)
    out = tmp_path / "out"
    env = {
        "RMQS_ENDPOINTS": f"{broker.host}:{broker.port}",
        "RMQS_USERNAME": broker.username,
        "RMQS_PASSWORD": broker.password,
        "RMQS_VHOST": broker.vhost,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "DAGSTER_HOME": str(tmp_path),
        "RMQS_DEMO_SUPERSTREAM": name,
        "RMQS_DEMO_OUTPUT": str(out),
        "RMQS_DEMO_CONSUMER": "dg-pipes",
        "RMQS_DEMO_SPARK_MASTER": free_cluster.url,
        "RMQS_DEMO_SPARK_CONF": json.dumps(DRIVER_CONF),
    }
    for tag in ("a", "b"):
        publish_round(broker, parts, tag, 650)
        meta = run_job(["dagster-pipes", "{}"], env=env)
        free_cluster.wait_no_applications()
        assert meta["watermark_stored"] is True and meta["lag_after"] == 0, meta
        assert meta["delivery"] == "exactly_once" and meta["pipeline"].startswith("orders_on_the_cluster/")
        assert_all_delivered(broker, parts, out, "dg-pipes")
        assert meta["rows"] == messages_in(broker, parts, meta), meta  # the job's own count, reported


def messages_in(broker: BrokerSettings, parts: list[str], summary: dict[str, Any]) -> int:
    """The messages inside a summary's `[start, end)` ranges (tracking entries take offsets too)."""
    starts, ends = summary["start_offsets"], summary["end_offsets"]
    return sum(1 for s, o in message_offsets(broker, parts) if starts[s] <= o < ends[s])
