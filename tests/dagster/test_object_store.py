"""A Spark-free stream asset writing to `s3://` with its credentials from an `ObjectStoreResource`.

The endpoint is moto's server on loopback (tests/support/s3.py); the first attempt fails after its
commit record, before the watermark store, and Dagster's retry only stores: every offset once, and
the credentials in no metadata, event or repr.
"""

from __future__ import annotations

from typing import Any

import pytest
from dagster import RetryPolicy, materialize

from dagster_rmqs import ObjectStoreResource, RabbitMQStreamsResource, build_stream_asset
from pyspark_rmqs.core.errors import BrokerUnavailableError
from pyspark_rmqs.runs import steps
from pyspark_rmqs.runs.outputs import committed
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.dagster, pytest.mark.broker]


def test_an_arrow_asset_into_s3_retried_after_its_commit_writes_every_offset_once(
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = streams.stream()
    publish(broker, name, [f"m{i}".encode() for i in range(500)])
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/orders"
    lake = ObjectStoreResource(
        aws_access_key_id=s3.key,
        aws_secret_access_key=s3.secret,
        endpoint_url=s3.endpoint,
        region_name=s3.region,
    )
    real_store = steps.store_watermarks_checked
    calls: list[int] = []

    def store_failing_once(*a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise BrokerUnavailableError("the watermark store failed (simulated)")
        return real_store(*a, **k)

    monkeypatch.setattr(steps, "store_watermarks_checked", store_failing_once)
    asset = build_stream_asset(
        "lake_orders",
        stream=name,
        consumer_name="dgs3",
        output_path=out,
        engine="arrow",
        output_storage_key="lake",
        retry_policy=RetryPolicy(max_retries=1),
    )
    result = materialize([asset], resources={"rabbitmq": rabbitmq, "lake": lake})
    assert result.success and len(calls) == 2
    dataset = committed.committed_dataset(out, storage_options=lake.fsspec_options())
    offsets = sorted(dataset.to_table(columns=["offset"]).column("offset").to_pylist())
    assert offsets == list(range(500))  # every offset once
    assert rabbitmq.stored_offsets("dgs3", stream=name) == {name: 499}
    (m,) = result.asset_materializations_for_node("lake_orders")
    metadata = {k: v.value for k, v in m.metadata.items()}
    assert metadata["sink_skipped"] is True and metadata["rmqs/delivery"] == "exactly_once"
    assert metadata["dagster/uri"] == out
    shown = " ".join(f"{k}={v!r}" for k, v in metadata.items()) + repr(lake) + str(lake)
    shown += "".join(repr(e) for e in result.all_events)
    assert s3.secret not in shown and s3.key not in shown


def test_output_storage_key_is_for_the_arrow_engine() -> None:
    from pyspark_rmqs.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="output_storage_key is for engine='arrow'"):
        build_stream_asset(
            "x", stream="s", consumer_name="c", output_path="s3://b/o", output_storage_key="lake"
        )
