"""Writes with `spark.speculation=true` on the cluster (shared/SPEC.md, "Speculative execution with
deduplication"): one partition is slow, so Spark runs a speculative copy of its task on the other
executor and both copies publish the same rows. Measured by counting what the stream holds.

What is promised, and checked: with or without `producerName` the job succeeds (speculative copies
under one producer name do not collide into a failure) and no row is lost. With `producerName`,
docs/spark.md says each row is kept once (a copy publishes the same ids under the same name; the
spec only guarantees dedup within one attempt): checked too. Without it, a copy's rows are kept
twice (at-least-once): counted, and required here, as proof that the copy published concurrently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import StreamFactory
from tests.spark_cluster.checks import duplicates, run_job
from tests.spark_cluster.standalone import StandaloneCluster
from tests.support.broker import BrokerSettings
from tests.support.connect_server import free_port
from tests.support.data import publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROWS, PARTITIONS = 4000, 4  # partition 0: 1,000 rows, 20 slices of 50, 0.5 s each: ~10 s


@pytest.mark.parametrize("producer", ["spec", None], ids=["producerName", "no-producerName"])
@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_speculative_writes_lose_nothing(
    free_cluster: StandaloneCluster,
    broker: BrokerSettings,
    streams: StreamFactory,
    tmp_path: Path,
    mode: str,
    producer: str | None,
) -> None:
    target = streams.stream("spw")
    cfg: dict[str, object] = {
        "master": free_cluster.url,
        "mode": mode,
        "producer": producer,
        "options": spark_options(broker, stream=target),
        "rows": ROWS,
        "partitions": PARTITIONS,
        "delay_s": 0.5,
        "ui_port": free_port(),
        "ckpt": str(tmp_path / "ckpt"),
    }
    if mode == "batch":
        expected = [f"v{i:06d}".encode() for i in range(ROWS)]
    else:
        source, parts = streams.super_stream(PARTITIONS, prefix="sps")
        expected = []
        for p in parts:
            bodies = [f"{p}:{i}".encode() for i in range(ROWS // PARTITIONS)]
            publish(broker, p, bodies)
            expected += bodies
        cfg["source"] = spark_options(broker, superstream=source, metadataFields="")
    result = run_job(["spec-write", json.dumps(cfg)])
    free_cluster.wait_no_applications()
    assert result["speculative"] >= 1, f"no speculative copy ran: {result}"
    dups = duplicates(broker, target, expected)  # fails on any lost row
    copies = result["copies"]
    print(f"speculation {mode} producerName={producer}: {dups} duplicate(s) of {len(expected)}; {copies}")
    if producer:
        assert dups == 0, f"{dups} rows kept twice with producerName under speculation"
    else:  # the setup's own check: the copy did publish while the first attempt ran (a copy that
        # publishes nothing before it is killed would make the producerName case prove nothing)
        assert dups > 0, f"the speculative copy published nothing: {result}"
