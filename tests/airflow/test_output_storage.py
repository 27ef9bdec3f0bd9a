"""The consume operator's output credentials from an Airflow connection (`output_conn_id`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_rmqs.storage import iceberg_properties, storage_options
from pyspark_rmqs.core.errors import ConfigurationError

pytestmark = [pytest.mark.airflow]


def conn(login: str | None = None, password: str | None = None, extra: str | None = None) -> Any:
    import json

    dejson = json.loads(extra) if extra else {}
    return SimpleNamespace(conn_id="lake", login=login, password=password, extra=extra, extra_dejson=dejson)


def test_an_aws_style_connection_becomes_s3fs_storage_options() -> None:
    c = conn("AKID", "s3cr3t", '{"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}')
    assert storage_options(c) == {
        "key": "AKID",
        "secret": "s3cr3t",
        "endpoint_url": "http://minio:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert iceberg_properties(storage_options(c)) == {
        "s3.access-key-id": "AKID",
        "s3.secret-access-key": "s3cr3t",
        "s3.endpoint": "http://minio:9000",
        "s3.region": "eu-west-1",
    }


def test_the_amazon_providers_nested_endpoint_and_extra_storage_options() -> None:
    c = conn(
        extra='{"service_config": {"s3": {"endpoint_url": "http://ceph"}}, "storage_options": {"anon": true}}'
    )
    assert storage_options(c) == {"endpoint_url": "http://ceph", "anon": True}
    with pytest.raises(ConfigurationError, match="storage_options"):
        storage_options(conn(extra='{"storage_options": "not json"}'))
