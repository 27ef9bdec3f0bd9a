"""Shared fixtures: one real broker per test session, unique streams per test, one SparkSession."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from urllib.parse import quote

import pytest

# Pooled broker connections close after 15 s idle instead of 60 s (a documented setting, read when
# pyspark_rmqs.broker.pool is imported: before any test module, and inherited by Spark's workers):
# the soak checks that every connection closes once idle, and waited up to 90 s for it.
os.environ.setdefault("RMQS_POOL_IDLE_SECONDS", "15")
# The venv is installed without bytecode (Makefile): every process of the run (xdist workers, Spark's
# Python workers, subprocess jobs) writes the .pyc of what it imports, once, and later ones load it,
# also where PYTHONDONTWRITEBYTECODE is set; otherwise each would compile Airflow or pyspark again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from tests.support import broker as tb
from tests.support import jvm
from tests.support import s3 as ts3
from tests.support.serial import SERIAL

sys.dont_write_bytecode = False  # this process too (see above)

# Per-test CPU and memory (make test's report), and the memory limit per test process.
pytest_plugins = ["tests.support.timing", "tests.support.memory"]
# rmqs's own pytest plugin (pytest_rmqs: rmqs_* fixtures) loads through its `pytest11` entry point
# where rmqs is installed from this pyproject; a venv installed before the entry point existed gets it here.
if not any(ep.name == "rmqs" for ep in entry_points(group="pytest11")):
    pytest_plugins.append("pytest_rmqs.plugin")


def pytest_configure(config: pytest.Config) -> None:
    """Every JVM the tests start (xdist workers inherit this process's environment) starts with the
    client compiler and Spark's class-data archive: half the CPU of a default start (tests/support/jvm.py)."""
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        jvm.configure()


@pytest.fixture(scope="session")
def broker() -> tb.BrokerSettings:
    """Connection settings of a real broker: RMQS_TEST_URI's, else the local one (started if needed)."""
    settings = tb.settings_from_env()
    if not settings.external:
        tb.ensure_local_broker()
    return settings


@pytest.fixture(scope="session")
def restartable_broker() -> tb.BrokerSettings:
    """The second local broker, which the tests that stop, restart or pause a broker may: their files
    override `broker` with it (so `streams` makes their streams there). Skipped with RMQS_TEST_URI."""
    if tb.settings_from_env().external:
        pytest.skip("RMQS_TEST_URI points at a broker these tests must not stop, restart or pause")
    return tb.ensure_restartable_broker()


class StreamFactory:
    """Creates uniquely named streams and super streams, and deletes them at teardown."""

    def __init__(self, settings: tb.BrokerSettings) -> None:
        self.settings = settings
        self._streams: list[str] = []
        self._super_streams: list[str] = []

    def stream(self, prefix: str = "s", arguments: dict[str, object] | None = None) -> str:
        name = tb.unique_name(prefix)
        tb.run(tb.create_stream(self.settings, name, arguments))
        self._streams.append(name)
        return name

    def super_stream(self, partitions: int = 3, prefix: str = "ss") -> tuple[str, list[str]]:
        name = tb.unique_name(prefix)
        parts = tb.run(tb.create_super_stream(self.settings, name, partitions))
        self._super_streams.append(name)
        return name, parts

    def add_partition(
        self,
        superstream: str,
        index: int,
        arguments: dict[str, object] | None = None,
        *,
        name: str | None = None,
    ) -> str:
        """A new partition stream (`<superstream>-<index>` unless `name`), bound with routing key
        `<index>` after the others (the local broker's management API: the stream protocol cannot
        add a partition)."""
        name = name or f"{superstream}-{index}"
        tb.run(tb.create_stream(self.settings, name, arguments))
        self._streams.append(name)
        vhost = quote(self.settings.vhost, safe="")
        tb.management(
            "POST",
            f"bindings/{vhost}/e/{quote(superstream, safe='')}/q/{quote(name, safe='')}",
            {"routing_key": str(index), "arguments": {"x-stream-partition-order": index}},
        )
        return name

    def cleanup(self) -> None:
        for name in self._streams:
            tb.run(tb.delete_stream(self.settings, name))
        for name in self._super_streams:
            tb.run(tb.delete_super_stream(self.settings, name))


@pytest.fixture
def streams(broker: tb.BrokerSettings) -> Iterator[StreamFactory]:
    factory = StreamFactory(broker)
    yield factory
    factory.cleanup()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession for the whole run (a session costs ~15-20 s here)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["TZ"] = "UTC"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("rmqs-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
    # py4j logs its shutdown after pytest closed the captured streams: keep that out of the output.
    logging.getLogger("py4j").setLevel(logging.ERROR)


# Whole files one worker runs: they build a module-scoped server, cluster or broker user once. The two
# Spark Connect files share one group: a Connect server is a JVM, better started on one worker.
FILE_GROUPS = {
    "tests/integration/test_secrets.py": "secrets",
    "tests/integration/test_tls.py": "tls",
    "tests/integration/test_cli_commands.py": "cli-commands",
    "tests/integration/test_connect_errors.py": "connect",
    "tests/airflow/test_spark_connect_operators.py": "connect",
    "tests/e2e/test_spark_connect.py": "connect",
    "tests/airflow/test_slim_install.py": "slim",
    # One worker, one after the other: they stop, restart and pause the second broker.
    "tests/e2e/faults/test_broker_restart.py": "restartable",
    "tests/e2e/faults/test_paused_broker.py": "restartable",
    "tests/airflow/test_trigger_restart.py": "restartable",
    "tests/campaign/test_broker_faults.py": "restartable",
    # They wait for the broker's clock to cross minute boundaries at ~0 CPU (50-80 s each): one after
    # the other on one worker, so that two workers never wait on the clock at once while a core idles
    # (a fresh clone's run: two did, and the machine's CPU fell to 21-70% for a minute).
    "tests/dagster/test_time_windows.py": "clock",
}


# Every other test goes to whichever worker is free: each worker has its own SparkSession and Airflow
# database anyway (one JVM each, ~8 s of CPU with the suite's JVM options), and scheduling test by
# test keeps the workers busy to the end, where whole files (the fault tests as one group: 825 s of a
# 1,119 s phase) left one worker idle while the other finished.


@pytest.hookimpl(tryfirst=True)  # before xdist turns xdist_group marks into its scheduling ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by folder and fixtures, so `-m 'not broker'` runs the pure unit tests alone; mark the
    tests that must run alone (`serial`) and the xdist group of the others."""
    # Under pytest-xdist the workers collect, and their collection is what the controller schedules.
    on_worker = hasattr(config, "workerinput")
    for item in items:
        fixtures: Callable[[], list[str]] | list[str] = getattr(item, "fixturenames", [])
        names = set(fixtures if isinstance(fixtures, list) else [])
        if names & {"broker", "streams"}:
            item.add_marker(pytest.mark.broker)
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        if item.nodeid.startswith("tests/unit/"):
            item.add_marker(pytest.mark.unit)
        if item.nodeid.startswith("tests/containers/"):
            item.add_marker(pytest.mark.containers)
        if item.nodeid.startswith("tests/spark_cluster/"):
            item.add_marker(pytest.mark.spark_cluster)
    if not on_worker:
        return
    items.sort(key=_start_order)
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("serial") is None and (group := FILE_GROUPS.get(path)):
            item.add_marker(pytest.mark.xdist_group(name=group))
            if getattr(config.option, "loadgroup", False):
                _schedule_in_group(item, group)


# On xdist workers the long tests start first and the short ones fill in at the end, so that no worker
# is still on a 3-minute fault test when the other has nothing left (workers take tests in this order).
_ORDER = (
    "tests/e2e/",
    "tests/dagster/test_time_windows.py",
    "tests/airflow/",
    "tests/dagster/",
    "tests/integration/",
)


def _start_order(item: pytest.Item) -> int:
    return next((i for i, prefix in enumerate(_ORDER) if item.nodeid.startswith(prefix)), len(_ORDER))


def _schedule_in_group(item: pytest.Item, group: str) -> None:
    """Give the test the `<nodeid>@<group>` id `--dist loadgroup` schedules by.

    pytest-xdist 3.8 sets `item._nodeid` for that, which pytest 9.2 no longer reads (ids are
    structured, `item._id`), so its groups silently did nothing: set the id the way pytest keeps it.
    """
    if "@" in item.nodeid:
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: xdist's own `_nodeid` suffix works there
        return
    if hasattr(item, "_id"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture(scope="session")
def s3() -> Iterator[ts3.S3Server]:
    """A real S3 endpoint on loopback (moto's server, IAM enforced) for the whole run: tests/support/s3.py."""
    server = ts3.start()
    yield server
    assert server.process is not None
    ts3.stop(server.process)
