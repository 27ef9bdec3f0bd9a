"""The suite's venv imports compiled pyspark before Spark's source zip (tests/support/pyspark_zip.py)."""

from __future__ import annotations

import os

from tests.support.pyspark_zip import demote

SITE = "/venv/lib/python3.11/site-packages"
LIB = f"{SITE}/pyspark/python/lib"


def test_the_zips_of_the_pyspark_beside_go_last_and_everything_else_keeps_its_order() -> None:
    path = [
        "/job",
        f"{LIB}/pyspark.zip",
        f"{LIB}/py4j-0.10.9.9-src.zip",
        f"{SITE}/pyspark/jars/spark-core_2.13-4.3.0.jar",
        f"{LIB}/pyspark.zip",  # Spark puts them on PYTHONPATH twice
        "/usr/lib/python311.zip",
        SITE,
    ]
    demote(path, SITE)
    assert path == [
        "/job",
        f"{SITE}/pyspark/jars/spark-core_2.13-4.3.0.jar",
        "/usr/lib/python311.zip",
        SITE,
        f"{LIB}/pyspark.zip",
        f"{LIB}/py4j-0.10.9.9-src.zip",
        f"{LIB}/pyspark.zip",
    ]


def test_a_zip_of_another_spark_installation_stays_first() -> None:
    other = os.path.join("/opt/spark/python/lib", "pyspark.zip")
    path = [other, SITE]
    demote(path, SITE)
    assert path == [other, SITE]
