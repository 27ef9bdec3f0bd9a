"""Option models and the one place where Spark's string options are parsed (DESIGN §3, §5, §9).

Spark hands a data source a case-insensitive dict of strings. `parse_source_options`,
`parse_sink_options` and `parse_connection_options` turn it into frozen pydantic models, once, on
the driver, and fail fast with a `ConfigurationError` that names the option (in the camelCase
spelling users type) and the values that would be valid. Secrets (`password`,
`tls.truststorePassword`, `tls.keystorePassword`, the password inside a `uris` entry) are kept in
`SecretStr` and never appear in an error message or a repr.

This module must not import pyspark: Airflow, Dagster and the CLI use it without a JVM.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Concatenate, Literal, NamedTuple, ParamSpec, TypeVar
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.redact import redact_option, redact_uri, redacted_errors, secrets_in
from pyspark_rmqs.schema import METADATA_FIELDS, PROPERTY_NAMES

__all__ = [
    "CONNECTION_OPTIONS",
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "INTEGER_BOUNDS",
    "JSON_OFFSET_EARLIEST",
    "JSON_OFFSET_LATEST",
    "KNOWN_SINK_OPTIONS",
    "KNOWN_SOURCE_OPTIONS",
    "METADATA_FIELDS",
    "PROPERTIES_FIELDS",
    "REMOVED_OPTIONS",
    "ConnectionOptions",
    "SinkOptions",
    "SourceOptions",
    "parse_connection_options",
    "parse_sink_options",
    "parse_source_options",
]

# One definition of the columns, in schema.py; re-exported here for option validation.
PROPERTIES_FIELDS: tuple[str, ...] = PROPERTY_NAMES
"""Fields of the AMQP 1.0 `properties` struct (SPEC "AMQP properties struct")."""

DEFAULT_PORT = 5552
DEFAULT_TLS_PORT = 5551
JSON_OFFSET_LATEST = -1
"""In an offsets JSON object: the tail of that partition stream."""
JSON_OFFSET_EARLIEST = -2
"""In a `startingOffsets` JSON object: the first available offset of that partition stream."""

_LONG_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1
_DAY_MS = 24 * 60 * 60 * 1000
_REFERENCE_MAX_BYTES = 256  # consumer and producer names are stream-protocol references

INTEGER_BOUNDS: Mapping[str, tuple[int, int]] = {
    # offsets and timestamps are int64 in the broker and in Spark
    "startingOffset": (0, _LONG_MAX),
    "startingTimestamp": (0, _LONG_MAX),
    "endingOffset": (0, _LONG_MAX),
    # a micro-batch: Spark counts a task's rows in an int; a terabyte is past any executor
    "maxRecordsPerTrigger": (1, _INT_MAX),
    "maxBytesPerTrigger": (1, 1 << 40),
    # every partition is a Spark task planned on the driver
    "minPartitions": (1, 100_000),
    # waits: a day without a chunk (a week for a whole read) is a stuck read, not a slow one
    "pollTimeoutMs": (1, _DAY_MS),
    "maxWaitMs": (1, 7 * _DAY_MS),
    "publisherConfirmTimeoutMs": (1, _DAY_MS),
    "enqueueTimeoutMs": (0, _DAY_MS),
    # memory per reader / producer: chunks granted, messages queued or awaiting a confirm
    "initialCredits": (1, 1000),
    "queueCapacity": (1, 10_000_000),
    "maxInFlight": (1, 1_000_000),
    "estimatedMessageSizeBytes": (1, 1 << 30),
    # messages per publish frame; per sub-entry batch (its count is an unsigned 16-bit field)
    "batchSize": (1, 10_000),
    "subEntrySize": (1, 65_535),
}
"""Valid range of every integer option, inclusive: checked when parsing, and by the models."""


def _ranged(option: str, default: int | None) -> Any:
    """The model field of an integer option: its default and its `INTEGER_BOUNDS` range."""
    lo, hi = INTEGER_BOUNDS[option]
    return Field(default=default, ge=lo, le=hi)


def describe_range(option: str) -> str:
    """An integer option's valid range as docs/options.md writes it: `1 to 65,535`, or `≥ 0`."""
    lo, hi = INTEGER_BOUNDS[option]
    return f"≥ {lo}" if hi == _LONG_MAX else f"{lo:,} to {hi:,}"


STARTING_OFFSETS_VALUES = ("earliest", "latest", "offset", "timestamp")
ENDING_OFFSETS_VALUES = ("latest", "offset")
COMPRESSION_VALUES = ("none", "gzip", "snappy", "lz4", "zstd")
ROUTING_STRATEGY_VALUES = ("hash", "key", "custom")
URI_SCHEMES = ("rabbitmq-stream", "rabbitmq-stream+tls")

