"""The Spark consumers' rule: a watermark run through Airflow's `RabbitMQStreamReadOperator` on a
local SparkSession (pipelines `c6@<target>`), or through Dagster's Spark engine
(`build_stream_asset(engine="spark")` with a `SparkSessionResource` on the same session: `c9@<target>`),
into an exactly-once Parquet folder.

The same run protocol as the Spark-free consumers (plan, record, lease, commit, store), but its
rows go through the Spark data source and its files through Spark's exactly-once file commit
(staging, publish, commit record): a different writer under the same records. Every other rule that
touches a target (publish, truncate, recreate, bind) reaches this consumer too, and the final check
runs it. A Spark run costs seconds (the session ~15 s once): the rule, and with it the consumer, is
off in the in-suite budget (config.SUITE) and on in `make campaign`.
"""

from __future__ import annotations

import os
import sys

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.campaign.faults import CRASH_POINTS
from tests.campaign.harness import TARGETS
from tests.campaign.killed import KilledRules


def spark_environment() -> None:
    """Spark's Python workers run this interpreter, its driver binds to loopback (as tests/conftest.py's
    `spark` fixture sets them up); set only where the environment says nothing."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


class SparkRules(KilledRules):
    """`spark_run` (see the module docstring)."""

    @rule(
        to=st.sampled_from(TARGETS),
        consumer=st.sampled_from(("c6", "c9")),
        crash=st.sampled_from((None, None, *CRASH_POINTS)),
        retry=st.booleans(),
    )
    def spark_run(self, to: str, consumer: str, crash: str | None, retry: bool) -> None:
        """A watermark run of Spark consumer `consumer` (c6: Airflow's read operator; c9: Dagster's
        Spark engine) on target `to`; with `crash`, its process dies at that step after the sink (the
        in-process `Crash`), and with `retry` it runs again at once."""
        if not self._step("spark_run"):
            return
        spark_environment()
        key = f"{consumer}@{to}"
        first = self._watermark_run(key, crash=crash)
        if retry and first is not None and not first.ok:
            self._watermark_run(key)

    @precondition(lambda self: self.config.enabled("iceberg_run"))
    @rule(
        to=st.sampled_from(TARGETS),
        fault=st.sampled_from((None, "sink:0", "sink:1", *CRASH_POINTS)),
        retry=st.booleans(),
    )
    def iceberg_run(self, to: str, fault: str | None, retry: bool) -> None:
        """A watermark run of the Iceberg consumer on target `to` (the Airflow consume operator into
        an Iceberg table); its sink failing before batch 0 or 1 (`sink:k`), or its process dying at a
        protocol step (`CRASH_POINTS`); with `retry` it runs again at once."""
        if not self._step("iceberg_run"):
            return
        key = f"c8@{to}"
        fail_after = int(fault.split(":")[1]) if fault and fault.startswith("sink:") else None
        crash = fault if fault in CRASH_POINTS else None
        first = self._watermark_run(key, fail_after=fail_after, crash=crash)
        if retry and first is not None and not first.ok:
            self._watermark_run(key)
