"""A local session rmqs starts (`jobs.spark_session`) maps the class-data archive in its driver JVM.

In a new process, as an Airflow task starts one, with the suite's archive (dumped by `make test` with
`pyspark_rmqs.spark.jvm.dump_archive`, what `rmqs spark-archive` runs) and none of the suite's own
JVM options: the JVM's `VM.info` shows the archive mapped beside the JDK's base archive.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import jvm as suite_jvm

pytestmark = [pytest.mark.spark, pytest.mark.slow]

_SESSION = """
import subprocess
from pyspark_rmqs import jobs
spark = jobs.spark_session(master="local[1]")
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
info = subprocess.run(["jcmd", str(pid), "VM.info"], capture_output=True, text=True).stdout
print(next(line for line in info.splitlines() if line.startswith("CDS archive(s) mapped at")))
spark.stop()
"""


def _mapped_bytes(archive: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("JDK_JAVA_OPTIONS", "PYSPARK_SUBMIT_ARGS")}
    env["RMQS_SPARK_CLASS_ARCHIVE"] = archive
    done = subprocess.run(
        [sys.executable, "-c", _SESSION], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(re.search(r"size (\d+)", done.stdout).group(1))  # type: ignore[union-attr]


def test_a_local_session_rmqs_starts_maps_the_archive() -> None:
    archive = suite_jvm.ensure_archive()  # waits for the dump make test started beside pytest
    if archive is None:
        pytest.skip("this JDK cannot dump a class-data archive")
    java_home = Path(
        subprocess.run(["readlink", "-f", "/usr/bin/java"], capture_output=True, text=True).stdout
    )
    base = java_home.parent.parent / "lib" / "server" / "classes.jsa"
    base_size = base.stat().st_size if base.exists() else 20 << 20
    # The base archive alone maps its own size; with Spark's classes it maps some 200 MB.
    assert _mapped_bytes(str(archive)) > base_size + (50 << 20)
