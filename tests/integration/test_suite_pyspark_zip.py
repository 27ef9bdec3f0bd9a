"""With `rmqs spark-archive --compiled-pyspark` installed (the suite's venv: tests/support/pyspark_zip.py),
Spark's Python workers run the venv's compiled pyspark: the check that it still takes effect, e.g.
after Spark changes its workers' PYTHONPATH."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import pytest

from pyspark_rmqs.spark import pythonpath


def test_spark_python_workers_import_the_venvs_compiled_pyspark(spark: Any) -> None:
    if not pythonpath.installed():
        pytest.skip("no suite .pth in this venv (make setup installs it)")

    def where(_: object) -> str:
        import pyspark

        return str(pyspark.__file__)

    (origin,) = spark.sparkContext.parallelize([0], 1).map(where).collect()
    assert ".zip" not in origin, origin
    assert origin == str(Path(sysconfig.get_paths()["purelib"]) / "pyspark" / "__init__.py")
