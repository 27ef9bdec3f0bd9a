"""Spark's Python processes import compiled pyspark, not pyspark.zip's sources (spark/pythonpath.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_rmqs.spark import pythonpath
from pyspark_rmqs.spark.pythonpath import drop_zips

SITE = "/venv/lib/python3.11/site-packages"


def _installed(tmp_path: Path, *packages: str) -> str:
    site = tmp_path / "site-packages"
    for package in packages:
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    return str(site)


def test_the_zips_of_the_pyspark_beside_go_off_the_path_and_everything_else_keeps_its_order(
    tmp_path: Path,
) -> None:
    """Off, not to the end: Python 3.13.5 then failed PySpark's data source lookup with a KeyError on
    a zip at the end of the path (seen in `make test-compat`'s java-21 end, Debian 13)."""
    site = _installed(tmp_path, "pyspark", "py4j")
    lib = f"{site}/pyspark/python/lib"
    path = [
        "/job",
        f"{lib}/pyspark.zip",
        f"{lib}/py4j-0.10.9.9-src.zip",
        f"{site}/pyspark/jars/spark-core_2.13-4.3.0.jar",
        f"{lib}/pyspark.zip",  # Spark puts them on PYTHONPATH twice
        "/usr/lib/python311.zip",
        site,
    ]
    drop_zips(path, site)
    assert path == ["/job", f"{site}/pyspark/jars/spark-core_2.13-4.3.0.jar", "/usr/lib/python311.zip", site]


def test_py4js_zip_stays_where_it_is_without_py4j_installed_beside(tmp_path: Path) -> None:
    site = _installed(tmp_path, "pyspark")
    lib = f"{site}/pyspark/python/lib"
    path = [f"{lib}/pyspark.zip", f"{lib}/py4j-0.10.9.9-src.zip", site]
    drop_zips(path, site)
    assert path == [f"{lib}/py4j-0.10.9.9-src.zip", site]


def test_a_zip_of_another_spark_installation_stays_first() -> None:
    other = os.path.join("/opt/spark/python/lib", "pyspark.zip")
    path = [other, SITE]
    drop_zips(path, SITE)
    assert path == [other, SITE]


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    return site


def test_the_pth_it_installs_drops_the_zips_at_interpreter_start_and_remove_takes_it_out(
    tmp_path: Path,
) -> None:
    site = _site(tmp_path)
    copy = pythonpath.install(str(site))
    assert copy == str(site / f"{pythonpath.MODULE}.py") and pythonpath.installed(str(site))
    zip_ = str(site / "pyspark" / "python" / "lib" / "pyspark.zip")
    # site.addsitedir reads the .pth as the interpreter's start does for its own site-packages (-S: not
    # this venv's, which may hold a copy already).
    probe = f"import site, sys; site.addsitedir({str(site)!r}); print({zip_!r} not in sys.path)"
    env = {**os.environ, "PYTHONPATH": zip_}
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "True", done.stderr
    off = {**env, pythonpath.OFF_ENV: "off"}
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=off, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False", "RMQS_COMPILED_PYSPARK=off leaves the path as it is"
    pythonpath.remove(str(site))
    assert not pythonpath.installed(str(site)) and not Path(copy).exists()


def test_it_refuses_an_environment_without_pyspark(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="pyspark is not installed"):
        pythonpath.install(str(tmp_path))
    assert not pythonpath.installed(str(tmp_path))
