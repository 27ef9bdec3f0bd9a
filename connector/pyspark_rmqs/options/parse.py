"""The three entry points: Spark's string options to a frozen model, once, on the driver."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark_rmqs.options.connection import ConnectionOptions, connection_from
from pyspark_rmqs.options.fields import LONG_MAX, bounds, plain_type
from pyspark_rmqs.options.lookup import hiding_secrets, normalize
from pyspark_rmqs.options.sink import SinkOptions, sink_from
from pyspark_rmqs.options.source import SourceOptions, source_from

_CONNECTION = tuple(ConnectionOptions.option_fields())
_SOURCE_ONLY = tuple(SourceOptions.option_fields())
_SINK_ONLY = tuple(SinkOptions.option_fields())

KNOWN_SOURCE_OPTIONS: tuple[str, ...] = (*_CONNECTION, *_SOURCE_ONLY)
"""Every option a read accepts, as users type it."""
KNOWN_SINK_OPTIONS: tuple[str, ...] = (*_CONNECTION, *_SINK_ONLY)
"""Every option a write accepts, as users type it."""

INTEGER_BOUNDS: Mapping[str, tuple[int, int]] = {
    name: bounds(info)
    for model in (SourceOptions, SinkOptions)
    for name, info in model.option_fields().items()
    if plain_type(info) is int
}
"""Valid range of every integer option, inclusive (from the fields' `ge` / `le`)."""


def describe_range(option: str) -> str:
    """An integer option's valid range as docs/options.md writes it: `1 to 65,535`, or `≥ 0`."""
    lo, hi = INTEGER_BOUNDS[option]
    return f"≥ {lo}" if hi == LONG_MAX else f"{lo:,} to {hi:,}"


@hiding_secrets
def parse_connection_options(options: Mapping[str, str]) -> ConnectionOptions:
    """Connection options alone (Airflow, Dagster, CLI). Known source/sink options are ignored."""
    others = tuple(n for n in dict.fromkeys((*_SOURCE_ONLY, *_SINK_ONLY)) if n not in _CONNECTION)
    values = normalize(options, known=_CONNECTION, context="a connection", ignored=others)
    return connection_from(values)


@hiding_secrets
def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse and validate read options; `streaming` is True for `spark.readStream`."""
    values = normalize(
        options,
        known=KNOWN_SOURCE_OPTIONS,
        context="reading (a source)",
        elsewhere={n: "is a sink (write) option" for n in _SINK_ONLY if n not in KNOWN_SOURCE_OPTIONS},
    )
    return source_from(values, streaming=streaming)


@hiding_secrets
def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse and validate write options (batch and streaming alike)."""
    values = normalize(
        options,
        known=KNOWN_SINK_OPTIONS,
        context="writing (a sink)",
        elsewhere={n: "is a source (read) option" for n in _SOURCE_ONLY if n not in KNOWN_SINK_OPTIONS},
    )
    return sink_from(values)
