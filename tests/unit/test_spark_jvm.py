"""Which local sessions map Spark's class-data archive (`pyspark_rmqs.spark.jvm`), and when not."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pyspark_rmqs.cli.app import app
from pyspark_rmqs.spark import jvm


def _fresh(path: Path) -> Path:
    path.write_bytes(b"archive")
    later = time.time() + 5
    os.utime(path, (later, later))  # newer than Spark's jars
    return path


def test_the_archive_path_is_the_users_the_cache_or_off(tmp_path: Path) -> None:
    assert jvm.archive_path({jvm.ARCHIVE_ENV: str(tmp_path / "a.jsa")}) == tmp_path / "a.jsa"
    assert jvm.archive_path({jvm.ARCHIVE_ENV: "off"}) is None
    default = jvm.archive_path({"XDG_CACHE_HOME": str(tmp_path)})
    assert default is not None and default.parent == tmp_path / "rmqs"
    assert default.name.startswith("spark-classes-") and default.suffix == ".jsa"


def test_only_a_current_archive_is_used(tmp_path: Path) -> None:
    path = tmp_path / "a.jsa"
    env = {jvm.ARCHIVE_ENV: str(path)}
    assert jvm.current_archive(env) is None  # none dumped
    path.write_bytes(b"archive")
    os.utime(path, (0, 0))  # older than Spark's jars: a reinstall since the dump
    assert jvm.current_archive(env) is None
    _fresh(path)
    assert jvm.current_archive(env) == path


def test_a_session_maps_the_archive_unless_the_user_set_java_options(tmp_path: Path) -> None:
    path = _fresh(tmp_path / "a.jsa")
    env = {jvm.ARCHIVE_ENV: str(path)}
    assert jvm.driver_options({}, env) == {
        "spark.driver.extraJavaOptions": f"-XX:SharedArchiveFile={path} -Xlog:cds=off,cds+dynamic=off"
    }
    assert jvm.driver_options({"spark.driver.extraJavaOptions": "-Xss4m"}, env) == {}
    assert jvm.driver_options({}, {**env, "JDK_JAVA_OPTIONS": "-Xss4m"}) == {}
    assert (
        jvm.driver_options({}, {**env, "PYSPARK_SUBMIT_ARGS": "--driver-java-options x pyspark-shell"}) == {}
    )
    assert jvm.driver_options({}, {jvm.ARCHIVE_ENV: "off"}) == {}
    assert jvm.driver_options({}, {jvm.ARCHIVE_ENV: str(tmp_path / "none.jsa")}) == {}


def test_spark_archive_says_why_it_dumped_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm.ARCHIVE_ENV, "off")
    result = CliRunner().invoke(app, ["spark-archive"])
    assert result.exit_code == 1
    assert "RMQS_SPARK_CLASS_ARCHIVE=off" in result.output
