"""Asset URIs `rabbitmq-stream://host:port/vhost/stream` (the vhost URL-encoded: `/` is `%2F`).

The sanitizer makes equal streams compare equal (lower-case host, explicit port) and rejects URIs
that do not name a virtual host and a stream; the factory builds one from its parts.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

from airflow.sdk import Asset

from pyspark_rmqs.options import DEFAULT_PORT

SCHEME = "rabbitmq-stream"
_SHAPE = "rabbitmq-stream://host:port/vhost/stream (vhost URL-encoded, '/' as %2F)"


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Normalize `uri`: host lower-cased, port 5552 made explicit, path exactly `/vhost/stream`."""
    if not uri.hostname:
        raise ValueError(f"a {SCHEME} asset URI needs a host: {_SHAPE}")
    parts = uri.path.split("/")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise ValueError(f"a {SCHEME} asset URI names a vhost and a stream: {_SHAPE}; got path {uri.path!r}")
    host = uri.hostname if ":" not in uri.hostname else f"[{uri.hostname}]"
    vhost = quote(unquote(parts[1]), safe="")
    return uri._replace(netloc=f"{host}:{uri.port or DEFAULT_PORT}", path=f"/{vhost}/{parts[2]}")


def asset_uri(*, host: str, stream: str, port: int = DEFAULT_PORT, vhost: str = "/") -> str:
    """The asset URI of a stream (or super stream) on a broker."""
    return f"{SCHEME}://{host.lower()}:{port}/{quote(vhost, safe='')}/{quote(stream, safe='')}"


def create_asset(
    *, host: str, stream: str, port: int = DEFAULT_PORT, vhost: str = "/", extra: dict[str, Any] | None = None
) -> Asset:
    """An Asset for a stream or super stream (Airflow's `asset-uris` factory)."""
    return Asset(uri=asset_uri(host=host, stream=stream, port=port, vhost=vhost), extra=extra)


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """The OpenLineage dataset of a `rabbitmq-stream` asset (the provider's `to_openlineage_converter`).

    namespace `rabbitmq-stream://host:port`, name `vhost/stream`: together the asset URI again.
    """
    from openlineage.client.event_v2 import Dataset

    u = urlsplit(asset.uri)
    return Dataset(namespace=f"{u.scheme}://{u.netloc}", name=u.path.lstrip("/"))
