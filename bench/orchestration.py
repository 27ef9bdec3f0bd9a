"""Cost of the orchestration checks: one check of an N-partition super stream, and many watchers.

    .venv/bin/python -m bench.orchestration [--partitions N] [--checks N]
    .venv/bin/python -m bench.orchestration --watchers N [--superstreams S] [--partitions P] [--polls R]

Checks (default): times the new-data trigger's check (`RabbitMQStreamNewDataTrigger.check`, on one
event loop as in the triggerer) and the lag sensor's poke (`RabbitMQStreamLagSensor.poke`, sync),
after one warm-up check each, with the connections opened per check (wrapping
`pyspark_rmqs.broker.connect.connect`), the metadata requests per check and the local broker's CPU
time per check; then a check right after a message was published to every partition (every tail
must be measured again: a subscription per partition on a broker before 4.3). Target: <= 100 ms per
check at 500 partitions, 0 connections per check.

Watchers (`--watchers N`): N new-data triggers run on one event loop as a triggerer runs them (each
its `run()` in its own task, `--poll-interval` apart, on S super streams of P partitions, each
watcher with its own consumer name), while a ticker task wakes every 10 ms and records how late it
wakes (the loop's scheduling lag). Per poll it prints the time from the poll's tick until the last
watcher's check returned, and the requests sent; the first poll (every tail measured) is reported
apart. Target: 100 watchers of 50 partitions: each poll <= 1 s in total, loop lag < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from bench.common import broker_cpu_s, connection, fill_batches
from pyspark_rmqs.broker import connect as connect_module
from pyspark_rmqs.broker import pool as pool_module
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.errors import StreamNotFoundError
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


def setup(conn: ConnectionOptions, partitions: int, superstreams: int = 1) -> list[str]:
    """Super streams with 20 messages in every partition and a stored watermark on half of them."""
    client = BrokerClient(conn)
    names = [f"bench-orch-{uuid.uuid4().hex[:8]}" for _ in range(superstreams)]
    try:
        parts: list[str] = []
        for name in names:
            client.create_super_stream(name, partitions)
            parts += _partitions(client, name, partitions)
        fill_batches(conn, {p: 20 for p in parts}, 0, batch=20, size=50)
        client.store_offsets(CONSUMER, {p: 9 for p in parts[::2]})
    except BaseException:
        for name in names:
            client.delete_super_stream(name)
        raise
    return names


def _partitions(client: BrokerClient, name: str, expected: int) -> list[str]:
    """The partitions once all are bound: a busy broker may answer the creation (or time out and
    have it retried as "already exists") before the bindings are visible."""
    deadline = time.monotonic() + 120
    while True:
        try:
            found = client.partitions(name)
        except StreamNotFoundError:
            found = []
        if len(found) == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def publish_one_each(conn: ConnectionOptions, superstream: str) -> None:
    """One more message in every partition: every tail moved, so every check measures it again."""
    parts = BrokerClient(conn).partitions(superstream)
    fill_batches(conn, {p: 1 for p in parts}, 0, batch=1, size=50)


def requests_sent() -> int:
    """StreamStats / QueryOffset requests the loops' metadata connections sent so far."""
    total = 0
    for pool in list(pool_module._pools.values()):
        for client in list(pool._locators.values()):
            total += getattr(client, "batch_requests", 0)
    return total


def probes_made() -> int:
    pools = list(pool_module._pools.values())
    return sum(lk.tails.probes for pool in pools for lk in getattr(pool, "_lookups", {}).values())


def report(label: str, seconds: list[float], connects: int, extra: str = "") -> None:
    ms = statistics.median(seconds) * 1000
    worst = max(seconds) * 1000
    print(
        f"{label}: {ms:.0f} ms, {connects / len(seconds):.1f} connections/check{extra} "
        f"(median of {len(seconds)}, max {worst:.0f} ms; load {_load()})",
        flush=True,
    )


def _load() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def _per_check(before: tuple[int, int, float | None], checks: int) -> str:
    requests, probes, cpu = before
    after_cpu = broker_cpu_s()
    cpu_ms = (
        "" if cpu is None or after_cpu is None else f", broker CPU {(after_cpu - cpu) * 1000 / checks:.0f} ms"
    )
    return (
        f", {(requests_sent() - requests) / checks:.0f} requests/check, "
        f"{(probes_made() - probes) / checks:.0f} tail subscriptions/check{cpu_ms}"
    )


