"""The Spark operators over a real Spark Connect server, from a `spark_conn_id` connection (issue 17).

One token-protected Connect server per module (`connect_server.py`, 10-20 s to start); the tasks
run in their own Python process (`connect_tasks.py`), as Airflow runs a task. `on_kill` interrupts
the task's running Spark job and nothing else; the token shows in no log line, raised error,
XCom value, rendered field or OpenLineage event, on success and failure paths.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.airflow.connect_server import run_task_process
from tests.support.broker import BrokerSettings
from tests.support.connect_server import (
    ConnectServer,
    group_members,
    python_descendants,
    start_connect_server,
)
from tests.support.data import client, publish

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

# A token as base64 secrets look: '/', '+' and '=' must survive the trip through the Connect URL.
TOKEN = "Tk-" + secrets.token_hex(12) + "/+="


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    server = start_connect_server(tmp_path_factory.mktemp("connect"), TOKEN)
    try:
        yield server
    finally:
        pgid = server.proc.pid
        server.stop()
        assert group_members(pgid) == [], "the Connect server left processes behind"


def spark_conn(server: ConnectServer, **fields: object) -> str:
    """An Airflow connection (JSON) to `server`: Host `sc://localhost`, the token in Password."""
    conn: dict[str, object] = {
        "conn_type": "generic",
        "host": "sc://localhost",
        "port": server.port,
        "password": server.token,
    }
    conn.update(fields)
    return json.dumps(conn)


def test_on_kill_interrupts_the_tasks_running_job_over_spark_connect(
    connect_server: ConnectServer, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("ckill")
    publish(broker, s, [f"m{i}".encode() for i in range(20)])
    client(broker).store_offsets("ck", {s: 4})  # a watermark from an earlier run
    result, output = run_task_process(
        "kill",
        {"stream": s, "consumer": "ck", "url": connect_server.url, "token": connect_server.token},
        {"AIRFLOW_CONN_SPARK_CONNECT": spark_conn(connect_server)},
        tmp_path / "task.log",
    )
    # The task's running job was interrupted within seconds: execute() raised the cancellation.
    assert result["task_alive"] is False
    assert result["kill_took_s"] < 15, result
    assert "OPERATION_CANCELED" in result["error"] or "interrupt" in result["error"].lower(), result
    # Another session's query on the same server ran on, until it was interrupted itself.
    assert result["other_survived"] is True, result
    assert result["other_interrupted_ops"] >= 1 and result["other_alive_after_own_interrupt"] is False
    # The server serves on; the task released its own session when execute() ended.
    assert result["fresh_session_sum"] == 45 and result["sessions_differ"] == 3
    assert result["task_session_released"] is True
    assert connect_server.alive()
    # The watermark did not move.
    assert client(broker).stored_offset("ck", s) == 4
    assert TOKEN not in output and quote(TOKEN, safe="") not in output


CONNECT_DAG = """
from datetime import datetime

from airflow.sdk import DAG, chain

from airflow_rmqs.operators import RabbitMQStreamPublishOperator, RabbitMQStreamReadOperator
from tests.airflow.connect_tasks import count_rows, fail_sink, publish_frame

# One after the other, failures first (each task runs whatever the one before did): a session a
# failed task left behind as the process's default would break the tasks after it.
with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    chain(
        RabbitMQStreamReadOperator(
            task_id="wrong_token", stream="{stream}", consumer_name="tok_wrong", process=count_rows,
            spark_conn_id="spark_connect_wrong",
        ),
        RabbitMQStreamReadOperator(
            task_id="bad_url", stream="{stream}", consumer_name="tok_bad", process=count_rows,
            spark_conn_id="spark_connect_bad", trigger_rule="all_done",
        ),
        RabbitMQStreamReadOperator(
            task_id="read_ok", stream="{stream}", consumer_name="tok", output_path="{out}",
            spark_conn_id="spark_connect", trigger_rule="all_done",
        ),
        RabbitMQStreamReadOperator(
            task_id="read_token_in_extra", stream="{stream}", start="earliest", store_watermark=False,
            process=count_rows, spark_conn_id="spark_connect_extra", trigger_rule="all_done",
        ),
        RabbitMQStreamPublishOperator(
            task_id="publish_ok", stream="{target}", dataframe_callable=publish_frame,
            spark_conn_id="spark_connect", trigger_rule="all_done",
        ),
        RabbitMQStreamReadOperator(
            task_id="sink_fails", stream="{stream}", consumer_name="tok_fail", process=fail_sink,
            spark_conn_id="spark_connect", trigger_rule="all_done",
        ),
    )
