"""What a stream asset reads, written into the asset's definition metadata (`rmqs/...`).

Sensors, checks and observation sensors built from an asset or spec read its target and resource
key back from there, so they need nothing else and always agree with the asset.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetsDefinition, AssetSpec

from pyspark_rmqs.core.target import Target, TargetKw
from pyspark_rmqs.errors import ConfigurationError

META_STREAM = "rmqs/stream"
META_SUPERSTREAM = "rmqs/superstream"
META_CONSUMER = "rmqs/consumer_name"
META_MODE = "rmqs/mode"
META_RESOURCE_KEY = "rmqs/resource_key"
DEFAULT_RABBITMQ_KEY = "rabbitmq"
DEFAULT_SPARK_KEY = "spark"


@dataclass(frozen=True)
class StreamTarget:
    """What a stream asset or spec reads: a stream or a super stream, and the watermark's consumer.

    `stream` / `superstream` are the pair users type; `target` is the core `Target` they name, made
    (with its "exactly one of" check) when the StreamTarget is.
    """

    stream: str | None
    superstream: str | None
    consumer_name: str | None
    rabbitmq_key: str = DEFAULT_RABBITMQ_KEY
    target: Target = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target.of(self.stream, self.superstream))

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def kw(self) -> TargetKw:
        """The keyword form for public calls (`Target.kw`)."""
        return self.target.kw()

    def require_consumer(self, asset_key: str) -> str:
        if not self.consumer_name:
            raise ConfigurationError(f"asset '{asset_key}' names no consumer_name")
        return self.consumer_name

    def metadata(self) -> dict[str, str]:
        meta = {META_SUPERSTREAM if self.target.is_super else META_STREAM: self.name}
        if self.consumer_name:
            meta[META_CONSUMER] = self.consumer_name
        meta[META_RESOURCE_KEY] = self.rabbitmq_key
        return meta


def make_target(
    stream: str | None,
    superstream: str | None,
    consumer_name: str | None,
    rabbitmq_key: str = DEFAULT_RABBITMQ_KEY,
) -> StreamTarget:
    target = StreamTarget(stream, superstream, consumer_name, rabbitmq_key)
    if not rabbitmq_key.isidentifier():
        raise ConfigurationError(f"rabbitmq_key must be a Python identifier; got {rabbitmq_key!r}")
    return target


def stream_target(asset_or_spec: AssetsDefinition | AssetSpec) -> StreamTarget:
    """The target of an asset built by `build_stream_asset` or a spec from `stream_asset_spec`."""
    if isinstance(asset_or_spec, AssetSpec):
        meta: Mapping[str, Any] = asset_or_spec.metadata
    else:
        meta = asset_or_spec.metadata_by_key.get(asset_or_spec.key, {})

    def text(key: str) -> str | None:
        v = meta.get(key)
        v = getattr(v, "value", v)
        return None if v is None else str(v)

    if text(META_STREAM) is None and text(META_SUPERSTREAM) is None:
        raise ConfigurationError(
            f"asset '{asset_or_spec.key.to_user_string()}' names no stream: build it with "
            "build_stream_asset or stream_asset_spec"
        )
    return StreamTarget(
        text(META_STREAM),
        text(META_SUPERSTREAM),
        text(META_CONSUMER),
        text(META_RESOURCE_KEY) or DEFAULT_RABBITMQ_KEY,
    )


def stream_asset_spec(
    key: str | Sequence[str],
    *,
    stream: str | None = None,
    superstream: str | None = None,
    consumer_name: str | None = None,
    group_name: str | None = None,
    description: str | None = None,
    rabbitmq_key: str = DEFAULT_RABBITMQ_KEY,
) -> AssetSpec:
    """The external stream as an asset (observed by `build_observation_sensor`, a dep of readers)."""
    target = make_target(stream, superstream, consumer_name, rabbitmq_key)
    return AssetSpec(
        key,
        metadata=target.metadata(),
        group_name=group_name,
        description=description or f"RabbitMQ {target.target.describe()}",
        kinds={"rabbitmq"},
    )
