"""A stream's leader node killed (kill -9 of every process of the node) in the middle of a batch
write, a batch read and an AvailableNow drain, and a replica's node killed in the middle of a read.

Each test counts every offset: nothing lost; duplicates only where docs/failure-semantics.md says
(a write without `producerName` re-sends its unconfirmed frames to the new leader: those the old
leader had stored appear twice). The leader is on node 1, the first seed: the metadata connection
dies with it, so the client must find the new leader through the other seeds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings, read_range
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.options import ConnectionOptions
from tests.cluster.conftest import ClusterStreams
from tests.cluster.support import ClusterSettings, wait_for
from tests.e2e.faults.support import output_offsets, paced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LEADER = 1


def _publish(conn: ConnectionOptions, stream: str, bodies: list[bytes], batch: int = 5000) -> None:
    """`bodies` to `stream`, `batch` messages per send, every confirm awaited."""
    with StreamProducer(conn, stream, superstream=False, settings=WriteSettings()) as p:
        for i in range(0, len(bodies), batch):
            p.send(bodies[i : i + batch])
        p.flush()


class KillWhen(threading.Thread):
    """kill -9 node `node` of the cluster as soon as `ready()` is true; with `hang_s`, the node is
    first paused (SIGSTOP) that long: it stops confirming, so publishers wait on a full confirm
    window when it dies (a node that hangs, then crashes)."""

    def __init__(
        self, cluster: ClusterSettings, node: int, ready: Callable[[], object], hang_s: float = 0.0
    ) -> None:
        super().__init__(daemon=True, name=f"kill-node-{node}")
        self.cluster, self.node, self.ready, self.hang_s = cluster, node, ready, hang_s
        self.killed_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            wait_for(self.ready, 180, "the job to start", every_s=0.05)
            if self.hang_s:
                self.cluster.pause(self.node)
                time.sleep(self.hang_s)
            self.cluster.kill(self.node)
            self.killed_at = time.monotonic()
        except BaseException as e:  # reported by check()
            self.error = e

    def check(self, done_at: float) -> None:
        self.join(200)
        if self.error is not None:
            raise self.error
        assert self.killed_at is not None, "the node was not killed"
        assert done_at > self.killed_at, "the job ended before the node was killed"


def _new_leader(cluster: ClusterSettings, stream: str) -> int:
    """The node that leads `stream` once the cluster replaced the killed leader."""
    topo = wait_for(
        lambda: t if (t := cluster.topology(stream)).leader and cluster.index(t.leader) != LEADER else None,
        60,
        f"a new leader of '{stream}'",
    )
    return cluster.index(topo.leader)


@pytest.mark.parametrize("producer_name", ["cw", None], ids=["producerName", "no-producerName"])
def test_leader_killed_mid_batch_write(
    spark: SparkSession,
    local_cluster: ClusterSettings,
    cluster_streams: ClusterStreams,
    tmp_path: Path,
    producer_name: str | None,
) -> None:
    s = cluster_streams.stream("kw", leader=LEADER)
    n = 600_000
    df = spark.range(0, n, numPartitions=1).selectExpr("format_string('w%07d', id) as value")
    watch = BrokerClient(local_cluster.conn())

    def publishing() -> bool:  # the sink's publisher is at work: the stream holds a chunk
        return watch.stats(s).committed_chunk_id >= 0

    fault = KillWhen(local_cluster, LEADER, publishing, hang_s=2.0)
    fault.start()
    extra = {"producerName": producer_name} if producer_name else {}
    # The promise is every row once (or at least once) across the failover, not its speed: the
    # first test of a fresh cluster once saw the new leader take over after the default 10 s
    # enqueue timeout on a busy machine (the write failed, BrokerTimeoutError, nothing lost).
    extra["enqueueTimeoutMs"] = "60000"
    df.write.format("rabbitmq_streams").options(
        **local_cluster.options(stream=s, maxInFlight="2000", **extra)
    ).mode("append").save()
    fault.check(time.monotonic())
    assert _new_leader(local_cluster, s) != LEADER
    conn = local_cluster.conn()
    got = read_range(conn, s, 0, BrokerClient(conn).tail(s)).column("value").to_pylist()
    want = [f"w{i:07d}".encode() for i in range(n)]
    if producer_name:  # the new leader dropped what the old one had stored: every row once, in order
        assert got == want
        return
    # At least once: every row, in order of first appearance; repeats only of the frames in flight.
    assert list(dict.fromkeys(got)) == want, "a row is missing or out of order"
    repeats = len(got) - n
    assert repeats <= 2000, f"{repeats} repeats: more than one confirm window (maxInFlight=2000)"


def test_leader_killed_mid_batch_read(
    spark: SparkSession, local_cluster: ClusterSettings, cluster_streams: ClusterStreams, tmp_path: Path
) -> None:
    """The readers are on replicas; a replica restarts to follow the new leader and ends its
    subscriptions (a MetadataUpdate): each reader resubscribes at its next offset."""
    s = cluster_streams.stream("kr", leader=LEADER)
    # 120 MB: more than the sockets and Spark buffer between the readers and the paced consumer.
    n = 120_000
    bodies = [f"r{i:07d}".ljust(1000, ".").encode() for i in range(n)]
    _publish(local_cluster.conn(), s, bodies)
    df = (
        spark.read.format("rabbitmq_streams")
        .options(**local_cluster.options(stream=s, metadataFields="", minPartitions="2", queueCapacity="500"))
        .load()
        .select("offset", "value")
    )
    started = tmp_path / "started"
    slow = df.mapInArrow(paced(1000, 0.2, started), df.schema)  # ~12 s per split
    fault = KillWhen(local_cluster, LEADER, started.exists)
    fault.start()
    rows = [(r.offset, bytes(r.value)) for r in slow.collect()]
    fault.check(time.monotonic())
    offsets = Counter(o for o, _ in rows)
    assert not [o for o, k in offsets.items() if k > 1], "an offset read twice"
    assert sorted(offsets) == list(range(n)), f"{n - len(offsets)} offset(s) missing"
    assert all(bodies[o] == v for o, v in rows)


def test_leader_killed_mid_available_now_drain(
    spark: SparkSession, local_cluster: ClusterSettings, cluster_streams: ClusterStreams, tmp_path: Path
) -> None:
    """An AvailableNow drain into Parquet (jobs.run_drain) over several micro-batches; the leader of
    the stream (and of the metadata connection's node) dies after the first batch is in the files.
    The drain finishes: every offset once in the output, and the watermark at the tail."""
    from pyspark_rmqs.jobs import run_drain

    s = cluster_streams.stream("kd", leader=LEADER)
    n = 30_000
    _publish(local_cluster.conn(), s, [b"d%07d" % j for j in range(n)])
    out = tmp_path / "out"

    def first_batch_written() -> bool:
        return out.exists() and any(out.rglob("*.parquet"))

    fault = KillWhen(local_cluster, LEADER, first_batch_written)
    fault.start()
    summary = run_drain(
        spark,
        local_cluster.conn(),
        stream=s,
        consumer="kd",
        checkpoint=str(tmp_path / "checkpoint"),
        output_path=str(out),
        source_options={"maxRecordsPerTrigger": "3000"},
        timeout_s=400,
    )
    fault.check(time.monotonic())
    offsets = [o for _, o in output_offsets(out)]
    assert offsets == list(range(n)), f"{len(offsets)} rows, {len(set(offsets))} distinct offsets of {n}"
    assert BrokerClient(local_cluster.conn()).stored_offset("kd", s) == n - 1
    assert summary is not None


def test_replica_killed_mid_read(local_cluster: ClusterSettings, cluster_streams: ClusterStreams) -> None:
    """The node the reader subscribed on dies: the reader resubscribes, on another member, at its
    next offset; every offset once."""
    s = cluster_streams.stream("kv", leader=LEADER)
    conn = local_cluster.conn()
    n = 100_000
    _publish(conn, s, [b"%07d" % j + b"." * 300 for j in range(n)])
    reader = RangeReader(conn, s, 0, n, ReadSettings(queue_capacity=500, batch_rows=1000))
    got: list[int] = []
    victim = None
    for k, batch in enumerate(reader):
        got.extend(int(v[:7]) for v in batch.column("value").to_pylist())
        time.sleep(0.01)
        if k == 10:
            victim = local_cluster.index(reader.nodes[0])
            assert victim != LEADER, "the reader subscribed on the leader, not on a replica"
            local_cluster.kill(victim)
    assert victim is not None
    assert got == list(range(n))
    assert len(reader.nodes) >= 2 and local_cluster.index(reader.nodes[-1]) != victim, reader.nodes


def test_leader_killed_between_an_airflow_runs_sink_and_its_store(
    local_cluster: ClusterSettings,
    cluster_streams: ClusterStreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Airflow watermark run (`RabbitMQStreamConsumeOperator`, its Airflow connection naming the
    three nodes) whose sink has taken every message when the stream's leader dies: the node is killed
    from inside the sink, after its last batch, so the run's record (`delivered`) and its watermark
    store meet a dead leader. The run either finishes or fails naming the stream; a failed try is
    retried as Airflow would. Every offset reaches the sink once, and the watermark ends at the tail."""
    conn_id = _airflow_cluster_connection(local_cluster, tmp_path / "airflow", monkeypatch)
    from airflow_rmqs.plain_operators import RabbitMQStreamConsumeOperator

    s = cluster_streams.stream("ks", leader=LEADER)
    n = 6_000
    _publish(local_cluster.conn(), s, [b"k%07d" % j for j in range(n)], batch=2000)
    seen: list[int] = []
    killed: list[float] = []

    def sink(batch: pa.RecordBatch) -> None:
        seen.extend(batch.column("offset").to_pylist())
        if len(seen) >= n and not killed:  # the sink is done: kill the leader before the store
            local_cluster.kill(LEADER)
            killed.append(time.monotonic())

    def run() -> dict[str, object]:
        op = RabbitMQStreamConsumeOperator(
            task_id="ks",
            stream=s,
            consumer_name="ks",
            apply_function=sink,
            metadata_fields="",
            rabbitmq_stream_conn_id=conn_id,
        )
        return dict(op.execute({}))

    tries = 0
    while True:
        tries += 1
        try:
            run()
            break
        except Exception as e:  # a failed try must say which stream, then Airflow retries it
            print(f"try {tries} failed: {e!r}")
            assert s in str(e), f"try {tries} failed without naming '{s}': {e!r}"
            assert tries < 3, f"still failing after {tries} tries: {e!r}"
    print(f"{tries} tries; the leader was killed after the sink took all {n} messages")
    assert killed, "the leader was never killed: the sink never took every message"
    counts = Counter(seen)
    assert sorted(counts) == list(range(n)), f"{len(counts)} distinct offsets of {n}"
    assert max(counts.values()) == 1, (
        f"offsets delivered twice: {[o for o, c in counts.items() if c > 1][:10]}"
    )
    assert BrokerClient(local_cluster.conn(seeds=[2, 3])).stored_offset("ks", s) == n - 1


def _airflow_cluster_connection(cluster: ClusterSettings, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection (from the environment) naming every node of `cluster`; its id."""
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    hosts = ",".join(f"{h}:{p}" for h, p in cluster.nodes)
    monkeypatch.setenv(
        "AIRFLOW_CONN_RMQS_CLUSTER",
        f'{{"conn_type": "rabbitmq_stream", "host": "{hosts}", "login": "{cluster.username}", '
        f'"password": "{cluster.password}"}}',
    )
    return "rmqs_cluster"


def test_leader_killed_while_a_deferred_new_data_sensor_waits(
    local_cluster: ClusterSettings,
    cluster_streams: ClusterStreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deferred new-data sensor's trigger (as the triggerer runs it) polls an empty stream whose
    leader, on the first seed, dies: it keeps waiting, neither failing nor firing, and fires on the
    five messages published to the new leader afterwards, with the exact tail and lag."""
    import asyncio

    conn_id = _airflow_cluster_connection(local_cluster, tmp_path / "airflow", monkeypatch)
    from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

    s = cluster_streams.stream("kt", leader=LEADER)
    trigger = RabbitMQStreamNewDataTrigger(
        stream=s, consumer_name="kt", poll_interval=0.2, rabbitmq_stream_conn_id=conn_id
    )

    def publish_to_the_others() -> None:
        _publish(local_cluster.conn(seeds=[2, 3]), s, [b"t%d" % i for i in range(5)])

    async def first_event() -> dict[str, object]:
        gen = trigger.run()
        try:
            event = await anext(gen)
        finally:
            await gen.aclose()
        return dict(event.payload)

    async def scenario() -> dict[str, object]:
        task = asyncio.ensure_future(asyncio.wait_for(first_event(), 240))
        await asyncio.sleep(1)
        assert not task.done()  # an empty stream: nothing to fire on
        await asyncio.to_thread(local_cluster.kill, LEADER)
        await asyncio.sleep(3)
        assert not task.done(), task.exception() if task.done() else None  # waiting, not failed
        await asyncio.to_thread(publish_to_the_others)
        return await task

    payload = asyncio.run(scenario())
    assert payload["status"] == "success"
    assert payload["partitions"] == {s: {"tail": 5, "watermark": None, "first": 0, "lag": 5}}
