"""Option models, each option declared once, and the one place Spark's string options are parsed.

DESIGN §3, §5, §9. Spark hands a data source a case-insensitive dict of strings.
`parse_source_options`, `parse_sink_options` and `parse_connection_options` turn it into frozen
pydantic models, once, on the driver, and fail fast with a `ConfigurationError` that names the
option (in the camelCase spelling users type) and the values that would be valid. Secrets
(`password`, `tls.truststorePassword`, `tls.keystorePassword`, the password inside a `uris` entry)
are kept in `SecretStr` and never appear in an error message or a repr.

Each option is one field of one table (`ConnectionOptions`, `SourceOptions`, `SinkOptions`): its
alias is the Spark option name, with its type, default, bounds and doc line (`fields.option`).
Parsing reads every option through its field, the models' validators hold the cross-option rules,
the broker layer's settings take their defaults from the fields, code that writes options uses
`Model.alias(field)`, and docs/options.md's tables are rendered from the fields (`reference`).

  fields.py      how an option is declared and read from a string (`option`, `Reader`, `build`)
  lookup.py      case-insensitive keys, "did you mean", removed options, secrets kept out of errors
  connection.py  source.py  sink.py   the three tables, their rules and parsing
  parse.py       the entry points and the derived name lists
  reference.py   docs/options.md's tables

This package must not import pyspark: Airflow, Dagster and the CLI use it without a JVM.
"""

from __future__ import annotations

from pyspark_rmqs.core.schema import METADATA_FIELDS, PROPERTY_NAMES
from pyspark_rmqs.options.connection import (
    CONNECTION_OPTIONS,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    URI_SCHEMES,
    ConnectionOptions,
)
from pyspark_rmqs.options.lookup import REMOVED_OPTIONS
from pyspark_rmqs.options.parse import (
    INTEGER_BOUNDS,
    KNOWN_SINK_OPTIONS,
    KNOWN_SOURCE_OPTIONS,
    describe_range,
    parse_connection_options,
    parse_sink_options,
    parse_source_options,
)
from pyspark_rmqs.options.sink import (
    COMPRESSION_VALUES,
    ROUTING_STRATEGY_VALUES,
    CompressionKind,
    RoutingStrategyKind,
    SinkOptions,
)
from pyspark_rmqs.options.source import (
    ENDING_OFFSETS_VALUES,
    STARTING_OFFSETS_VALUES,
    EndingOffsetsKind,
    SourceOptions,
    StartingOffsetsKind,
)

PROPERTIES_FIELDS: tuple[str, ...] = PROPERTY_NAMES
"""Fields of the AMQP 1.0 `properties` struct (SPEC "AMQP properties struct")."""

__all__ = [
    "COMPRESSION_VALUES",
    "CONNECTION_OPTIONS",
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "ENDING_OFFSETS_VALUES",
    "INTEGER_BOUNDS",
    "KNOWN_SINK_OPTIONS",
    "KNOWN_SOURCE_OPTIONS",
    "METADATA_FIELDS",
    "PROPERTIES_FIELDS",
    "REMOVED_OPTIONS",
    "ROUTING_STRATEGY_VALUES",
    "STARTING_OFFSETS_VALUES",
    "URI_SCHEMES",
    "CompressionKind",
    "ConnectionOptions",
    "EndingOffsetsKind",
    "RoutingStrategyKind",
    "SinkOptions",
    "SourceOptions",
    "StartingOffsetsKind",
    "describe_range",
    "parse_connection_options",
    "parse_sink_options",
    "parse_source_options",
]
