"""A class-data archive of Spark's classes, for the driver JVMs of the local sessions rmqs starts.

Every Airflow task with a local Spark session, every Dagster run process and every scheduled
`spark-submit` starts a JVM that loads and verifies some 15,000 classes before it reads a message:
seconds of CPU on each start, paid again by every task. The JDK can map classes it loaded before
from an archive instead (class-data sharing: `-XX:SharedArchiveFile`, JDK 13+). rmqs dumps one
archive per Spark installation with `rmqs spark-archive` (a small local job run with
`-XX:ArchiveClassesAtExit`; about 20-50 s, once, e.g. when the image or virtualenv is built), and
`jobs.spark_session` (the sessions of the Airflow operators and Dagster's `SparkSessionResource`)
passes it to the driver JVM when it exists and is current.

The archive changes start-up speed, never behaviour: a JVM whose class path or JDK differs from the
dump's ignores it (`-Xshare:auto`, the default) and starts as usual, silently (`-Xlog:cds=off`).
Nothing is set when the user's conf or environment sets the driver's Java options already, and the
users' own sessions are never touched (docs/cli.md, `rmqs spark-archive`, shows the settings to use there).

This module imports no pyspark: it only finds Spark's jars folder.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ARCHIVE_ENV = "RMQS_SPARK_CLASS_ARCHIVE"
"""The archive's path (default: `spark-classes-<pyspark version>.jsa` in `~/.cache/rmqs`); `off`
turns its use off."""
QUIET = "-Xlog:cds=off,cds+dynamic=off"
"""No note on the JVM's stdout when the archive does not fit this JVM."""
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"

_DUMP_JOB = """
import sys, tempfile
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
df = spark.createDataFrame([(i, str(i)) for i in range(1000)], "id int, v string")
df.groupBy("v").count().collect()
with tempfile.TemporaryDirectory() as d:
    df.write.parquet(d + "/p")
    spark.read.parquet(d + "/p").mapInArrow(lambda it: it, df.schema).count()
spark.stop()
"""


def archive_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where this Spark's archive is (or would be dumped); None when turned off."""
    configured = environ.get(ARCHIVE_ENV, "")
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured)
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rmqs" / f"spark-classes-{_pyspark_version()}.jsa"


def current_archive(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The archive when it exists and is not older than Spark's jars (a reinstall dumps anew)."""
    path = archive_path(environ)
    try:
        return path if path is not None and path.stat().st_mtime >= _jars_folder().stat().st_mtime else None
    except OSError:
        return None


def driver_options(conf: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The conf entries a local session rmqs starts adds: the archive for the driver JVM, when it is
    current and neither the conf nor the environment sets the JVM's options already."""
    if DRIVER_JAVA_OPTIONS in conf or environ.get("JDK_JAVA_OPTIONS") or environ.get("PYSPARK_SUBMIT_ARGS"):
        return {}
    archive = current_archive(environ)
    if archive is None:
        return {}
    return {DRIVER_JAVA_OPTIONS: f"-XX:SharedArchiveFile={archive} {QUIET}"}


def dump_archive(path: Path | None = None, timeout_s: float = 600) -> Path:
    """Dump the archive (a small local Spark job with `-XX:ArchiveClassesAtExit`) and return its path.

    Two dumps at once wait for each other; the file appears whole (a rename) or not at all.
    Raises RuntimeError, with the JVM's last words, when the JDK cannot dump one.
    """
    path = path or archive_path()
    if path is None:
        raise RuntimeError(f"{ARCHIVE_ENV}=off: no archive to dump")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(_lock_path(path), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        partial = path.with_name(path.name + ".partial")
        partial.unlink(missing_ok=True)
        env = {
            **os.environ,
            "JDK_JAVA_OPTIONS": f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial}",
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        }
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        done = subprocess.run(
            [sys.executable, "-c", _DUMP_JOB], env=env, capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0 or not partial.exists():
            raise RuntimeError(f"the JVM dumped no class-data archive: {done.stderr[-500:].strip()}")
        partial.rename(path)  # written at the JVM's exit: newer than the jars, so current
    return path


def wait_for_dump(path: Path) -> None:
    """Return once no `dump_archive` of `path` is under way (it holds the lock while it dumps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(_lock_path(path), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)


def _lock_path(path: Path) -> str:
    return f"{path}.lock"


def _jars_folder() -> Path:
    """Spark's jars, found without importing pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise OSError("pyspark is not installed")
    return Path(spec.origin).parent / "jars"


def _pyspark_version() -> str:
    try:
        from importlib.metadata import version

        return version("pyspark")
    except Exception:
        return "unknown"