# field name -> option name users type
CONNECTION_OPTIONS: Mapping[str, str] = {
    "endpoints": "endpoints",
    "uris": "uris",
    "username": "username",
    "password": "password",
    "vhost": "vhost",
    "tls": "tls",
    "tls_truststore": "tls.truststore",
    "tls_truststore_password": "tls.truststorePassword",
    "tls_keystore": "tls.keystore",
    "tls_keystore_password": "tls.keystorePassword",
    "tls_trust_all": "tls.trustAll",
    "tls_ca_file": "tls.caFile",
    "tls_cert_file": "tls.certFile",
    "tls_key_file": "tls.keyFile",
    "address_resolver_class": "addressResolverClass",
}
_SOURCE_ONLY: Mapping[str, str] = {
    "stream": "stream",
    "superstream": "superstream",
    "consumer_name": "consumerName",
    "metadata_fields": "metadataFields",
    "fail_on_data_loss": "failOnDataLoss",
    "starting_offsets": "startingOffsets",
    "starting_offset": "startingOffset",
    "starting_timestamp": "startingTimestamp",
    "ending_offsets": "endingOffsets",
    "ending_offset": "endingOffset",
    "max_records_per_trigger": "maxRecordsPerTrigger",
    "max_bytes_per_trigger": "maxBytesPerTrigger",
    "min_partitions": "minPartitions",
    "server_side_offset_tracking": "serverSideOffsetTracking",
    "filter_values": "filterValues",
    "filter_match_unfiltered": "filterMatchUnfiltered",
    "filter_post_filter_class": "filterPostFilterClass",
    "poll_timeout_ms": "pollTimeoutMs",
    "max_wait_ms": "maxWaitMs",
    "initial_credits": "initialCredits",
    "queue_capacity": "queueCapacity",
    "estimated_message_size_bytes": "estimatedMessageSizeBytes",
    "strict_decoding": "strictDecoding",
}
_SINK_ONLY: Mapping[str, str] = {
    "stream": "stream",
    "superstream": "superstream",
    "producer_name": "producerName",
    "publisher_confirm_timeout_ms": "publisherConfirmTimeoutMs",
    "max_in_flight": "maxInFlight",
    "enqueue_timeout_ms": "enqueueTimeoutMs",
    "batch_size": "batchSize",
    "compression": "compression",
    "sub_entry_size": "subEntrySize",
    "routing_strategy": "routingStrategy",
    "partitioner_class": "partitionerClass",
    "filter_value_path": "filterValuePath",
    "ignore_unknown_columns": "ignoreUnknownColumns",
}

KNOWN_SOURCE_OPTIONS: tuple[str, ...] = (*CONNECTION_OPTIONS.values(), *_SOURCE_ONLY.values())
KNOWN_SINK_OPTIONS: tuple[str, ...] = (*CONNECTION_OPTIONS.values(), *_SINK_ONLY.values())
_CANONICAL: Mapping[str, str] = {name.lower(): name for name in (*KNOWN_SOURCE_OPTIONS, *KNOWN_SINK_OPTIONS)}

REMOVED_OPTIONS: Mapping[str, str] = {
    "filterValueColumn": "use 'filterValuePath' on the sink instead "
    "(e.g. filterValuePath=application_properties.region)",
    "filterPostFilterClassV2": "use 'filterPostFilterClass' instead",
}
"""Options that were removed (hard cutoff): giving one fails fast with what to use instead."""

