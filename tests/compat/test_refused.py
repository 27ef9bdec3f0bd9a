"""Below each declared range: an older PySpark, Airflow or Dagster is refused on import, saying why.

`make test-compat`'s `spark-4.0`, `airflow-3.1` and `dagster-1.12.0` ends run this file in venvs
holding that real release, rmqs (no extra: each would refuse the version at install) and pytest,
without the suite's conftest. Each test runs only where its product is installed below rmqs's
minimum; elsewhere it is skipped (`make test`'s versions are supported: tests/unit/test_versions.py
checks the check itself there). Imports run in a new interpreter each, as a user's process would.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_rmqs.core.versions import AIRFLOW, DAGSTER, PYSPARK, Minimum, installed, too_old


def _below(minimum: Minimum) -> str:
    found = installed(minimum)
    if found is None or too_old(minimum, found) is None:
        pytest.skip(f"{minimum.product} {found or '(not installed)'} is not below {minimum.version}")
    return found


def _import_fails(statement: str) -> str:
    done = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, f"{statement!r} worked"
    return done.stderr


def _says_why(stderr: str, minimum: Minimum, found: str) -> None:
    assert "UnsupportedVersionError" in stderr, stderr[-2000:]
    assert f"rmqs needs {minimum.product} {minimum.version} or later: {minimum.why}" in stderr
    assert f"This is {minimum.product} {found}" in stderr


@pytest.mark.parametrize(
    "statement",
    [
        "import airflow_rmqs",
        "from airflow_rmqs.operators import RabbitMQStreamReadOperator",
        "from airflow_rmqs.get_provider_info import get_provider_info",
    ],
)
def test_an_older_airflow_is_refused_on_import(statement: str) -> None:
    found = _below(AIRFLOW)
    _says_why(_import_fails(statement), AIRFLOW, found)


@pytest.mark.parametrize(
    "statement", ["import dagster_rmqs", "from dagster_rmqs.assets import build_stream_asset"]
)
def test_an_older_dagster_is_refused_on_import(statement: str) -> None:
    found = _below(DAGSTER)
    _says_why(_import_fails(statement), DAGSTER, found)


def test_an_older_pyspark_is_refused_on_import() -> None:
    found = _below(PYSPARK)
    stderr = _import_fails("from pyspark_rmqs.spark.source import RabbitMQStreamsDataSource")
    _says_why(stderr, PYSPARK, found)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    _below(PYSPARK)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_an_older_pyspark_says_why_when_the_format_is_used(spark: Any) -> None:
    """PySpark registers every `pyspark_*` module's DefaultSource: on an older PySpark, rmqs's is a
    source that fails when used, with the reason, and the session's other sources still work."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class Numbers(DataSource):
        @classmethod
        def name(cls) -> str:
            return "numbers"

        def schema(self) -> str:
            return "n int"

        def reader(self, schema: Any) -> DataSourceReader:
            class Reader(DataSourceReader):
                def read(self, partition: Any) -> Iterator[tuple[int]]:
                    yield from ((n,) for n in range(3))

            return Reader()

    spark.dataSource.register(Numbers)
    assert [r.n for r in spark.read.format("numbers").load().collect()] == [0, 1, 2]
    with pytest.raises(Exception) as raised:
        spark.read.format("rabbitmq_streams").option("stream", "orders").load().collect()
    message = str(raised.value)
    assert f"rmqs needs PySpark {PYSPARK.version} or later: {PYSPARK.why}" in message, message[-3000:]
    assert f"This is PySpark {installed(PYSPARK)}" in message
    # The other source still loads after rmqs's refused (the lookup was not broken by it).
    assert spark.read.format("numbers").load().count() == 3
