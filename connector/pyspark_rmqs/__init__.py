"""rmqs: RabbitMQ Streams and Super Streams for Apache Spark.

`spark.read.format("rabbitmq_streams")` works once this package is installed: PySpark imports
every top-level `pyspark_*` module and registers its `DefaultSource`. The Spark classes load
lazily, so orchestration code importing `pyspark_rmqs.runs.watermarks` never imports pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the one version source: pyproject.toml reads it (hatch), so do the other packages

if TYPE_CHECKING:
    from pyspark_rmqs.spark.source import RabbitMQStreamsDataSource

    DefaultSource = RabbitMQStreamsDataSource

__all__ = ["DefaultSource", "RabbitMQStreamsDataSource", "__version__", "lag_from_progress"]


def __getattr__(name: str) -> Any:
    if name in ("DefaultSource", "RabbitMQStreamsDataSource"):
        from pyspark_rmqs.core.versions import UnsupportedVersionError

        try:
            from pyspark_rmqs.spark.source import RabbitMQStreamsDataSource
        except UnsupportedVersionError as exc:
            if name != "DefaultSource":
                raise
            return _unsupported_source(str(exc))
        return RabbitMQStreamsDataSource
    if name == "lag_from_progress":
        from pyspark_rmqs.core.progress import lag_from_progress

        return lag_from_progress
    raise AttributeError(f"module 'pyspark_rmqs' has no attribute {name!r}")


def _unsupported_source(message: str) -> Any:
    """`rabbitmq_streams` on a PySpark older than rmqs supports: a data source that fails with
    `message` when used. PySpark imports every `pyspark_*` module's `DefaultSource` to register it,
    and an ImportError there would fail the lookup of the session's other Python data sources too."""
    from pyspark.sql.datasource import DataSource

    from pyspark_rmqs.core.versions import UnsupportedVersionError

    class UnsupportedRabbitMQStreamsDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rabbitmq_streams"

        def __init__(self, options: Any) -> None:
            raise UnsupportedVersionError(message)

    return UnsupportedRabbitMQStreamsDataSource