_SECRET_OPTIONS = frozenset({"password", "tls.truststorePassword", "tls.keystorePassword", "uris"})
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_INTEGER = re.compile(r"[+-]?\d+")


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _hiding_secrets(
    parse: Callable[Concatenate[Mapping[str, str], _P], _R],
) -> Callable[Concatenate[Mapping[str, str], _P], _R]:
    """Wrap a `parse_*` function: no error it raises holds a secret of the options it was given.

    Messages are written without secrets (values go through `redact`); this is the net under them.
    """

    @functools.wraps(parse)
    def parse_hiding_secrets(options: Mapping[str, str], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with redacted_errors(secrets_in(options)):
            return parse(options, *args, **kwargs)

    return parse_hiding_secrets


def _err(message: str) -> ConfigurationError:
    return ConfigurationError(message)


def _show(value: str, limit: int = 80) -> str:
    """A user value, quoted and shortened, for an error message (never used for secrets)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _suggest(key: str, candidates: tuple[str, ...]) -> str | None:
    """The closest known option name: difflib's candidates, ranked by edit distance, then length."""
    by_lower = {name.lower(): name for name in candidates}
    wanted = key.lower()
    close = difflib.get_close_matches(wanted, list(by_lower), n=5, cutoff=0.6)
    if not close:
        return None
    best = min(
        close,
        key=lambda c: (
            _levenshtein(wanted, c),
            abs(len(c) - len(wanted)),
            -difflib.SequenceMatcher(None, wanted, c).ratio(),
        ),
    )
    return by_lower[best]


# Keys Spark itself puts into a data source's options (not ours to validate).
_SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation", "queryname"})


def _normalize(
    options: Mapping[str, Any],
    *,
    known: tuple[str, ...],
    context: str,
    ignored: tuple[str, ...] = (),
    elsewhere: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Case-insensitive lookup: canonical option name -> string value; unknown keys fail.

    `ignored` are known names accepted and dropped; `elsewhere` maps a lower-cased name valid only
    in another context to a phrase saying where it belongs.
    """
    by_lower = {name.lower(): name for name in known}
    ignored_lower = {name.lower() for name in ignored}
    removed = {name.lower(): (name, hint) for name, hint in REMOVED_OPTIONS.items()}
    result: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for raw_key, raw_value in options.items():
        if raw_value is None:
            continue
        key = str(raw_key).strip()
        lower = key.lower()
        if lower.startswith("spark.") or lower in _SPARK_KEYS:
            continue
        if lower in removed:
            name, hint = removed[lower]
            raise _err(f"option '{name}' was removed; {hint}")
        if lower in ignored_lower:
            continue
        if lower not in by_lower:
            if elsewhere and lower in elsewhere:
                name = _CANONICAL.get(lower, key)  # Spark lower-cases keys: show the name users type
                raise _err(f"option '{name}' {elsewhere[lower]}; it is not valid for {context}")
            suggestion = _suggest(key, (*known, *ignored))
            if suggestion is not None:
                raise _err(f"unknown option '{key}'; did you mean '{suggestion}'?")
            raise _err(f"unknown option '{key}' for {context}; valid options are: {', '.join(known)}")
        name = by_lower[lower]
        value = raw_value if isinstance(raw_value, str) else str(raw_value)
        if isinstance(raw_value, bool):
            value = value.lower()
        if name in result and result[name] != value:
            raise _err(
                f"option '{name}' is given more than once with different values "
                f"(as '{spelled[name]}' and '{key}'); option names are case-insensitive"
            )
        result[name] = value
        spelled[name] = key
    return result


class _Reader:
    """Typed access to normalized options; every error names the option and what is valid."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def has(self, name: str) -> bool:
        return name in self.values

    def text(self, name: str, default: str | None = None, *, allow_empty: bool = False) -> str | None:
        value = self.values.get(name)
        if value is None:
            return default
        if name not in _SECRET_OPTIONS:
            value = value.strip()
        if not value and not allow_empty:
            raise _err(f"option '{name}' must not be empty")
        return value

    def secret(self, name: str, default: str | None = None) -> SecretStr | None:
        value = self.values.get(name, default)
        return None if value is None else SecretStr(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.values.get(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
        raise _err(f"option '{name}' must be 'true' or 'false' (case-insensitive), got {_show(value)}")

    def integer(self, name: str, default: int | None) -> int | None:
        """An integer option within its `INTEGER_BOUNDS` range; the message says the range."""
        value = self.values.get(name)
        if value is None:
            return default
        lo, hi = INTEGER_BOUNDS[name]
        text = value.strip()
        if not _INTEGER.fullmatch(text):
            allowed = f"an integer >= {lo}" if hi == _LONG_MAX else f"an integer between {lo} and {hi}"
            raise _err(f"option '{name}' must be {allowed}, got {_show(value)}")
        number = int(text)
        if number < lo and hi == _LONG_MAX:
            raise _err(f"option '{name}' must be >= {lo}, got {number}")
        if not lo <= number <= hi:
            raise _err(f"option '{name}' must be between {lo} and {hi}, got {number}")
        return number

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.values.get(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered not in choices:
            raise _err(f"option '{name}' must be one of {', '.join(choices)}; got {_show(value)}")
        return lowered

    def class_path(self, name: str) -> str | None:
        value = self.text(name)
        if value is not None and not _DOTTED_PATH.fullmatch(value):
            raise _err(
                f"option '{name}' must be a dotted path to a class, like 'package.module.ClassName'; "
                f"got {_show(value)}"
            )
        return value

    def reference(self, name: str) -> str | None:
        value = self.text(name)
        if value is not None and len(value.encode()) > _REFERENCE_MAX_BYTES:
            raise _err(f"option '{name}' must be at most {_REFERENCE_MAX_BYTES} bytes long")
        return value


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    OPTION_NAMES: ClassVar[Mapping[str, str]] = {}
    """Field name -> the camelCase option name users type."""

    @classmethod
    def default(cls, field: str) -> Any:
        """A field's default, for settings built outside the models (the broker layer's dataclasses)."""
        return cls.model_fields[field].get_default(call_default_factory=True)


_M = TypeVar("_M", bound=_Frozen)


def _build(cls: type[_M], **fields: Any) -> _M:
    """Construct a model; a pydantic error becomes a ConfigurationError without any input value."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        details = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = [str(part) for part in error["loc"]]
            if loc:
                loc[0] = cls.OPTION_NAMES.get(loc[0], loc[0])
            details.append(f"option '{'.'.join(loc)}': {error['msg']}")
        raise _err("; ".join(details)) from None


# ---------------------------------------------------------------------------------------------
# Connection
# ---------------------------------------------------------------------------------------------


class ConnectionOptions(_Frozen):
    """Where and how to connect. `uris` wins over `endpoints` when both are given.

    `uris` keeps each given URI with its password removed (the password lives in `password`), so
    nothing printed or dumped from this model shows a secret.
    """

    OPTION_NAMES: ClassVar[Mapping[str, str]] = CONNECTION_OPTIONS

    endpoints: list[tuple[str, int]] = Field(default_factory=list)
    uris: list[str] = Field(default_factory=list)
    username: str = "guest"
    password: SecretStr = SecretStr("guest")
    vhost: str = "/"
    tls: bool = False
    tls_truststore: str | None = None
    tls_truststore_password: SecretStr | None = None
    tls_keystore: str | None = None
    tls_keystore_password: SecretStr | None = None
    tls_trust_all: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    address_resolver_class: str | None = None

    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) to connect to: from `uris` when present, else from `endpoints`."""
        if self.uris:
            return [_uri_address(uri) for uri in self.uris]
        return list(self.endpoints)

    def to_options(self) -> dict[str, str]:
        """Back to Spark options (secrets included): what a job hands `spark.read.options(...)`.

        The result holds the password: pass it to Spark, never log or return it.
        """
        out: dict[str, str] = {}
        for field, option in CONNECTION_OPTIONS.items():
            value = getattr(self, field)
            if value is None or value == [] or (field == "tls_trust_all" and not value):
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if field == "endpoints":
                value = ",".join(f"{h}:{p}" for h, p in value)
            elif field == "uris":
                value = ",".join(value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            out[option] = str(value)
        if self.uris:
            out.pop("endpoints", None)
        return out

    def cache_key(self) -> tuple[Any, ...]:
        """A hashable identity of this configuration, secrets included, for a connection pool.

        It contains secret values: use it as a key only, never print or log it.
        """

        def reveal(secret: SecretStr | None) -> str | None:
            return None if secret is None else secret.get_secret_value()

        return (
            tuple(self.addresses()),
            self.username,
            reveal(self.password),
            self.vhost,
            self.tls,
            self.tls_truststore,
            reveal(self.tls_truststore_password),
            self.tls_keystore,
            reveal(self.tls_keystore_password),
            self.tls_trust_all,
            self.tls_ca_file,
            self.tls_cert_file,
            self.tls_key_file,
            self.address_resolver_class,
        )


def _uri_address(uri: str) -> tuple[str, int]:
    parts = urlsplit(uri)
    default = DEFAULT_TLS_PORT if parts.scheme.lower().endswith("+tls") else DEFAULT_PORT
    return parts.hostname or "", parts.port or default


class _ParsedUri(NamedTuple):
    shown: str  # the URI without its password
    tls: bool
    user: str | None
    password: str | None
    vhost: str | None


def _parse_uri(entry: str) -> _ParsedUri:
    shown = redact_uri(entry)
    expected = "rabbitmq-stream://user:password@host:port/vhost (or rabbitmq-stream+tls://...)"
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError:
        raise _err(f"option 'uris' has an invalid URI {shown!r}; expected {expected}") from None
    scheme = parts.scheme.lower()
    if scheme not in URI_SCHEMES:
        raise _err(
            f"option 'uris' has an invalid URI {shown!r}: the scheme must be one of "
            f"{', '.join(URI_SCHEMES)}; expected {expected}"
        )
    if not parts.hostname:
        raise _err(f"option 'uris' has a URI without a host {shown!r}; expected {expected}")
    if port is not None and not 1 <= port <= 65535:
        raise _err(f"option 'uris' has a port outside 1..65535 in {shown!r}")
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else None
    # Keep the URI without its password: the password is carried as a SecretStr.
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{host}:{port}" if port is not None else host
    if parts.username is not None:
        netloc = f"{parts.username}@{netloc}"
    clean = f"{scheme}://{netloc}{parts.path}"
    return _ParsedUri(clean, scheme.endswith("+tls"), user, password, vhost)


def _split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _shown_endpoint(entry: str) -> str:
    """An `endpoints` entry for a message: `user:password@` typed by mistake stays hidden."""
    return _show(redact_option("endpoints", entry))


def _parse_endpoint(entry: str, default_port: int) -> tuple[str, int]:
    expected = "comma-separated host:port (port defaults to 5552, 5551 with tls; IPv6 as [::1]:5552)"
    shown = _shown_endpoint(entry)
    host, port_text = entry, None
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise _err(f"option 'endpoints' has an invalid entry {shown}; expected {expected}")
        host, rest = entry[1:end], entry[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise _err(f"option 'endpoints' has an invalid entry {shown}; expected {expected}")
            port_text = rest[1:]
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
    elif entry.count(":") > 1:
        raise _err(
            f"option 'endpoints' has an invalid entry {shown}; write IPv6 hosts in brackets, like [::1]:5552"
        )
    host = host.strip()
    if not host:
        raise _err(f"option 'endpoints' has an entry without a host {shown}; expected {expected}")
    if port_text is None:
        return host, default_port
    port_text = port_text.strip()
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _err(
            f"option 'endpoints' has an invalid port in {shown}; the port must be an integer "
            f"between 1 and 65535"
        )
    return host, int(port_text)


def _connection_from(r: _Reader) -> ConnectionOptions:
    explicit_tls = r.boolean("tls", False) if r.has("tls") else None

    uris_text = r.text("uris", allow_empty=True)
    parsed = [_parse_uri(entry) for entry in _split_list(uris_text or "")]

    uri_tls = False
    user: str | None = None
    uri_password: str | None = None
    uri_vhost: str | None = None
    if parsed:
        if len({p.tls for p in parsed}) > 1:
            raise _err(f"option 'uris' mixes schemes; use one of {', '.join(URI_SCHEMES)} for all entries")
        if len({(p.user, p.password, p.vhost) for p in parsed}) > 1:
            raise _err("option 'uris' entries must all use the same credentials and virtual host")
        uri_tls = parsed[0].tls
        user, uri_password, uri_vhost = parsed[0].user, parsed[0].password, parsed[0].vhost
        if uri_tls and explicit_tls is False:
            raise _err("option 'tls' is false but option 'uris' uses rabbitmq-stream+tls://; remove one")
    tls = uri_tls or bool(explicit_tls)

    default_port = DEFAULT_TLS_PORT if tls else DEFAULT_PORT
    endpoints_text = r.text("endpoints", allow_empty=True)
    endpoints = [_parse_endpoint(entry, default_port) for entry in _split_list(endpoints_text or "")]

    if not parsed and not endpoints:
        raise _err(
            "one of the options 'endpoints' (comma-separated host:port) or 'uris' "
            "(comma-separated rabbitmq-stream://user:password@host:port/vhost) is required"
        )

    tls_files = {
        "tls.truststore": r.text("tls.truststore"),
        "tls.keystore": r.text("tls.keystore"),
        "tls.caFile": r.text("tls.caFile"),
        "tls.certFile": r.text("tls.certFile"),
        "tls.keyFile": r.text("tls.keyFile"),
    }
    trust_all = r.boolean("tls.trustAll", False)
    enabling = [name for name, value in tls_files.items() if value is not None]
    enabling += [n for n in ("tls.truststorePassword", "tls.keystorePassword") if r.has(n)]
    if trust_all:
        enabling.append("tls.trustAll")
    if enabling and not tls:
        raise _err(
            f"option '{enabling[0]}' needs TLS: set option 'tls' to true "
            f"(or use rabbitmq-stream+tls:// in 'uris')"
        )
    for password_option, store_option in (
        ("tls.truststorePassword", "tls.truststore"),
        ("tls.keystorePassword", "tls.keystore"),
    ):
        if r.has(password_option) and tls_files[store_option] is None:
            raise _err(f"option '{password_option}' is set but option '{store_option}' is not")
    if tls_files["tls.keyFile"] is not None and tls_files["tls.certFile"] is None:
        raise _err("option 'tls.keyFile' is set but option 'tls.certFile' is not")

    username = user if user is not None else r.text("username", "guest")
    password = uri_password if uri_password is not None else r.values.get("password", "guest")
    vhost = uri_vhost if uri_vhost is not None else r.text("vhost", "/")

    return _build(
        ConnectionOptions,
        endpoints=endpoints,
        uris=[p.shown for p in parsed],
        username=username,
        password=SecretStr(password),
        vhost=vhost,
        tls=tls,
        tls_truststore=tls_files["tls.truststore"],
        tls_truststore_password=r.secret("tls.truststorePassword"),
        tls_keystore=tls_files["tls.keystore"],
        tls_keystore_password=r.secret("tls.keystorePassword"),
        tls_trust_all=trust_all,
        tls_ca_file=tls_files["tls.caFile"],
        tls_cert_file=tls_files["tls.certFile"],
        tls_key_file=tls_files["tls.keyFile"],
        address_resolver_class=r.class_path("addressResolverClass"),
    )


@_hiding_secrets
def parse_connection_options(options: Mapping[str, str]) -> ConnectionOptions:
    """Connection options alone (Airflow, Dagster, CLI). Known source/sink options are ignored."""
    known = tuple(CONNECTION_OPTIONS.values())
    others = tuple(n for n in dict.fromkeys((*KNOWN_SOURCE_OPTIONS, *KNOWN_SINK_OPTIONS)) if n not in known)
    values = _normalize(options, known=known, context="a connection", ignored=others)
    return _connection_from(_Reader(values))


# ---------------------------------------------------------------------------------------------
# Stream target (shared by source and sink)
# ---------------------------------------------------------------------------------------------


def _target(r: _Reader) -> tuple[str | None, str | None]:
    stream = r.text("stream")
    superstream = r.text("superstream")
    if (stream is None) == (superstream is None):
        state = "both are set" if stream is not None else "neither is set"
        raise _err(f"exactly one of the options 'stream' or 'superstream' must be set; {state}")
    return stream, superstream


# ---------------------------------------------------------------------------------------------
# Source
# ---------------------------------------------------------------------------------------------

StartingOffsetsKind = Literal["earliest", "latest", "offset", "timestamp", "json"]
EndingOffsetsKind = Literal["latest", "offset", "json"]


class SourceOptions(_Frozen):
    """Options of a batch (`spark.read`) or streaming (`spark.readStream`) read.

    `starting_offsets` / `ending_offsets` is "json" when a JSON object was given; the object is then
    in `starting_offsets_json` / `ending_offsets_json` (partition stream -> next offset, with
    -1 = latest and, when starting, -2 = earliest). `ending_offsets` is None for streaming reads.
    """

    OPTION_NAMES: ClassVar[Mapping[str, str]] = {
        **CONNECTION_OPTIONS,
        **_SOURCE_ONLY,
        "starting_offsets_json": "startingOffsets",
        "ending_offsets_json": "endingOffsets",
    }

    connection: ConnectionOptions
    streaming: bool = False
    stream: str | None = None
    superstream: str | None = None
    consumer_name: str | None = None
    metadata_fields: tuple[str, ...] = METADATA_FIELDS
    fail_on_data_loss: bool = True
    starting_offsets: StartingOffsetsKind = "earliest"
    starting_offset: int | None = _ranged("startingOffset", None)
    starting_timestamp: int | None = _ranged("startingTimestamp", None)
    starting_offsets_json: dict[str, int] | None = None
    ending_offsets: EndingOffsetsKind | None = None
    ending_offset: int | None = _ranged("endingOffset", None)
    ending_offsets_json: dict[str, int] | None = None
    max_records_per_trigger: int | None = _ranged("maxRecordsPerTrigger", None)
    max_bytes_per_trigger: int | None = _ranged("maxBytesPerTrigger", None)
    min_partitions: int | None = _ranged("minPartitions", None)
    server_side_offset_tracking: bool = False
    filter_values: list[str] | None = None
    filter_match_unfiltered: bool = False
    filter_post_filter_class: str | None = None
    poll_timeout_ms: int = _ranged("pollTimeoutMs", 30000)
    max_wait_ms: int = _ranged("maxWaitMs", 300000)
    initial_credits: int = _ranged("initialCredits", 1)
    queue_capacity: int = _ranged("queueCapacity", 10000)
    estimated_message_size_bytes: int = _ranged("estimatedMessageSizeBytes", 1024)
    strict_decoding: bool = False

    @property
    def is_super_stream(self) -> bool:
        return self.superstream is not None

    @property
    def name(self) -> str:
        """The stream or super stream read."""
        return self.superstream if self.superstream is not None else str(self.stream)

    def validate_partitions(self, partitions: list[str]) -> None:
        """Fail when an offsets JSON object names a stream that is not one of `partitions`."""
        valid = set(partitions)
        what = f"super stream '{self.superstream}'" if self.is_super_stream else f"stream '{self.stream}'"
        for option, offsets in (
            ("startingOffsets", self.starting_offsets_json),
            ("endingOffsets", self.ending_offsets_json),
        ):
            unknown = sorted(set(offsets or {}) - valid)
            if unknown:
                raise _err(
                    f"option '{option}' names stream(s) {', '.join(repr(u) for u in unknown)} that are not "
                    f"partitions of {what}; valid names: {', '.join(sorted(valid)) or '(none)'}"
                )


def _offsets_json(name: str, text: str, *, starting: bool) -> dict[str, int]:
    sentinels = "-1 (latest) or -2 (earliest)" if starting else "-1 (latest)"
    allowed_negative = {JSON_OFFSET_LATEST, JSON_OFFSET_EARLIEST} if starting else {JSON_OFFSET_LATEST}
    shape = 'a JSON object of partition stream name to offset, like {"orders-0": 1200, "orders-1": 980}'
    try:
        value = json.loads(text)
    except ValueError:
        raise _err(f"option '{name}' is not valid JSON; expected {shape}") from None
    if not isinstance(value, dict) or not value:
        raise _err(f"option '{name}' must be a non-empty JSON object; expected {shape}")
    result: dict[str, int] = {}
    for stream, offset in value.items():
        if not stream:
            raise _err(f"option '{name}' has an empty stream name; expected {shape}")
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise _err(f"option '{name}' has a non-integer offset for stream {stream!r}; expected {shape}")
        if (offset < 0 and offset not in allowed_negative) or offset > _LONG_MAX:
            raise _err(
                f"option '{name}' has an invalid offset {offset} for stream {stream!r}; "
                f"offsets must be >= 0, or {sentinels}"
            )
        result[stream] = offset
    return result


def _metadata_fields(r: _Reader) -> tuple[str, ...]:
    value = r.text("metadataFields", allow_empty=True)
    if value is None:
        return METADATA_FIELDS
    wanted = {item.lower() for item in _split_list(value)}
    unknown = sorted(wanted - set(METADATA_FIELDS))
    if unknown:
        raise _err(
            f"option 'metadataFields' has unknown field(s) {', '.join(repr(u) for u in unknown)}; "
            f"valid fields are: {', '.join(METADATA_FIELDS)} (comma-separated; empty for none)"
        )
    return tuple(field for field in METADATA_FIELDS if field in wanted)


def _offsets_kind(
    r: _Reader, name: str, values: tuple[str, ...], default: str, *, starting: bool
) -> tuple[str, dict[str, int] | None]:
    """`startingOffsets` / `endingOffsets`: one of `values`, or "json" with the parsed object."""
    raw = r.text(name)
    if raw is None:
        return default, None
    if raw.startswith("{"):
        return "json", _offsets_json(name, raw, starting=starting)
    if raw.lower() in values:
        return raw.lower(), None
    raise _err(
        f"option '{name}' must be one of {', '.join(values)} or a JSON "
        f'object like {{"orders-0": 1200}}; got {_show(raw)}'
    )


def _starting(r: _Reader, stream: str | None) -> dict[str, Any]:
    kind, offsets_json = _offsets_kind(
        r, "startingOffsets", STARTING_OFFSETS_VALUES, "earliest", starting=True
    )
    offset = r.integer("startingOffset", None)
    timestamp = r.integer("startingTimestamp", None)
    if kind == "offset" and offset is None:
        raise _err("option 'startingOffset' (an integer >= 0) is required when startingOffsets=offset")
    if kind == "timestamp" and timestamp is None:
        raise _err(
            "option 'startingTimestamp' (epoch milliseconds, an integer >= 0) is required "
            "when startingOffsets=timestamp"
        )
    if offset is not None and kind != "offset":
        raise _err(f"option 'startingOffset' is only used with startingOffsets=offset, not '{kind}'")
    if timestamp is not None and kind != "timestamp":
        raise _err(f"option 'startingTimestamp' is only used with startingOffsets=timestamp, not '{kind}'")
    _check_single_stream_json("startingOffsets", offsets_json, stream)
    return {
        "starting_offsets": kind,
        "starting_offset": offset,
        "starting_timestamp": timestamp,
        "starting_offsets_json": offsets_json,
    }


def _ending(r: _Reader, stream: str | None, streaming: bool) -> dict[str, Any]:
    if streaming:
        for name in ("endingOffsets", "endingOffset"):
            if r.has(name):
                raise _err(
                    f"option '{name}' is batch-only: it cannot be used with a streaming read "
                    f"(spark.readStream); use spark.read for a bounded read"
                )
        return {"ending_offsets": None, "ending_offset": None, "ending_offsets_json": None}
    kind, offsets_json = _offsets_kind(r, "endingOffsets", ENDING_OFFSETS_VALUES, "latest", starting=False)
    offset = r.integer("endingOffset", None)
    if kind == "offset" and offset is None:
        raise _err("option 'endingOffset' (an integer >= 0) is required when endingOffsets=offset")
    if offset is not None and kind != "offset":
        raise _err(f"option 'endingOffset' is only used with endingOffsets=offset, not '{kind}'")
    _check_single_stream_json("endingOffsets", offsets_json, stream)
    return {"ending_offsets": kind, "ending_offset": offset, "ending_offsets_json": offsets_json}


def _check_single_stream_json(option: str, offsets: dict[str, int] | None, stream: str | None) -> None:
    if offsets is None or stream is None:
        return
    unknown = sorted(set(offsets) - {stream})
    if unknown:
        raise _err(
            f"option '{option}' names stream(s) {', '.join(repr(u) for u in unknown)}, but this read is "
            f"of stream '{stream}'; the only valid name is '{stream}'"
        )


def _check_range(fields: dict[str, Any]) -> None:
    start, end = fields["starting_offset"], fields["ending_offset"]
    if start is not None and end is not None and end < start:
        raise _err(f"option 'endingOffset' ({end}) must be >= option 'startingOffset' ({start})")
    start_json, end_json = fields["starting_offsets_json"] or {}, fields["ending_offsets_json"] or {}
    for stream, end_offset in end_json.items():
        start_offset = start_json.get(stream)
        if start_offset is not None and start_offset >= 0 and 0 <= end_offset < start_offset:
            raise _err(
                f"option 'endingOffsets' ({end_offset}) is before option 'startingOffsets' "
                f"({start_offset}) for stream {stream!r}"
            )


@_hiding_secrets
def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse and validate read options; `streaming` is True for `spark.readStream`."""
    sink_only = {name.lower() for name in _SINK_ONLY.values()} - {n.lower() for n in KNOWN_SOURCE_OPTIONS}
    values = _normalize(
        options,
        known=KNOWN_SOURCE_OPTIONS,
        context="reading (a source)",
        elsewhere={name: "is a sink (write) option" for name in sink_only},
    )
    r = _Reader(values)
    connection = _connection_from(r)
    stream, superstream = _target(r)
    fields: dict[str, Any] = {**_starting(r, stream), **_ending(r, stream, streaming)}
    _check_range(fields)
    filter_values_text = r.text("filterValues", allow_empty=True)
    filter_values = None
    if filter_values_text is not None:
        filter_values = _split_list(filter_values_text)
        if not filter_values:
            raise _err("option 'filterValues' must list at least one value (comma-separated)")
    consumer_name = r.reference("consumerName")
    # No query id reaches a Python data source: tracking is on by default only with a consumer name.
    tracking = r.boolean("serverSideOffsetTracking", streaming and consumer_name is not None)
    if tracking and consumer_name is None:
        raise _err(
            "option 'serverSideOffsetTracking'=true stores offsets under option 'consumerName', which is "
            "not set: set consumerName to a stable name (or drop serverSideOffsetTracking)"
        )
    return _build(
        SourceOptions,
        connection=connection,
        streaming=streaming,
        stream=stream,
        superstream=superstream,
        consumer_name=consumer_name,
        metadata_fields=_metadata_fields(r),
        fail_on_data_loss=r.boolean("failOnDataLoss", True),
        **fields,
        max_records_per_trigger=r.integer("maxRecordsPerTrigger", None),
        max_bytes_per_trigger=r.integer("maxBytesPerTrigger", None),
        min_partitions=r.integer("minPartitions", None),
        server_side_offset_tracking=tracking,
        filter_values=filter_values,
        filter_match_unfiltered=r.boolean("filterMatchUnfiltered", False),
        filter_post_filter_class=r.class_path("filterPostFilterClass"),
        poll_timeout_ms=r.integer("pollTimeoutMs", 30000),
        max_wait_ms=r.integer("maxWaitMs", 300000),
        initial_credits=r.integer("initialCredits", 1),
        queue_capacity=r.integer("queueCapacity", 10000),
        estimated_message_size_bytes=r.integer("estimatedMessageSizeBytes", 1024),
        strict_decoding=r.boolean("strictDecoding", False),
    )


# ---------------------------------------------------------------------------------------------
# Sink
# ---------------------------------------------------------------------------------------------

CompressionKind = Literal["none", "gzip", "snappy", "lz4", "zstd"]
RoutingStrategyKind = Literal["hash", "key", "custom"]


class SinkOptions(_Frozen):
    """Options of a batch (`df.write`) or streaming (`df.writeStream`) write."""

    OPTION_NAMES: ClassVar[Mapping[str, str]] = {**CONNECTION_OPTIONS, **_SINK_ONLY}

    connection: ConnectionOptions
    stream: str | None = None
    superstream: str | None = None
    producer_name: str | None = None
    publisher_confirm_timeout_ms: int = _ranged("publisherConfirmTimeoutMs", 30000)
    max_in_flight: int = _ranged("maxInFlight", 10000)
    enqueue_timeout_ms: int = _ranged("enqueueTimeoutMs", 10000)
    batch_size: int = _ranged("batchSize", 500)
    compression: CompressionKind = "none"
    sub_entry_size: int = _ranged("subEntrySize", 1)
    routing_strategy: RoutingStrategyKind = "hash"
    partitioner_class: str | None = None
    filter_value_path: str | None = None
    ignore_unknown_columns: bool = False

    @property
    def is_super_stream(self) -> bool:
        return self.superstream is not None

    @property
    def name(self) -> str:
        """The stream or super stream written."""
        return self.superstream if self.superstream is not None else str(self.stream)


def _filter_value_path(r: _Reader) -> str | None:
    value = r.text("filterValuePath")
    if value is None:
        return None
    forms = (
        "routing_key, application_properties.<key>, message_annotations.<key> or "
        f"properties.<field> (field one of {', '.join(PROPERTIES_FIELDS)})"
    )
    if value == "routing_key":
        return value
    head, dot, rest = value.partition(".")
    if dot and rest and head in ("application_properties", "message_annotations"):
        return value
    if dot and head == "properties" and rest in PROPERTIES_FIELDS:
        return value
    raise _err(f"option 'filterValuePath' must be {forms}; got {_show(value)}")


@_hiding_secrets
def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse and validate write options (batch and streaming alike)."""
    source_only = {name.lower() for name in _SOURCE_ONLY.values()} - {n.lower() for n in KNOWN_SINK_OPTIONS}
    values = _normalize(
        options,
        known=KNOWN_SINK_OPTIONS,
        context="writing (a sink)",
        elsewhere={name: "is a source (read) option" for name in source_only},
    )
    r = _Reader(values)
    connection = _connection_from(r)
    stream, superstream = _target(r)
    compression = r.choice("compression", COMPRESSION_VALUES, "none")
    sub_entry_size = r.integer("subEntrySize", 1)
    assert sub_entry_size is not None
    if compression != "none" and sub_entry_size <= 1:
        raise _err(
            f"option 'compression'={compression} requires option 'subEntrySize' > 1 "
            f"(compression applies to sub-entry batches); got subEntrySize={sub_entry_size}"
        )
    routing = r.choice("routingStrategy", ROUTING_STRATEGY_VALUES, "hash")
    partitioner = r.class_path("partitionerClass")
    if routing == "custom" and partitioner is None:
        raise _err("option 'routingStrategy'=custom requires option 'partitionerClass' (a dotted class path)")
    if partitioner is not None and routing != "custom":
        raise _err(
            f"option 'partitionerClass' is only used with routingStrategy=custom; routingStrategy is "
            f"'{routing}' (valid values: {', '.join(ROUTING_STRATEGY_VALUES)})"
        )
    return _build(
        SinkOptions,
        connection=connection,
        stream=stream,
        superstream=superstream,
        producer_name=r.reference("producerName"),
        publisher_confirm_timeout_ms=r.integer("publisherConfirmTimeoutMs", 30000),
        max_in_flight=r.integer("maxInFlight", 10000),
        enqueue_timeout_ms=r.integer("enqueueTimeoutMs", 10000),
        batch_size=r.integer("batchSize", 500),
        compression=compression,
        sub_entry_size=sub_entry_size,
        routing_strategy=routing,
        partitioner_class=partitioner,
        filter_value_path=_filter_value_path(r),
        ignore_unknown_columns=r.boolean("ignoreUnknownColumns", False),
    )
