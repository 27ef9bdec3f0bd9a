"""The credentials of an operator's output, from an Airflow connection (`output_conn_id`).

An object store's credentials belong in Airflow's connections (or its secrets backend), not in a
DAG file, so the Spark-free consume operator takes the connection id of its output, as Airflow's
Amazon operators take `aws_conn_id`. The connection is read the way Airflow's `aws` connection
type is filled in, without depending on the Amazon provider:

- Login / Password: the access key id and secret access key;
- extra `endpoint_url` (or `service_config.s3.endpoint_url`, as the Amazon provider nests it),
  `region_name`, `aws_session_token`: an S3-compatible endpoint (MinIO, Ceph, R2...), its region;
- extra `storage_options`: any further fsspec options, merged last (for other stores too: a
  connection of any type with only `storage_options` works for `gs://` or `abfs://`).

Parquet output gets fsspec storage options (`rmqs[s3]` brings s3fs); an Iceberg output gets the
same credentials as pyiceberg's FileIO properties (`s3.access-key-id`, ...), merged into its
catalog properties. Every secret found is registered with Airflow's log masker and kept out of
messages (`secrets`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.runs.outputs.objectstore import iceberg_s3_properties, s3_storage_options, storage_secrets


def _extra(conn: Any) -> dict[str, Any]:
    extra = conn.extra_dejson if conn.extra else {}
    return dict(extra) if isinstance(extra, Mapping) else {}


def storage_options(conn: Any) -> dict[str, Any]:
    """fsspec storage options (s3fs's names) from an Airflow connection (see the module docstring)."""
    extra = _extra(conn)
    more = extra.get("storage_options") or {}
    if isinstance(more, str):
        try:
            more = json.loads(more)
        except ValueError:
            more = None
    if not isinstance(more, Mapping):
        raise ConfigurationError(
            f"connection '{conn.conn_id}': extra 'storage_options' must be a JSON object"
        )
    endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get(
        "endpoint_url"
    )
    return s3_storage_options(
        key=conn.login,
        secret=conn.password,
        token=extra.get("aws_session_token"),
        endpoint_url=endpoint,
        region_name=extra.get("region_name"),
        extra=more,
    )


iceberg_properties = iceberg_s3_properties


def secrets(options: Mapping[str, Any]) -> list[str]:
    """The credential values of `options`, registered with Airflow's log masker on the way."""
    from airflow.sdk.log import mask_secret

    found = storage_secrets(options)
    for secret in found:
        mask_secret(secret)
    return found


def from_connection(conn_id: str) -> dict[str, Any]:
    """`storage_options` of the Airflow connection `conn_id`; its secrets masked in the task's log."""
    from airflow.sdk import BaseHook

    options = storage_options(BaseHook.get_connection(conn_id))
    secrets(options)
    return options
