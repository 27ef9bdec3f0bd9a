"""Cost of the orchestration checks against a 50-partition super stream.

    .venv/bin/python -m bench.orchestration [--partitions N] [--checks N]

Times the new-data trigger's check (`RabbitMQStreamNewDataTrigger.check`, on one event loop as in
the triggerer) and the lag sensor's poke (`RabbitMQStreamLagSensor.poke`, sync), after one warm-up
check each, and counts broker connections opened per check by wrapping
`pyspark_rmqs.broker.connect.connect`. Targets: <= 200 ms per check, ~0 connections per check
(one shared metadata connection per event loop, not one per partition). Prints e.g.
`new-data trigger check: 35 ms, 0.0 connections/check`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from bench.common import connection, fill
from pyspark_rmqs.broker import connect as connect_module
from pyspark_rmqs.broker import pool as pool_module
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.options import ConnectionOptions

CONSUMER = "bench-orchestration"


class ConnectCounter:
    """Counts `connect()` calls wherever the pool and the connector look the function up."""

    def __init__(self) -> None:
        self.calls = 0
        self._original = connect_module.connect

    def install(self) -> None:
        original = self._original

        async def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await original(*args, **kwargs)

        connect_module.connect = counting
        pool_module.connect = counting


def airflow_connection(conn: ConnectionOptions) -> None:
    """Point the hook's default connection at the bench broker (before airflow is imported)."""
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="rmqs-bench-airflow-"))
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # one line per check is noise here
    host, port = conn.addresses()[0]
    user, password = quote(conn.username, safe=""), quote(conn.password.get_secret_value(), safe="")
    vhost = quote(conn.vhost, safe="")
    os.environ["AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT"] = (
        f"rabbitmq-stream://{user}:{password}@{host}:{port}/{vhost}"
    )


def setup(conn: ConnectionOptions, partitions: int) -> str:
    """A super stream with data in every partition and a stored watermark on half of them."""
    name = f"bench-orch-{uuid.uuid4().hex[:8]}"
    client = BrokerClient(conn)
    client.create_super_stream(name, partitions)
    parts = client.partitions(name)
    for p in parts:
        fill(conn, p, 20, size=50, batch=20)
    client.store_offsets(CONSUMER, {p: 9 for p in parts[::2]})
    return name


def report(label: str, seconds: list[float], connects: int) -> None:
    ms = statistics.median(seconds) * 1000
    worst = max(seconds) * 1000
    print(
        f"{label}: {ms:.0f} ms, {connects / len(seconds):.1f} connections/check "
        f"(median of {len(seconds)}, max {worst:.0f} ms)",
        flush=True,
    )


def trigger_checks(superstream: str, checks: int, counter: ConnectCounter) -> None:
    from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

    async def run() -> tuple[list[float], int]:
        trigger = RabbitMQStreamNewDataTrigger(superstream=superstream, consumer_name=CONSUMER)
        await trigger.check()  # warm-up: connection lookup and the shared metadata connection
        before, times = counter.calls, []
        for _ in range(checks):
            t = time.perf_counter()
            w = await trigger.check()
            times.append(time.perf_counter() - t)
            assert w.total_lag > 0
        return times, counter.calls - before

    times, connects = asyncio.run(run())
    report("new-data trigger check", times, connects)


def sensor_checks(superstream: str, checks: int, counter: ConnectCounter) -> None:
    from airflow_rmqs.sensors import RabbitMQStreamLagSensor

    sensor = RabbitMQStreamLagSensor(
        task_id="lag", superstream=superstream, consumer_name=CONSUMER, max_lag=0
    )
    poke: Callable[[], Any] = lambda: sensor.poke({})  # noqa: E731
    poke()  # warm-up
    before, times = counter.calls, []
    for _ in range(checks):
        t = time.perf_counter()
        assert not poke().is_done
        times.append(time.perf_counter() - t)
    report("lag sensor check", times, counter.calls - before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=50)
    ap.add_argument("--checks", type=int, default=20)
    args = ap.parse_args()
    conn = connection()
    airflow_connection(conn)
    counter = ConnectCounter()
    counter.install()
    superstream = setup(conn, args.partitions)
    try:
        trigger_checks(superstream, args.checks, counter)
        sensor_checks(superstream, args.checks, counter)
    finally:
        BrokerClient(conn).delete_super_stream(superstream)


if __name__ == "__main__":
    main()
