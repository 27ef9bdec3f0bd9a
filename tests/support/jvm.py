"""How the suite's JVMs start: the client compiler only, and a class-data archive of Spark's classes.

The suite starts some thirty JVMs (the shared SparkSessions, Spark Connect servers, a standalone
cluster, and every fault test's Spark application, which is killed and started again), each for
seconds to minutes of small work. A default JVM spends most of its CPU on start-up: loading and
verifying ~15,000 classes and compiling them twice (C1, then C2). On this 2-core machine a local
SparkSession that runs two small jobs took 23.6 s of JVM CPU; with `-XX:TieredStopAtLevel=1`
(C1 only: no C2 compile threads) 11.8 s, and with the archive below as well 7.9-8.9 s.

The archive (`-XX:SharedArchiveFile`, JDK 13+) is dumped once per virtualenv from a run of a small
Spark job (`python -m tests.support.jvm`, which `make test` starts once the venv is installed;
~40-110 s;
the dump is `pyspark_rmqs.spark.jvm.dump_archive`, what `rmqs spark-archive` runs) and used when it
is there and current: a session never waits for a dump. The set-up no longer waits for it either
(it was the last 40-60 s of a fresh clone's set-up): the JVMs started while it is dumped run
without it, and every later one maps it. A JVM whose class path or JDK differs from the dump's
ignores it and starts as usual: the archive changes speed, never behaviour. The options reach every
JVM the tests start through `JDK_JAVA_OPTIONS`, which the `java` launcher reads (it notes so on
stderr); a value the user set is kept as it is. The production code never compiles C1-only; it
maps an archive only for the local sessions rmqs itself starts, when the user dumped one
(`pyspark_rmqs.spark.jvm`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pyspark_rmqs.spark import jvm as spark_jvm

ARCHIVE = Path(sys.prefix) / "rmqs-spark-classes.jsa"
C1_ONLY = "-XX:TieredStopAtLevel=1"
# The serial collector and one compiler thread: G1's concurrent threads and a second C1 thread cost
# a short JVM CPU that 2 cores shared by three test workers do not have (a local session running a
# read: 8.4 s of JVM CPU -> 7.1 s; measured with process accounting, three runs each). Heaps here
# are at most 1 GB and the suite measures correctness, not GC pauses.
LEAN = "-XX:+UseSerialGC -XX:CICompilerCount=1 -XX:-UsePerfData"
# C1 only; the archive when it loads; no note on stdout when it cannot (another class path or JDK).
BASE_OPTIONS = f"{C1_ONLY} {LEAN} {spark_jvm.QUIET}"


def current_archive() -> Path | None:
    """The suite's archive when it exists and is not older than this virtualenv's Spark jars."""
    return spark_jvm.current_archive({spark_jvm.ARCHIVE_ENV: str(ARCHIVE)})


def ensure_archive(timeout_s: float = 300) -> Path | None:
    """The archive for this virtualenv's Spark, dumped when missing or older than Spark's jars;
    None when it cannot be made (a JDK without a base archive): the suite then runs without it.
    A dump under way (`make test` starts one beside pytest) is waited for, not repeated."""
    if current_archive():
        return ARCHIVE
    spark_jvm.wait_for_dump(ARCHIVE)
    if current_archive():
        return ARCHIVE
    t0 = time.monotonic()
    try:
        spark_jvm.dump_archive(ARCHIVE, timeout_s)  # two dumps at once wait for each other
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"jvm: no class-data archive ({e})", file=sys.stderr)
        return None
    print(f"jvm: dumped {ARCHIVE} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return ARCHIVE


def java_options(archive: Path | None) -> str:
    """The JDK_JAVA_OPTIONS of the suite's JVMs."""
    return BASE_OPTIONS + (f" -XX:SharedArchiveFile={archive}" if archive else "")


def configure() -> None:
    """Set JDK_JAVA_OPTIONS for every JVM this process and its children start (unless set)."""
    if "JDK_JAVA_OPTIONS" in os.environ or os.environ.get("RMQS_TEST_JVM_DEFAULTS") == "1":
        return
    archive = current_archive()
    if archive is None and not ARCHIVE.exists():
        # Being dumped beside the run (scripts/test.sh): a JVM started before the file appears (whole,
        # by a rename) finds none and starts without class-data sharing; every later one maps it.
        archive = ARCHIVE
    os.environ["JDK_JAVA_OPTIONS"] = java_options(archive)


if __name__ == "__main__":
    print(ensure_archive())
