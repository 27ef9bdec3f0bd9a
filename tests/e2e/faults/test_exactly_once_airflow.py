"""Exactly-once through the Airflow operators: the task process SIGKILLed, then the task retried.

Each try is `execute()` of the operator in a process of its own (`airflow_job.py`), with the
connection from the environment as a worker has it, and `output_path` plus a consumer name: the
first try is killed at a point of `kill_points.py`, the retry (try 2, a fresh process) runs to its
end. The output is counted per `(stream, offset)`; the watermark must end at the range's end and
the range's commit record must exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyspark_rmqs.runs.outputs.delivery import COMMITS, STAGING
from pyspark_rmqs.runs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.airflow_job import DAG_ID, XCOM
from tests.e2e.faults.support import output_offsets
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.airflow]

CONN_ID = "rmqs_faults"


def _try(broker: BrokerSettings, tmp_path: Path, cfg: dict[str, Any], *, killed: bool) -> dict[str, Any]:
    """One try of the task in a new process; its XCom value when it ran to its end."""
    home = tmp_path / "airflow_home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        f"AIRFLOW_CONN_{CONN_ID.upper()}": broker.uri,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.faults.airflow_job", json.dumps({"conn_id": CONN_ID, **cfg})],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if killed:
        assert done.returncode == -9, f"the task was not killed ({done.returncode}): {done.stderr[-3000:]}"
        return {}
    assert done.returncode == 0, f"the retry failed ({done.returncode}): {done.stderr[-3000:]}"
    lines = [x for x in done.stdout.splitlines() if x.startswith(XCOM)]
    assert len(lines) == 1, done.stdout[-3000:]
    return dict(json.loads(lines[0][len(XCOM) :]))


def _commit_record(out: Path) -> dict[str, Any]:
    records = list((out / COMMITS).glob("*.json"))
    assert len(records) == 1, records
    return dict(json.loads(records[0].read_text()))


def _assert_measured(xcom: dict[str, Any]) -> None:
    for k in ("fetch_ms", "decode_ms", "flush_ms", "commit_ms"):
        assert isinstance(xcom[k], float) and xcom[k] > 0, (k, xcom[k])


def _published(out: Path) -> list[Path]:
    """The data files readers would see (staging folders and commit records are `_`-prefixed)."""
    return [p for p in out.rglob("*.parquet") if not any(part.startswith(("_", ".")) for part in p.parts)]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("kill", ["sink", "commit", "stored"])
def test_a_read_task_killed_anywhere_then_retried_writes_every_offset_once(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, kill: str
) -> None:
    """RabbitMQStreamReadOperator (Spark) into `output_path`: killed while its files are staged,
    between the commit record and the watermark store, and after the store; then retried."""
    s = streams.stream("eoa")
    publish(broker, s, [f"m{i}".encode() for i in range(500)])
    out = tmp_path / "out"
    cfg = {"operator": "read", "stream": s, "consumer": "eoa", "out": str(out)}
    _try(broker, tmp_path, {**cfg, "kill": kill, "try_number": 1}, killed=True)
    conn = conn_of(broker)
    assert watermarks(conn, "eoa", stream=s).partitions[0].stored == (499 if kill == "stored" else None)
    if kill == "sink":
        assert _published(out) == []  # staged, not published: readers see nothing yet
    else:
        assert output_offsets(out) == [(s, o) for o in range(500)]  # committed: readers see the range already

    xcom = _try(broker, tmp_path, {**cfg, "kill": "none", "try_number": 2}, killed=False)
    assert output_offsets(out) == [(s, o) for o in range(500)]  # every offset exactly once
    assert watermarks(conn, "eoa", stream=s).partitions[0].stored == 499  # the range's end
    assert _commit_record(out)["ranges"] == {s: [0, 500]}
    assert not (out / STAGING).exists() or not any((out / STAGING).iterdir())
    assert (xcom["pipeline"], xcom["retry_count"]) == (f"{DAG_ID}/read", 1)
    assert xcom["delivery"] == "exactly_once"
    if kill == "sink":  # nothing committed: the retry read and wrote the range again, measuring it
        assert xcom["records_written"] == 500 and xcom["watermark_stored"] and not xcom.get("sink_skipped")
        _assert_measured(xcom)
    if kill == "commit":  # the retry found the record: it wrote nothing and only stored the watermark
        assert xcom["sink_skipped"] is True and xcom["records_written"] == 0 and xcom["watermark_stored"]
    if kill == "stored":  # the try had finished: nothing pending, nothing read
        assert xcom["rows"] == 0 and not xcom["watermark_stored"]


@pytest.mark.parametrize("kill", ["sink", "commit", "stored"])
def test_a_consume_task_killed_anywhere_then_retried_writes_every_offset_once(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, kill: str
) -> None:
    """RabbitMQStreamConsumeOperator (no Spark) into `output_path` on a super stream of two partitions."""
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(300)])
    out = tmp_path / "out"
    cfg = {"operator": "consume", "superstream": name, "consumer": "eoc", "out": str(out)}
    _try(broker, tmp_path, {**cfg, "kill": kill, "try_number": 1}, killed=True)
    conn = conn_of(broker)
    stored = {p.stream: p.stored for p in watermarks(conn, "eoc", superstream=name).partitions}
    assert stored == dict.fromkeys(parts, 299 if kill == "stored" else None)

    xcom = _try(broker, tmp_path, {**cfg, "kill": "none", "try_number": 2}, killed=False)
    assert output_offsets(out) == sorted((p, o) for p in parts for o in range(300))  # every offset once
    stored = {p.stream: p.stored for p in watermarks(conn, "eoc", superstream=name).partitions}
    assert stored == dict.fromkeys(parts, 299)  # the range's end
    assert _commit_record(out)["ranges"] == {p: [0, 300] for p in parts}
    assert (xcom["pipeline"], xcom["retry_count"], xcom["delivery"]) == (
        f"{DAG_ID}/consume",
        1,
        "exactly_once",
    )
    if kill == "sink":  # nothing committed: the retry read and wrote the range, measuring it
        assert xcom["records_written"] == 600 and xcom["watermark_stored"]
        _assert_measured(xcom)
    if kill == "commit":  # committed: the retry only stored the watermark
        assert xcom["sink_skipped"] is True and xcom["watermark_stored"]
    if kill == "stored":  # the try had finished: nothing pending, nothing read
        assert xcom["rows"] == 0 and not xcom["watermark_stored"]
