"""`build_lag_check`: a blocking asset check on the consumer lag of a stream asset.

Metadata only (tails and the watermark), so it is cheap to run after every materialization; as a
blocking check it keeps downstream assets from materializing while the asset is too far behind.
A non-retryable error (a refused permission) fails the check's step for good, as in the assets:
a job's RetryPolicy would otherwise run it again and bury the error under "Exceeded max_retries".
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetsDefinition,
    AssetSpec,
    MetadataValue,
    asset_check,
)

from dagster_rmqs.failures import failures
from dagster_rmqs.targets import stream_target
from pyspark_rmqs.errors import ConfigurationError


def build_lag_check(
    asset: AssetsDefinition | AssetSpec,
    max_lag: int,
    *,
    name: str = "consumer_lag",
    blocking: bool = True,
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR,
    rabbitmq_key: str | None = None,
) -> AssetChecksDefinition:
    """Fails when the consumer lag of `asset` (from `build_stream_asset`) is above `max_lag`.

    The broker is the asset's resource key (`rabbitmq` unless the asset names another) or `rabbitmq_key`.
    """
    if max_lag < 0:
        raise ConfigurationError(f"max_lag must be >= 0; got {max_lag}")
    target = stream_target(asset)
    key = rabbitmq_key or target.rabbitmq_key
    consumer = target.require_consumer(asset.key.to_user_string())

    @asset_check(
        asset=asset.key,
        name=name,
        blocking=blocking,
        required_resource_keys={key},
        description=f"Consumer '{consumer}' lags at most {max_lag} message(s) on '{target.name}'",
    )
    def _lag_check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        with failures():
            w = getattr(context.resources, key).watermarks(consumer, **target.kw)
        passed = w.total_lag <= max_lag
        return AssetCheckResult(
            passed=passed,
            severity=severity,
            description=f"lag {w.total_lag} {'<=' if passed else '>'} max_lag {max_lag}",
            metadata={
                "total_lag": MetadataValue.int(w.total_lag),
                "max_lag": MetadataValue.int(max_lag),
                "lag": MetadataValue.json(w.lags()),
                "tails": MetadataValue.json(w.tails()),
            },
        )

    return _lag_check