def trigger_checks(
    conn: ConnectionOptions, superstream: str, checks: int, counter: ConnectCounter, changed: int
) -> None:
    from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

    async def run() -> None:
        trigger = RabbitMQStreamNewDataTrigger(superstream=superstream, consumer_name=CONSUMER)
        await trigger.check()  # warm-up: connection lookup, the shared metadata connection, the tails
        before, times = counter.calls, []
        mark = (requests_sent(), probes_made(), broker_cpu_s())
        for _ in range(checks):
            t = time.perf_counter()
            w = await trigger.check()
            times.append(time.perf_counter() - t)
            assert w.total_lag > 0
        report("new-data trigger check", times, counter.calls - before, _per_check(mark, checks))
        if not changed:
            return
        times, spent = [], 0.0
        mark = (requests_sent(), probes_made(), broker_cpu_s())
        for _ in range(changed):
            await asyncio.to_thread(publish_one_each, conn, superstream)
            cpu = broker_cpu_s()
            t = time.perf_counter()
            await trigger.check()
            times.append(time.perf_counter() - t)
            after = broker_cpu_s()
            spent += 0 if cpu is None or after is None else after - cpu
        report(
            "new-data trigger check, every partition changed",
            times,
            0,
            f", {(probes_made() - mark[1]) / changed:.0f} tail subscriptions/check, "
            f"broker CPU {spent * 1000 / changed:.0f} ms/check",
        )

    asyncio.run(run())


def sensor_checks(superstream: str, checks: int, counter: ConnectCounter) -> None:
    from airflow_rmqs.sensors import RabbitMQStreamLagSensor

    sensor = RabbitMQStreamLagSensor(
        task_id="lag", superstream=superstream, consumer_name=CONSUMER, max_lag=0
    )
    poke: Callable[[], Any] = lambda: sensor.poke({})  # noqa: E731
    poke()  # warm-up
    before, times = counter.calls, []
    mark = (requests_sent(), probes_made(), broker_cpu_s())
    for _ in range(checks):
        t = time.perf_counter()
        assert not poke().is_done
        times.append(time.perf_counter() - t)
    report("lag sensor check", times, counter.calls - before, _per_check(mark, checks))


