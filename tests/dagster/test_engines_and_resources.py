"""The Spark-free engine, configurable resource keys, any Spark resource, standard metadata, passthrough."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import (
    AutomationCondition,
    Definitions,
    ExecuteInProcessResult,
    FreshnessPolicy,
    build_sensor_context,
    materialize,
)
from pyspark.sql import SparkSession

from dagster_rmqs import (
    RabbitMQStreamsResource,
    build_lag_check,
    build_new_data_sensor,
    build_stream_asset,
)
from pyspark_rmqs.core.errors import ConfigurationError
from tests.conftest import StreamFactory
from tests.dagster.conftest import resource_of
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster
ROOT = Path(__file__).resolve().parents[2]


def meta(result: ExecuteInProcessResult, name: str) -> dict[str, Any]:
    (m,) = result.asset_materializations_for_node(name)
    return {k: v.value for k, v in m.metadata.items()}


ARROW_RUN = textwrap.dedent(
    """
    import json, sys
    from dagster import materialize
    from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset

    endpoints, user, password, stream, out = sys.argv[1:6]
    asset = build_stream_asset("arrowed", stream=stream, consumer_name="dga", output_path=out, engine="arrow")
    rabbitmq = RabbitMQStreamsResource(endpoints=endpoints, username=user, password=password)
    result = materialize([asset], resources={"rabbitmq": rabbitmq})
    (m,) = result.asset_materializations_for_node("arrowed")
    skip = ("dagster/column_schema", "offset_ranges")
    meta = {k: v.value for k, v in m.metadata.items() if k not in skip}
    loaded = sorted(n for n in sys.modules if n.split(".")[0] == "pyspark")
    print(json.dumps({"pyspark": loaded, "meta": meta}))
    """
)


def test_engine_arrow_materializes_without_importing_pyspark(
    broker: BrokerSettings, streams: StreamFactory, rabbitmq: RabbitMQStreamsResource, tmp_path: Path
) -> None:
    s = streams.stream()
    bodies = [f"n{i}".encode() for i in range(120)]
    publish(broker, s, bodies[:70])
    publish(broker, s, bodies[70:])
    out = tmp_path / "arrow"
    args = [f"{broker.host}:{broker.port}", broker.username, broker.password, s, str(out)]
    done = subprocess.run(
        [sys.executable, "-c", ARROW_RUN, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["pyspark"] == []  # the whole run, imports included, loaded no pyspark
    m = report["meta"]
    assert (m["dagster/row_count"], m["start_offsets"], m["end_offsets"]) == (120, {s: 0}, {s: 120})
    assert m["engine"] == "arrow" and m["watermark_stored"] is True and m["lag_after"] == 0
    (file,) = m["files"]
    assert m["dagster/uri"] == str(out) and file.startswith(f"{out}/{s}-0-120-") and file.endswith(".parquet")
    table = pq.read_table(out)
    assert sorted(table.column("value").to_pylist()) == sorted(bodies)
    assert rabbitmq.stored_offsets("dga", stream=s) == {s: 119}  # the same watermark protocol


def test_two_brokers_coexist_under_their_own_resource_keys(
    spark: SparkSession, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    s1, s2 = streams.stream(), streams.stream()
    publish(broker, s1, [b"one"] * 10)
    publish(broker, s2, [b"two"] * 4)
    east, west = resource_of(broker), resource_of(broker)  # two resources (one broker here)
    a = build_stream_asset(
        "east",
        stream=s1,
        consumer_name="dge",
        output_path=str(tmp_path / "e"),
        rabbitmq_key="rabbitmq_east",
        spark_key="lake",
    )
    b = build_stream_asset(
        "west",
        stream=s2,
        consumer_name="dgw2",
        output_path=str(tmp_path / "w"),
        rabbitmq_key="rabbitmq_west",
        engine="arrow",
    )
    assert a.required_resource_keys - {"io_manager"} == {"rabbitmq_east", "lake"}
    assert b.required_resource_keys - {"io_manager"} == {"rabbitmq_west"}
    checks = [build_lag_check(a, max_lag=0), build_lag_check(b, max_lag=0)]
    sensors = [build_new_data_sensor(a), build_new_data_sensor(b)]
    resources = {"rabbitmq_east": east, "rabbitmq_west": west, "lake": spark}
    Definitions.validate_loadable(
        Definitions(assets=[a, b], asset_checks=checks, sensors=sensors, resources=resources)
    )
    ticks = [sx(build_sensor_context(resources=resources)) for sx in sensors]
    assert [len(t.run_requests or []) for t in ticks] == [1, 1]  # type: ignore[union-attr]
    result = materialize([a, b, *checks], resources=resources)
    assert (meta(result, "east")["dagster/row_count"], meta(result, "west")["dagster/row_count"]) == (10, 4)
    assert all(e.passed for e in result.get_asset_check_evaluations())
    assert east.stored_offsets("dge", stream=s1) == {s1: 9} and west.stored_offsets("dgw2", stream=s2) == {
        s2: 3
    }


class PySparkLikeResource:
    """What dagster_pyspark.PySparkResource exposes: a `spark_session` property (no get_session)."""

    def __init__(self, session: SparkSession) -> None:
        self._session = session

    @property
    def spark_session(self) -> SparkSession:
        return self._session


def test_any_spark_resource_exposing_a_session_works_and_metadata_uses_standard_keys(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    publish(broker, s, [b"p"] * 12)
    out = tmp_path / "o"
    asset = build_stream_asset(
        "std", stream=s, consumer_name="dgm", output_path=str(out), metadata_fields="routing_key"
    )
    m = meta(
        materialize([asset], resources={"rabbitmq": rabbitmq, "spark": PySparkLikeResource(spark)}), "std"
    )
    assert m["dagster/row_count"] == 12 and m["dagster/uri"] == str(out)
    assert [c.name for c in m["dagster/column_schema"].columns] == [
        "value",
        "stream",
        "offset",
        "chunk_timestamp",
        "routing_key",
    ]
    assert [r.data for r in m["offset_ranges"].records] == [
        {"stream": s, "start": 0, "end": 12, "offsets": 12}
    ]
    assert m["lag_after"] == 0 and m["engine"] == "spark"
    with pytest.raises(ConfigurationError, match="spark_session"):
        from dagster_rmqs.resources import session_of

        session_of(object())


def test_dagster_attributes_pass_through_every_factory() -> None:
    from datetime import timedelta

    from dagster import TimeWindowPartitionsDefinition

    from dagster_rmqs import offset_range_partitions

    cond = AutomationCondition.eager()
    fresh = FreshnessPolicy.time_window(fail_window=timedelta(hours=2))
    common: dict[str, Any] = {
        "automation_condition": cond,
        "code_version": "v7",
        "freshness_policy": fresh,
        "kinds": {"rabbitmq", "delta"},
        "owners": ["team:data"],
        "tags": {"domain": "orders"},
        "output_path": "/tmp/x",
        "consumer_name": "pt",
        "stream": "s",
    }
    hourly = TimeWindowPartitionsDefinition(
        cron_schedule="0 * * * *", fmt="%Y-%m-%d-%H", start="2026-01-01-00"
    )
    assets = [
        build_stream_asset("w", **common),
        build_stream_asset("a", **common, engine="arrow"),
        build_stream_asset("d", **common, mode="available_now", checkpoint_location="/tmp/c"),
        build_stream_asset("r", **common, partitions_def=offset_range_partitions("pt_ranges")),
        build_stream_asset("t", **common, partitions_def=hourly),
    ]
    for a in assets:
        (spec,) = a.specs
        assert spec.automation_condition == cond and spec.code_version == "v7"
        assert spec.freshness_policy == fresh and spec.kinds == {"rabbitmq", "delta"}
        assert spec.owners == ["team:data"] and spec.tags["domain"] == "orders"
        assert a.op.pool == "rmqs-pt"
    assert build_stream_asset("k", stream="s", consumer_name="c", output_path="/x", engine="arrow").specs
    with pytest.raises(ConfigurationError, match="engine"):
        build_stream_asset("k", stream="s", consumer_name="c", output_path="/x", engine="duckdb")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Parquet"):
        build_stream_asset(
            "k", stream="s", consumer_name="c", output_path="/x", engine="arrow", output_format="csv"
        )


def test_an_asset_needs_the_spark_resource_exactly_when_its_engine_reads_with_spark(tmp_path: Path) -> None:
    """Every mode takes the Spark resource key from its engine: `spark_key` with Spark, none with Arrow."""
    from dagster import DailyPartitionsDefinition

    from dagster_rmqs import offset_range_partitions

    def keys(name: str, **kw: Any) -> set[str]:
        a = build_stream_asset(name, stream="s", consumer_name="c", output_path=str(tmp_path), **kw)
        return set(a.required_resource_keys) - {"io_manager"}

    ranges, days = offset_range_partitions("rmqs_ranges"), DailyPartitionsDefinition("2025-01-01")
    drain = {"mode": "available_now", "checkpoint_location": str(tmp_path / "cp")}
    for engine, expected in (("spark", {"rabbitmq", "lake"}), ("arrow", {"rabbitmq"})):
        assert keys(f"w_{engine}", engine=engine, spark_key="lake") == expected
        assert keys(f"r_{engine}", engine=engine, spark_key="lake", partitions_def=ranges) == expected
        assert keys(f"t_{engine}", engine=engine, spark_key="lake", partitions_def=days) == expected
    assert keys("d", spark_key="lake", **drain) == {"rabbitmq", "lake"}
