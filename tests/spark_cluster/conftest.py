"""Fixtures of the `spark_cluster` tier (`make test-spark-cluster`): a standalone Spark master and two
one-core workers for the session, and a SparkSession whose executors run on them.

Opt-in like the RabbitMQ cluster tier: skipped unless `RMQS_TEST_SPARK_CLUSTER=1` (what the make
target sets), so a plain `pytest` over the suite never starts three more JVMs.

The workers have two cores in all and an application keeps its executors until it stops, so a
second application (an Airflow task or a Dagster step in a process of its own) would wait forever
for cores while this process's session runs: `ClusterSession.release()` stops the session and waits
until the cluster is free; the next `get()` starts a new one on the same cluster.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.spark_cluster.standalone import StandaloneCluster, start
from tests.support.connect_server import free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENABLE_ENV = "RMQS_TEST_SPARK_CLUSTER"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tier's tests; run those whose driver is this process first, then those that free the
    cluster for a driver of their own (`free_cluster`): the session then starts once, not per file."""
    for item in items:
        if item.nodeid.startswith("tests/spark_cluster/"):
            item.add_marker(pytest.mark.spark_cluster)

    def frees(item: pytest.Item) -> bool:
        names = getattr(item, "fixturenames", [])
        return item.nodeid.startswith("tests/spark_cluster/") and "free_cluster" in names

    items.sort(key=frees)  # stable: the order within each kind is kept


def session_conf(cluster: StandaloneCluster, ui_port: int) -> dict[str, str]:
    """A driver on loopback whose executors take one core each (one executor per worker).

    The UI is on (a free port) for its REST API: the fault tests read which executor ran which task
    attempt there. Executor memory is small: two executors, a driver and three daemons share the
    machine with the rest of the suite's processes."""
    return {
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "true",
        "spark.ui.port": str(ui_port),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.task.maxFailures": "4",
    }


class ClusterSession:
    """This process's SparkSession on the cluster, started on first use and stoppable between tests."""

    def __init__(self, cluster: StandaloneCluster) -> None:
        self.cluster = cluster
        self.ui_port = free_port()
        self._session: SparkSession | None = None

    def get(self) -> SparkSession:
        if self._session is None:
            from pyspark.sql import SparkSession

            builder = SparkSession.builder.master(self.cluster.url).appName("rmqs-spark-cluster-tests")
            for k, v in session_conf(self.cluster, self.ui_port).items():
                builder = builder.config(k, v)
            self._session = builder.getOrCreate()
            self._session.sparkContext.setLogLevel("WARN")
        return self._session

    @property
    def ui(self) -> str:
        """The driver's UI (its REST API under /api/v1)."""
        return f"http://127.0.0.1:{self.ui_port}"

    def release(self) -> None:
        """Stop the session and wait until its executors are gone: the cores are free for another app."""
        if self._session is not None:
            self._session.stop()
            self._session = None
        self.cluster.wait_no_applications()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[StandaloneCluster]:
    """The master and two workers, started once and stopped (their process groups) at the end."""
    if os.environ.get(ENABLE_ENV) != "1":
        pytest.skip(f"the Spark cluster tier: `make test-spark-cluster` ({ENABLE_ENV}=1)")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the "same path" recipe: executors run this venv
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["TZ"] = "UTC"
    # CI stops a tier that outruns its budget with SIGTERM: turned into KeyboardInterrupt, which pytest
    # answers by tearing the fixtures down, so the daemons (sessions of their own) are stopped too.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    cluster = start()
    try:
        yield cluster
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def cluster_session(spark_cluster: StandaloneCluster) -> Iterator[ClusterSession]:
    """The session-scoped SparkSession holder (stopped at the end, before the cluster)."""
    holder = ClusterSession(spark_cluster)
    yield holder
    holder.release()
    logging.getLogger("py4j").setLevel(logging.ERROR)


@pytest.fixture
def cluster_spark(cluster_session: ClusterSession) -> SparkSession:
    """The session's SparkSession on the cluster (started again if a test released it)."""
    return cluster_session.get()


@pytest.fixture
def free_cluster(cluster_session: ClusterSession, spark_cluster: StandaloneCluster) -> StandaloneCluster:
    """The cluster with no application on it: for a test whose Spark driver runs in a subprocess."""
    cluster_session.release()
    spark_cluster.wait_workers(2)
    return spark_cluster
