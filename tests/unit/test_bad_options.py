"""Bad input, table-driven: every invalid option set fails fast with a ConfigurationError naming the option.

Each row is one invalid set of options, tried on `parse_source_options` (batch, streaming or both)
or `parse_sink_options`. The error must name the offending option as users type it (camelCase,
quoted), may have to say more (`also`), and must never show the password. test_options.py covers
the rules one by one; this table is the broad sweep of what users get wrong.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.options import (
    INTEGER_BOUNDS,
    KNOWN_SINK_OPTIONS,
    KNOWN_SOURCE_OPTIONS,
    REMOVED_OPTIONS,
    parse_sink_options,
    parse_source_options,
)

SECRET = "Bad-0ptions-S3cret"
BASE: dict[str, str] = {"endpoints": "localhost:5552", "stream": "orders", "password": SECRET}
LONG_MAX_PLUS_1 = str(2**63)
SS = {"stream": None, "superstream": "orders"}  # read a super stream instead (None = option absent)

# (id, where, options on top of BASE, the option the message must name, another fragment or None)
# where: "batch" | "streaming" | "source" (both source modes) | "sink"
Case = tuple[str, str, Mapping[str, str | None], str, str | None]
CASES: list[Case] = [
    # --- typos and unknown names: named as typed, with the closest real option
    ("typo-stream", "source", {"streem": "x"}, "streem", "did you mean 'stream'?"),
    ("typo-fail-on-data-loss", "batch", {"failOnDatalos": "true"}, "failOnDatalos", "'failOnDataLoss'"),
    ("typo-poll-timeout", "streaming", {"pollTimeout": "5"}, "pollTimeout", "'pollTimeoutMs'"),
    ("typo-trust-all", "source", {"tls": "true", "tls.trustAl": "true"}, "tls.trustAl", "'tls.trustAll'"),
    ("typo-ca-file", "sink", {"tls": "true", "tls.caFiles": "/ca.pem"}, "tls.caFiles", "'tls.caFile'"),
    ("typo-superstream", "source", {"superStreams": "x"}, "superStreams", "'superstream'"),
    ("typo-compression", "sink", {"compresion": "gzip"}, "compresion", "'compression'"),
    ("typo-routing", "sink", {"routingStrategie": "key"}, "routingStrategie", "'routingStrategy'"),
    ("typo-max-records", "streaming", {"maxRecordsPerTriger": "5"}, "maxRecordsPerTriger", None),
    ("typo-metadata", "batch", {"metadataField": "properties"}, "metadataField", "'metadataFields'"),
    (
        "unknown-kafka-name",
        "streaming",
        {"kafka.bootstrap.servers": "h:9092"},
        "kafka.bootstrap.servers",
        None,
    ),
    # --- an option of the other side
    ("sink-option-on-batch-read", "batch", {"batchSize": "10"}, "batchSize", "sink"),
    ("sink-option-on-stream-read", "streaming", {"routingStrategy": "hash"}, "routingStrategy", "sink"),
    ("source-option-on-sink-1", "sink", {"consumerName": "c"}, "consumerName", "source"),
    ("source-option-on-sink-2", "sink", {"metadataFields": "properties"}, "metadataFields", "source"),
    ("source-option-on-sink-3", "sink", {"endingOffsets": "latest"}, "endingOffsets", "source"),
    # --- removed options
    ("removed-on-stream-read", "streaming", {"filterValueColumn": "region"}, "filterValueColumn", "removed"),
    ("removed-v2-on-sink", "sink", {"filterPostFilterClassV2": "a.B"}, "filterPostFilterClassV2", "removed"),
    ("removed-mixed-case", "batch", {"FilterPostFilterClassv2": "a.B"}, "filterPostFilterClassV2", "removed"),
    # --- wrong types: booleans
    ("bool-zero", "batch", {"failOnDataLoss": "0"}, "failOnDataLoss", "'true'"),
    ("bool-enabled", "streaming", {"serverSideOffsetTracking": "enabled"}, "serverSideOffsetTracking", None),
    ("bool-one", "source", {"filterMatchUnfiltered": "1"}, "filterMatchUnfiltered", None),
    ("bool-no", "batch", {"strictDecoding": "no"}, "strictDecoding", None),
    ("bool-tls-yes", "sink", {"tls": "yes"}, "tls", None),
    ("bool-trust-all-on", "source", {"tls": "true", "tls.trustAll": "on"}, "tls.trustAll", None),
    ("bool-sink-y", "sink", {"ignoreUnknownColumns": "Y"}, "ignoreUnknownColumns", None),
    # --- wrong types: integers
    ("int-scientific", "streaming", {"maxRecordsPerTrigger": "1e3"}, "maxRecordsPerTrigger", None),
    ("int-with-unit", "streaming", {"maxBytesPerTrigger": "10MB"}, "maxBytesPerTrigger", None),
    ("int-word", "batch", {"minPartitions": "two"}, "minPartitions", None),
    ("int-decimal", "source", {"pollTimeoutMs": "1.0"}, "pollTimeoutMs", None),
    ("int-hex", "source", {"queueCapacity": "0x10"}, "queueCapacity", None),
    ("int-blank", "source", {"initialCredits": " "}, "initialCredits", None),
    ("int-sink-fraction", "sink", {"maxInFlight": "100.5"}, "maxInFlight", None),
    ("int-sink-seconds", "sink", {"publisherConfirmTimeoutMs": "30s"}, "publisherConfirmTimeoutMs", None),
    ("int-sink-word", "sink", {"enqueueTimeoutMs": "forever"}, "enqueueTimeoutMs", None),
    # --- numbers out of range
    (
        "range-max-bytes-zero",
        "streaming",
        {"maxBytesPerTrigger": "0"},
        "maxBytesPerTrigger",
        "between 1 and ",
    ),
    ("range-min-partitions-zero", "batch", {"minPartitions": "0"}, "minPartitions", "between 1 and "),
    (
        "range-min-partitions-negative",
        "streaming",
        {"minPartitions": "-3"},
        "minPartitions",
        "between 1 and ",
    ),
    ("range-max-wait-zero", "source", {"maxWaitMs": "0"}, "maxWaitMs", "between 1 and "),
    (
        "range-message-size-negative",
        "source",
        {"estimatedMessageSizeBytes": "-1"},
        "estimatedMessageSizeBytes",
        None,
    ),
    ("range-queue-capacity-huge", "source", {"queueCapacity": LONG_MAX_PLUS_1}, "queueCapacity", None),
    ("range-credits-5000", "streaming", {"initialCredits": "5000"}, "initialCredits", "1000"),
    (
        "range-starting-offset-huge",
        "batch",
        {"startingOffsets": "offset", "startingOffset": LONG_MAX_PLUS_1},
        "startingOffset",
        None,
    ),
    (
        "range-timestamp-negative",
        "streaming",
        {"startingOffsets": "timestamp", "startingTimestamp": "-1"},
        "startingTimestamp",
        ">= 0",
    ),
    (
        "range-ending-offset-negative",
        "batch",
        {"endingOffsets": "offset", "endingOffset": "-5"},
        "endingOffset",
        None,
    ),
    ("range-batch-size-negative", "sink", {"batchSize": "-1"}, "batchSize", "between 1 and "),
    ("range-sub-entry-negative", "sink", {"subEntrySize": "-2"}, "subEntrySize", "between 1 and "),
    ("range-in-flight-huge", "sink", {"maxInFlight": str(2**64)}, "maxInFlight", None),
    (
        "range-confirm-timeout-zero",
        "sink",
        {"publisherConfirmTimeoutMs": "0"},
        "publisherConfirmTimeoutMs",
        None,
    ),
    # --- conflicting options
    ("both-stream-and-superstream", "sink", {"superstream": "invoices"}, "superstream", "exactly one"),
    ("neither-stream-nor-superstream", "streaming", {"stream": None}, "stream", "neither"),
    (
        "latest-with-offset",
        "source",
        {"startingOffsets": "latest", "startingOffset": "5"},
        "startingOffset",
        None,
    ),
    (
        "earliest-with-timestamp",
        "streaming",
        {"startingOffsets": "earliest", "startingTimestamp": "5"},
        "startingTimestamp",
        None,
    ),
    (
        "timestamp-with-offset",
        "batch",
        {"startingOffsets": "timestamp", "startingTimestamp": "1", "startingOffset": "3"},
        "startingOffset",
        "startingOffsets=offset",
    ),
    (
        "latest-end-with-offset",
        "batch",
        {"endingOffsets": "latest", "endingOffset": "5"},
        "endingOffset",
        None,
    ),
    (
        "json-end-with-offset",
        "batch",
        {"endingOffsets": '{"orders": 5}', "endingOffset": "5"},
        "endingOffset",
        "endingOffsets=offset",
    ),
    (
        "end-before-start",
        "batch",
        {"startingOffsets": "offset", "startingOffset": "10", "endingOffsets": "offset", "endingOffset": "3"},
        "endingOffset",
        "'startingOffset'",
    ),
    (
        "ending-json-on-stream-read",
        "streaming",
        {"endingOffsets": '{"orders": 5}'},
        "endingOffsets",
        "batch-only",
    ),
    ("ending-offset-on-stream-read", "streaming", {"endingOffset": "5"}, "endingOffset", "batch-only"),
    ("tls-false-with-tls-uri", "sink", {"tls": "false", "uris": "rabbitmq-stream+tls://h"}, "tls", "'uris'"),
    ("trust-all-without-tls", "source", {"tls.trustAll": "true"}, "tls.trustAll", "'tls'"),
    ("keystore-without-tls", "sink", {"tls.keystore": "/k.p12"}, "tls.keystore", "'tls'"),
    ("key-file-without-tls", "streaming", {"tls.keyFile": "/k.pem"}, "tls.keyFile", "'tls'"),
    (
        "truststore-password-without-truststore",
        "sink",
        {"tls": "true", "tls.truststorePassword": SECRET},
        "tls.truststorePassword",
        "'tls.truststore'",
    ),
    (
        "key-file-without-cert-file",
        "sink",
        {"tls": "true", "tls.keyFile": "/k.pem"},
        "tls.keyFile",
        "'tls.certFile'",
    ),
    (
        "lz4-without-sub-entries",
        "sink",
        {"compression": "lz4", "subEntrySize": "1"},
        "compression",
        "'subEntrySize'",
    ),
    (
        "key-routing-with-partitioner",
        "sink",
        {"routingStrategy": "key", "partitionerClass": "a.B"},
        "partitionerClass",
        None,
    ),
    ("custom-routing-alone", "sink", {"routingStrategy": "custom"}, "partitionerClass", "'routingStrategy'"),
    ("same-option-twice", "sink", {"batchSize": "10", "BATCHSIZE": "20"}, "batchSize", "more than once"),
    ("same-stream-twice", "batch", {"STREAM": "other"}, "stream", "more than once"),
    # --- offsets JSON
    (
        "json-duplicate-key",
        "batch",
        {"startingOffsets": '{"orders": 5, "orders": -7}'},
        "startingOffsets",
        "names stream 'orders' twice (5 and -7)",
    ),
    ("json-array", "source", {"startingOffsets": "[1, 2]"}, "startingOffsets", None),
    ("json-empty-stream-name", "streaming", {**SS, "startingOffsets": '{"": 3}'}, "startingOffsets", "empty"),
    (
        "json-beyond-long",
        "batch",
        {"startingOffsets": '{"orders": 9223372036854775808}'},
        "startingOffsets",
        None,
    ),
    (
        "json-null-offset",
        "streaming",
        {"startingOffsets": '{"orders": null}'},
        "startingOffsets",
        "non-integer",
    ),
    ("json-float-offset", "batch", {"startingOffsets": '{"orders": 1e3}'}, "startingOffsets", "non-integer"),
    (
        "json-string-sentinel",
        "batch",
        {"endingOffsets": '{"orders": "latest"}'},
        "endingOffsets",
        "non-integer",
    ),
    ("json-missing-value", "batch", {"endingOffsets": '{"orders":}'}, "endingOffsets", "not valid JSON"),
    (
        "json-other-stream",
        "batch",
        {"endingOffsets": '{"orders": 5, "payments": 6}'},
        "endingOffsets",
        "'payments'",
    ),
    (
        "json-nested",
        "streaming",
        {**SS, "startingOffsets": '{"orders-0": {"offset": 1}}'},
        "startingOffsets",
        None,
    ),
    ("starting-keyword-typo", "source", {"startingOffsets": "offsets"}, "startingOffsets", "earliest"),
    ("ending-keyword-timestamp", "batch", {"endingOffsets": "timestamp"}, "endingOffsets", "latest"),
    # --- URIs and endpoints
    (
        "uri-amqp-scheme",
        "source",
        {"uris": f"amqp://guest:{SECRET}@localhost:5672"},
        "uris",
        "rabbitmq-stream",
    ),
    ("uri-no-host", "sink", {"uris": "rabbitmq-stream://"}, "uris", "host"),
    ("uri-bad-port", "source", {"uris": f"rabbitmq-stream://u:{SECRET}@h:abc"}, "uris", None),
    ("uri-port-zero", "sink", {"uris": "rabbitmq-stream://h:0"}, "uris", "1..65535"),
    (
        "uri-different-vhosts",
        "streaming",
        {"uris": "rabbitmq-stream://a:b@h1/v1,rabbitmq-stream://a:b@h2/v2"},
        "uris",
        "same credentials",
    ),
    ("uri-host-port-only", "batch", {"uris": "localhost:5552"}, "uris", None),
    ("uri-unclosed-ipv6", "sink", {"uris": "rabbitmq-stream://[::1"}, "uris", None),
    ("endpoint-two-ports", "source", {"endpoints": "host:5552:1"}, "endpoints", "[::1]:5552"),
    ("endpoint-empty-port", "sink", {"endpoints": "[::1]:"}, "endpoints", "65535"),
    ("endpoint-spaced-port", "streaming", {"endpoints": "h:12 3"}, "endpoints", None),
    ("endpoint-port-zero-ipv6", "batch", {"endpoints": "[::1]:0"}, "endpoints", None),
    ("no-address-at-all", "sink", {"endpoints": None}, "endpoints", "'uris'"),
    # --- metadataFields
    ("metadata-value-column", "batch", {"metadataFields": "value"}, "metadataFields", "'value'"),
    (
        "metadata-semicolons",
        "streaming",
        {"metadataFields": "properties;routing_key"},
        "metadataFields",
        None,
    ),
    ("metadata-offset", "source", {"metadataFields": "offset"}, "metadataFields", "routing_key"),
    ("metadata-dashes", "batch", {"metadataFields": "application-properties"}, "metadataFields", None),
    ("metadata-camel-case", "streaming", {"metadataFields": "applicationProperties"}, "metadataFields", None),
    # --- names, paths and classes
    ("consumer-name-multibyte-too-long", "streaming", {"consumerName": "é" * 129}, "consumerName", "256"),
    ("producer-name-empty", "sink", {"producerName": ""}, "producerName", "empty"),
    ("vhost-empty", "source", {"vhost": ""}, "vhost", "empty"),
    ("username-blank", "sink", {"username": "   "}, "username", "empty"),
    ("filter-values-empty", "streaming", {"filterValues": ""}, "filterValues", None),
    (
        "post-filter-trailing-dot",
        "source",
        {"filterPostFilterClass": "my.module."},
        "filterPostFilterClass",
        None,
    ),
    (
        "post-filter-digit-start",
        "batch",
        {"filterPostFilterClass": "1abc.Def"},
        "filterPostFilterClass",
        None,
    ),
    ("resolver-no-module", "sink", {"addressResolverClass": "Resolver"}, "addressResolverClass", None),
    (
        "partitioner-dash",
        "sink",
        {"routingStrategy": "custom", "partitionerClass": "my-mod.Part"},
        "partitionerClass",
        None,
    ),
    ("filter-path-properties-dot", "sink", {"filterValuePath": "properties."}, "filterValuePath", None),
    ("filter-path-no-key", "sink", {"filterValuePath": "application_properties"}, "filterValuePath", None),
    (
        "filter-path-annotations-dot",
        "sink",
        {"filterValuePath": "message_annotations."},
        "filterValuePath",
        None,
    ),
    # --- numbers above their upper bound: the message gives the valid range and the value
    (
        "upper-sub-entry",
        "sink",
        {"subEntrySize": "70000", "compression": "zstd"},
        "subEntrySize",
        "must be between 1 and 65535, got 70000",
    ),
    ("upper-batch-size", "sink", {"batchSize": "10001"}, "batchSize", "between 1 and 10000, got 10001"),
    ("upper-in-flight", "sink", {"maxInFlight": "1000001"}, "maxInFlight", "between 1 and 1000000"),
    (
        "upper-confirm-timeout",
        "sink",
        {"publisherConfirmTimeoutMs": "86400001"},
        "publisherConfirmTimeoutMs",
        "between 1 and 86400000",
    ),
    ("upper-enqueue-timeout", "sink", {"enqueueTimeoutMs": "86400001"}, "enqueueTimeoutMs", "between 0 and"),
    ("upper-queue-capacity", "source", {"queueCapacity": "10000001"}, "queueCapacity", "between 1 and"),
    (
        "upper-poll-timeout",
        "source",
        {"pollTimeoutMs": "86400001"},
        "pollTimeoutMs",
        "between 1 and 86400000",
    ),
    ("upper-max-wait", "source", {"maxWaitMs": "604800001"}, "maxWaitMs", "between 1 and 604800000"),
    ("upper-min-partitions", "batch", {"minPartitions": "100001"}, "minPartitions", "between 1 and 100000"),
    (
        "upper-max-records",
        "streaming",
        {"maxRecordsPerTrigger": "2147483648"},
        "maxRecordsPerTrigger",
        "between 1 and 2147483647",
    ),
    (
        "upper-max-bytes",
        "streaming",
        {"maxBytesPerTrigger": "1099511627777"},
        "maxBytesPerTrigger",
        "between 1 and 1099511627776",
    ),
    (
        "upper-message-size",
        "source",
        {"estimatedMessageSizeBytes": "1073741825"},
        "estimatedMessageSizeBytes",
        "between 1 and 1073741824",
    ),
    ("compression-unknown", "sink", {"compression": "GZIP2"}, "compression", "zstd"),
    ("routing-empty", "sink", {"routingStrategy": ""}, "routingStrategy", None),
]


def _params() -> list[object]:
    out: list[object] = []
    for case_id, where, extra, option, also in CASES:
        modes = {
            "batch": ["batch"],
            "streaming": ["streaming"],
            "source": ["batch", "streaming"],
            "sink": ["sink"],
        }
        for mode in modes[where]:
            out.append(pytest.param(mode, extra, option, also, id=f"{mode}-{case_id}"))
    return out


def _options(extra: Mapping[str, str | None]) -> dict[str, str]:
    merged: dict[str, str | None] = {**BASE, **extra}
    return {k: v for k, v in merged.items() if v is not None}


def _parse(mode: str, options: dict[str, str]) -> object:
    if mode == "sink":
        return parse_sink_options(options)
    return parse_source_options(options, streaming=mode == "streaming")


def test_the_table_is_broad_and_distinct() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    option_sets = {(c[1], tuple(sorted(_options(c[2]).items()))) for c in CASES}
    assert len(option_sets) == len(CASES) >= 50
    assert {c[1] for c in CASES} == {"batch", "streaming", "source", "sink"}


@pytest.mark.parametrize(("mode", "extra", "option", "also"), _params())
def test_bad_options_fail_fast_naming_the_option(
    mode: str, extra: Mapping[str, str | None], option: str, also: str | None
) -> None:
    with pytest.raises(ConfigurationError) as info:
        _parse(mode, _options(extra))
    err = info.value
    msg = str(err)
    assert isinstance(err, ValueError)  # ConfigurationError is a ValueError for plain-Python callers
    assert f"'{option}'" in msg, msg
    if also is not None:
        assert also in msg, msg
    assert SECRET not in msg and SECRET not in repr(err)
    assert err.__cause__ is None  # no chained pydantic/ValueError detail carrying input values


KNOWN = {n.lower() for n in (*KNOWN_SOURCE_OPTIONS, *KNOWN_SINK_OPTIONS, *REMOVED_OPTIONS)}


@pytest.mark.parametrize(("mode", "extra", "option", "also"), _params())
def test_lower_cased_keys_fail_the_same_way(
    mode: str, extra: Mapping[str, str | None], option: str, also: str | None
) -> None:
    """Spark hands a data source lower-cased keys: messages still use the camelCase name."""
    options = _options(extra)
    lowered = {k.lower(): v for k, v in options.items()}
    if len(lowered) < len(options):
        pytest.skip("the case is about keys that differ only in case")
    with pytest.raises(ConfigurationError) as info:
        _parse(mode, lowered)
    msg = str(info.value)
    # A known option is named as users type it; an unknown one can only be named as given.
    assert f"'{option if option.lower() in KNOWN else option.lower()}'" in msg, msg


# Options some integer options need beside them, and where each is valid.
_INTEGER_CONTEXT: dict[str, tuple[str, dict[str, str]]] = {
    "startingOffset": ("batch", {"startingOffsets": "offset"}),
    "startingTimestamp": ("batch", {"startingOffsets": "timestamp"}),
    "endingOffset": ("batch", {"endingOffsets": "offset", "startingOffsets": "earliest"}),
    "maxRecordsPerTrigger": ("streaming", {}),
    "maxBytesPerTrigger": ("streaming", {}),
    "subEntrySize": ("sink", {}),
    **{
        n: ("sink", {}) for n in ("publisherConfirmTimeoutMs", "maxInFlight", "enqueueTimeoutMs", "batchSize")
    },
}


@pytest.mark.parametrize("option", sorted(INTEGER_BOUNDS))
def test_every_integer_option_is_bounded_on_both_sides(option: str) -> None:
    """Each integer option accepts exactly its documented range; outside it, the message gives it."""
    lo, hi = INTEGER_BOUNDS[option]
    mode, context = _INTEGER_CONTEXT.get(option, ("batch", {}))
    for inside in (lo, hi):
        _parse(mode, {**BASE, **context, option: str(inside)})
    for outside in (lo - 1, hi + 1):
        with pytest.raises(ConfigurationError) as info:
            _parse(mode, {**BASE, **context, option: str(outside)})
        msg = str(info.value)
        if outside > hi or hi < 2**63 - 1:
            assert f"option '{option}' must be between {lo} and {hi}, got {outside}" in msg
        else:
            assert f"option '{option}' must be >= {lo}, got {outside}" in msg


def test_the_models_enforce_the_same_bounds() -> None:
    """Options built directly (not parsed from strings) are held to the same range."""
    sink = parse_sink_options({**BASE})
    with pytest.raises(ValueError, match="less than or equal to 65535"):
        type(sink).model_validate({**sink.model_dump(), "sub_entry_size": 65536})