"""


def test_the_connect_token_shows_in_no_log_error_xcom_or_lineage(
    connect_server: ConnectServer, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Six tasks in one `dag.test()`: a wrong token, a URL PySpark rejects quoting it whole,
    successes with the token in Password and in the extra (whose sink logs its connections' URIs
    and the client's token), a failing sink. All the task process wrote is searched for the token.
    """
    s, target = streams.stream("ctok"), streams.stream("ctokp")
    publish(broker, s, [f"t{i}".encode() for i in range(30)])
    wrong = "Wr0ng-" + secrets.token_hex(8)
    home, out, events = tmp_path / "airflow", tmp_path / "lake", tmp_path / "events"
    (home / "dags").mkdir(parents=True)
    events.mkdir()
    dag_file = home / "dags" / "connect_dag.py"
    dag_id = f"connect_{s}".replace("-", "_")
    dag_file.write_text(CONNECT_DAG.format(dag_id=dag_id, stream=s, target=target, out=out))
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "DEBUG",
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "rmqs-test",
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events / "ol.jsonl"), "append": True}
        ),
        "SPARK_CONNECT_LOG_LEVEL": "debug",  # PySpark's Connect client logs every request
        "AIRFLOW_CONN_SPARK_CONNECT": spark_conn(connect_server),
        "AIRFLOW_CONN_SPARK_CONNECT_EXTRA": spark_conn(
            connect_server, password=None, extra={"token": TOKEN, "user_id": "etl"}
        ),
        # No host name: PySpark rejects the URL with an error quoting it whole, token included.
        "AIRFLOW_CONN_SPARK_CONNECT_BAD": spark_conn(connect_server, host="sc://"),
        "AIRFLOW_CONN_SPARK_CONNECT_WRONG": spark_conn(connect_server, password=wrong),
    }
    result, output = run_task_process(
        "dag_run",
        {"dag_file": str(dag_file), "direct": ["sink_fails", "bad_url", "wrong_token"]},
        env,
        tmp_path / "task.log",
    )
    assert result["states"] == {
        "read_ok": "success",
        "read_token_in_extra": "success",
        "publish_ok": "success",
        "sink_fails": "failed",
        "bad_url": "failed",
        "wrong_token": "failed",
    }, f"see {tmp_path / 'task.log'}"
    raised, lineage = result["raised"], "".join(p.read_text() for p in events.iterdir())
    # dag.test()'s in-process supervisor logs every message a task sends it at DEBUG, the secrets
    # to mask included (`MaskSecret(value=...)`; Airflow's real supervisor omits that body).
    shown = "\n".join(line for line in output.splitlines() if "msg=MaskSecret(" not in line)
    texts = {
        "task process output": shown,
        "xcom": json.dumps(result["xcoms"], default=str),
        "rendered fields": json.dumps(result["rendered"], default=str),
        "raised": json.dumps(raised),
        "lineage": json.dumps(result["lineage"]) + lineage,
        "log files": json.dumps(result["logs"]),
    }
    for secret in (TOKEN, quote(TOKEN, safe=""), wrong):
        leaks = {name: around(text, secret) for name, text in texts.items() if secret in text}
        assert leaks == {}, f"the token shows in {list(leaks)}: {leaks}"
    assert "COMPLETE" in lineage and "FAIL" in lineage, "no OpenLineage events were emitted"
    assert result["xcoms"]["read_ok"]["rows"] == 30 and result["xcoms"]["publish_ok"]["rows"] == 7
    assert "sink used" in shown and "sink's client token ***" in shown  # masked, not missing
    assert "injected sink failure" in raised["sink_fails"]
    assert "Hostname is missing" in raised["bad_url"] and "token=***" in raised["bad_url"]
    assert "Invalid authentication token" in raised["wrong_token"]


def around(text: str, secret: str, width: int = 300) -> list[str]:
    """Where `secret` shows in `text` (as <SECRET>), for the failure message."""
    spots, at = [], text.find(secret)
    while at >= 0 and len(spots) < 3:
        spots.append(text[max(0, at - width) : at + len(secret) + 80].replace(secret, "<SECRET>"))
        at = text.find(secret, at + 1)
    return spots


def test_read_tasks_share_the_servers_session_and_its_python_workers(
    connect_server: ConnectServer, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Issue 43: a warm Connect server stays warm across tasks. A new session starts the server's
    Python processes anew (a daemon and workers per data source step, each importing pyspark and
    rmqs: seconds per task); tasks with one connection attach to one server-side session, so the
    second task starts none. A released (or expired) session's id is never reused: the next task
    lands on the next shared id, and reads everything. `reuse_session: false` opts out."""
    s = streams.stream("cshare")
    publish(broker, s, [f"s{i}".encode() for i in range(40)])
    env = {
        "AIRFLOW_CONN_SPARK_CONNECT": spark_conn(connect_server),
        "AIRFLOW_CONN_SPARK_OWN": spark_conn(connect_server, extra={"reuse_session": False}),
    }

    def task(consumer: str, conn_id: str = "spark_connect") -> tuple[dict[str, object], list[int]]:
        before = set(python_descendants(connect_server.proc.pid))
        args = {"stream": s, "consumer": consumer, "out": str(tmp_path / consumer), "conn_id": conn_id}
        result, _ = run_task_process("read", args, env, tmp_path / f"{consumer}.log")
        return result, sorted(set(python_descendants(connect_server.proc.pid)) - before)

    first, _ = task("c1")
    second, started = task("c2")
    assert first["rows"] == second["rows"] == 40 and first["stopped"] and second["stopped"]
    assert second["session"] == first["session"], "the second task opened a session of its own"
    assert started == [], f"the server started Python processes {started} for a task on a warm session"

    run_task_process(
        "release",
        {"url": connect_server.url, "token": connect_server.token, "session": first["session"]},
        env,
        tmp_path / "release.log",
    )
    publish(broker, s, [f"t{i}".encode() for i in range(5)])
    third, _ = task("c2")  # the watermark run after the release: the next shared id
    assert third["rows"] == 5 and third["session"] != first["session"]

    own, started_own = task("c3", "spark_own")
    assert own["rows"] == 45 and own["session"] not in (first["session"], third["session"])
    assert started_own, "a session of its own reuses no server Python worker: its start must show"
