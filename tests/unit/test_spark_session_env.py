"""A Spark session rmqs starts sets its Python workers' interpreter, unless the user chose one.

Without it a script run as `venv/bin/python x.py` (the venv not activated) starts Spark's Python
workers with the system `python3`, which has no rmqs: DATA_SOURCE_NOT_FOUND (docs/troubleshooting.md).
The end-to-end proof is tests/e2e/test_wheel_install.py (a fresh venv, PYSPARK_PYTHON unset).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from pyspark_rmqs import jobs


def test_this_interpreter_when_the_user_set_nothing() -> None:
    assert jobs.worker_python_env({}, {}) == {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


@pytest.mark.parametrize(
    ("conf", "environ"),
    [
        ({}, {"PYSPARK_PYTHON": "/opt/py/bin/python"}),
        ({}, {"PYSPARK_DRIVER_PYTHON": "/opt/py/bin/python"}),
        ({"spark.pyspark.python": "/opt/py/bin/python"}, {}),
        ({"spark.pyspark.driver.python": "/opt/py/bin/python"}, {}),
    ],
)
def test_the_users_choice_is_kept(conf: dict[str, str], environ: dict[str, str]) -> None:
    assert jobs.worker_python_env(conf, environ) == {}


class _Builder:
    """Stands in for SparkSession.builder: records what a session would start with, starts no JVM."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}
        self.master_url = ""

    def master(self, url: str) -> _Builder:
        self.master_url = url
        return self

    def appName(self, name: str) -> _Builder:
        return self

    def config(self, key: str, value: str) -> _Builder:
        self.conf[key] = value
        return self

    def getOrCreate(self) -> dict[str, Any]:
        env = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")}
        return {"env": env, "master": self.master_url, "conf": self.conf}


@pytest.fixture
def fake_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "builder", _Builder())
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("fake_builder")
def test_spark_session_sets_the_workers_python_and_keeps_a_cluster_reachable() -> None:
    local: Any = jobs.spark_session()
    assert local["env"] == {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    assert local["master"] == "local[2]"


@pytest.mark.usefixtures("fake_builder")
def test_spark_session_leaves_a_cluster_driver_address_and_a_chosen_python_alone() -> None:
    chosen = {"spark.pyspark.python": "/opt/py/bin/python"}
    cluster: Any = jobs.spark_session(master="spark://spark-master:7077", conf=chosen)
    assert cluster["env"] == {"PYSPARK_PYTHON": None, "PYSPARK_DRIVER_PYTHON": None, "SPARK_LOCAL_IP": None}
    assert cluster["conf"]["spark.pyspark.python"] == "/opt/py/bin/python"