class FullCollections:
    """CPython's generation-2 collections (the whole heap, loop stopped) and how long each took."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.polls: list[int] = []  # the poll each collection fell in (0: the first, every tail measured)
        self.poll = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._start)
            self.polls.append(self.poll)


class Ticker:
    """Wakes every `period` s on the loop and records how late each wake-up was (the loop's lag)."""

    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.lags: list[float] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period
            await asyncio.sleep(self.period)
            self.lags.append(max(0.0, loop.time() - due))


def watchers(
    superstreams: list[str],
    count: int,
    polls: int,
    interval: float,
    counter: ConnectCounter,
    freeze: bool = False,
) -> None:
    from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

    def aligned_delay(interval: float) -> float:  # the triggers' grid (also on a checkout without it)
        return interval - (time.monotonic() % interval)

    spans: list[tuple[float, float]] = []  # (start, end) of every check, monotonic

    class Timed(RabbitMQStreamNewDataTrigger):
        async def check(self) -> Any:
            start = time.monotonic()
            try:
                return await super().check()
            finally:
                spans.append((start, time.monotonic()))

    async def run() -> None:
        triggers = [
            Timed(
                superstream=superstreams[i % len(superstreams)],
                consumer_name=f"{CONSUMER}-{i}",
                poll_interval=interval,
            )
            for i in range(count)
        ]

        async def drain(t: Any) -> None:
            async for _event in t.run():
                pass

        if freeze:  # the set-up heap out of full collections: the most freezing can give (docs/operations.md)
            gc.collect()
            gc.freeze()
        ticker = Ticker()
        tick_task = asyncio.create_task(ticker.run())
        collections = FullCollections()
        gc.callbacks.append(collections)
        # The same loop idle for as long as the polls take: the lag the machine alone causes (the
        # OS deschedules this process when other work shares the cores).
        await asyncio.sleep(interval * (polls + 1))
        idle = sorted(ticker.lags) or [0.0]
        ticker.lags.clear()
        await asyncio.sleep(aligned_delay(interval))  # start together, as on a triggerer's grid
        collections.pauses.clear()
        connects = counter.calls
        tasks = [asyncio.create_task(drain(t)) for t in triggers]
        rounds: list[dict[str, float]] = []
        collections.polls.clear()
        for poll in range(polls + 1):
            collections.poll = poll
            tick = round(time.monotonic() / interval) * interval  # the grid point this poll started at
            mark_lag, mark_req, mark_probes = len(ticker.lags), requests_sent(), probes_made()
            cpu = broker_cpu_s()
            own = time.process_time()
            while sum(1 for s, _ in spans if s >= tick - interval / 2) < count:
                await asyncio.sleep(0.005)
            done_at = max(e for s, e in spans if s >= tick - interval / 2)
            after = broker_cpu_s()
            lags = ticker.lags[mark_lag:] or [0.0]
            rounds.append(
                {
                    "span": done_at - min(s for s, _ in spans if s >= tick - interval / 2),
                    "lag": max(lags),
                    "requests": requests_sent() - mark_req,
                    "probes": probes_made() - mark_probes,
                    "cpu": -1.0 if cpu is None or after is None else after - cpu,
                    "own": time.process_time() - own,
                }
            )
            await asyncio.sleep(aligned_delay(interval))
        gc.callbacks.remove(collections)
        for t in tasks:
            t.cancel()
        tick_task.cancel()
        await asyncio.gather(*tasks, tick_task, return_exceptions=True)
        first, steady = rounds[0], rounds[1:]
        print(
            f"{count} watchers, first poll (every tail measured): {first['span'] * 1000:.0f} ms, "
            f"{first['probes']:.0f} tail subscriptions, {first['requests']:.0f} requests, "
            f"loop lag max {first['lag'] * 1000:.0f} ms",
            flush=True,
        )
        spans_ms = [r["span"] * 1000 for r in steady]
        lag_ms = [r["lag"] * 1000 for r in steady]
        cpu_ms = [r["cpu"] * 1000 for r in steady if r["cpu"] >= 0]
        print(
            f"{count} watchers on {len(superstreams)} super stream(s): each poll "
            f"{statistics.median(spans_ms):.0f} ms in total (median of {len(steady)}, max "
            f"{max(spans_ms):.0f} ms), loop lag max {statistics.median(lag_ms):.0f} ms (median of the "
            f"polls' maxima, worst {max(lag_ms):.0f} ms), "
            f"{statistics.median([r['requests'] for r in steady]):.0f} requests/poll, "
            f"{statistics.median([r['probes'] for r in steady]):.0f} tail subscriptions/poll, "
            f"broker CPU {statistics.median(cpu_ms) if cpu_ms else -1:.0f} ms/poll, "
            f"this process's CPU {statistics.median([r['own'] for r in steady]) * 1000:.0f} ms/poll, "
            f"{counter.calls - connects} new connections (load {_load()})",
            flush=True,
        )
        full = collections.pauses or [0.0]
        first_gc = collections.polls.count(0)
        print(
            f"full (generation-2) garbage collections while the watchers ran: {len(collections.pauses)}, "
            f"longest {max(full) * 1000:.0f} ms (the loop stops for each); in the first poll {first_gc}, "
            f"in the {polls} steady polls {len(collections.polls) - first_gc}",
            flush=True,
        )
        print(
            f"the same loop idle for {interval * (polls + 1):.0f} s before: "
            f"lag max {idle[-1] * 1000:.0f} ms, "
            f"p99 {idle[int(len(idle) * 0.99)] * 1000:.0f} ms",
            flush=True,
        )

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=50)
    ap.add_argument("--checks", type=int, default=20)
    ap.add_argument("--changed", type=int, default=3, help="checks after new data in every partition")
    ap.add_argument("--watchers", type=int, default=0, help="N triggers on one loop instead of checks")
    ap.add_argument("--superstreams", type=int, default=10, help="super streams the watchers share")
    ap.add_argument("--polls", type=int, default=5)
    ap.add_argument("--poll-interval", type=float, default=2.0)
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() once the watchers' process is set up, before they start (docs/operations.md)",
    )
    args = ap.parse_args()
    conn = connection()
    airflow_connection(conn)
    counter = ConnectCounter()
    counter.install()
    names = setup(conn, args.partitions, min(args.superstreams, args.watchers) if args.watchers else 1)
    try:
        if args.watchers:
            watchers(names, args.watchers, args.polls, args.poll_interval, counter, args.gc_freeze)
        else:
            print(f"{args.partitions} partitions:", flush=True)
            trigger_checks(conn, names[0], args.checks, counter, args.changed)
            sensor_checks(names[0], args.checks, counter)
    finally:
        for name in names:
            BrokerClient(conn).delete_super_stream(name)


if __name__ == "__main__":
    main()
