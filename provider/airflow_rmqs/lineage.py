"""OpenLineage for the operators: streams and output paths as datasets, offset ranges as a run facet.

A stream (or super stream) is the dataset `namespace = rabbitmq-stream://<host>:<port>`,
`name = <vhost>/<stream>` (vhost URL-encoded): `namespace + "/" + name` is its Airflow asset URI
(`airflow_rmqs.assets.asset_uri`). Output paths follow OpenLineage's naming: `file` + absolute path
for local paths, `<scheme>://<authority>` + path for URIs.

Only imported from `get_openlineage_facets_on_complete`, i.e. when the optional
apache-airflow-providers-openlineage (the `rmqs[openlineage]` extra) is installed and enabled.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import Dataset
from openlineage.client.facet_v2 import RunFacet

from airflow_rmqs.assets import SCHEME, asset_uri
from pyspark_rmqs.options import DEFAULT_PORT, ConnectionOptions

FACET_NAME = "rabbitmqStream"


@attr.define
class RabbitMQStreamRunFacet(RunFacet):
    """What one run read or wrote: `ranges` = {partition stream: [start, end)}, row counts."""

    target: str
    operation: str
    ranges: dict[str, list[int]] = attr.field(factory=dict)
    rows: int | None = None
    rowsPerStream: dict[str, int] = attr.field(factory=dict)
    watermarkStored: bool | None = None
    # No schema of its own: `_schemaURL` stays OpenLineage's RunFacet schema (rmqs publishes no
    # JSON schema, and names no URL that does not exist); the fields are in docs/airflow.md#lineage.


def stream_dataset(conn: ConnectionOptions, stream: str) -> Dataset:
    """The dataset of a stream on the connection's (first) broker address."""
    addresses = conn.addresses()
    host, port = addresses[0] if addresses else ("localhost", DEFAULT_PORT)
    uri = asset_uri(host=host, port=port, vhost=conn.vhost, stream=stream)
    namespace, _, name = uri[len(SCHEME) + 3 :].partition("/")
    return Dataset(namespace=f"{SCHEME}://{namespace}", name=name)


def path_dataset(path: str) -> Dataset:
    """An output or input path as an OpenLineage dataset."""
    if "://" not in path:
        return Dataset(namespace="file", name=os.path.abspath(path))
    u = urlsplit(path)
    return Dataset(namespace=f"{u.scheme}://{u.netloc}", name=u.path or "/")


def run_facet(operation: str, summary: Mapping[str, Any]) -> RabbitMQStreamRunFacet:
    start = summary.get("start_offsets") or {}
    end = summary.get("end_offsets") or {}
    ranges = {s: [int(start[s]), int(end.get(s, start[s]))] for s in start}
    return RabbitMQStreamRunFacet(
        target=str(summary.get("target", "")),
        operation=operation,
        ranges=ranges,
        rows=summary.get("rows"),
        rowsPerStream=dict(summary.get("rows_per_stream") or summary.get("messages") or {}),
        watermarkStored=summary.get("watermark_stored"),
    )


def operator_lineage(
    inputs: list[Dataset], outputs: list[Dataset], operation: str, summary: Mapping[str, Any] | None
) -> OperatorLineage:
    facets: dict[str, Any] = {}
    if summary is not None:
        facets[FACET_NAME] = run_facet(operation, summary)
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=facets)
