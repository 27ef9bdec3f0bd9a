"""Unit tests of option parsing (pyspark_rmqs.options): defaults, rules, and their error messages."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

import pyspark_rmqs
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.redact import SECRET_OPTIONS
from pyspark_rmqs.options import (
    INTEGER_BOUNDS,
    KNOWN_SINK_OPTIONS,
    KNOWN_SOURCE_OPTIONS,
    METADATA_FIELDS,
    ConnectionOptions,
    SinkOptions,
    SourceOptions,
    parse_connection_options,
    parse_sink_options,
    parse_source_options,
)
from pyspark_rmqs.options.fields import OptionModel, bounds, plain_type

SECRET = "s3cr3t-pw"
BASE = {"endpoints": "localhost:5552", "stream": "orders"}


def source(streaming: bool = False, **extra: str) -> SourceOptions:
    return parse_source_options({**BASE, **extra}, streaming=streaming)


def sink(**extra: str) -> SinkOptions:
    return parse_sink_options({**BASE, **extra})


def source_error(options: dict[str, str], streaming: bool = False) -> str:
    with pytest.raises(ConfigurationError) as info:
        parse_source_options(options, streaming=streaming)
    return str(info.value)


def sink_error(options: dict[str, str]) -> str:
    with pytest.raises(ConfigurationError) as info:
        parse_sink_options(options)
    return str(info.value)


def connection_error(options: dict[str, str]) -> str:
    with pytest.raises(ConfigurationError) as info:
        parse_connection_options(options)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# Exports
# --------------------------------------------------------------------------------------------


def test_metadata_fields_constant() -> None:
    assert METADATA_FIELDS == (
        "properties",
        "application_properties",
        "message_annotations",
        "creation_time",
        "routing_key",
    )


def test_known_option_lists_are_camel_case_names() -> None:
    for name in ("endpoints", "tls.truststorePassword", "startingOffsets", "strictDecoding", "stream"):
        assert name in KNOWN_SOURCE_OPTIONS
    for name in ("producerName", "filterValuePath", "ignoreUnknownColumns", "tls.caFile", "superstream"):
        assert name in KNOWN_SINK_OPTIONS
    assert "producerName" not in KNOWN_SOURCE_OPTIONS
    assert "startingOffsets" not in KNOWN_SINK_OPTIONS
    assert "filterValueColumn" not in KNOWN_SINK_OPTIONS
    assert len(set(KNOWN_SOURCE_OPTIONS)) == len(KNOWN_SOURCE_OPTIONS)
    assert len(set(KNOWN_SINK_OPTIONS)) == len(KNOWN_SINK_OPTIONS)


def test_option_names_mapping_covers_every_field() -> None:
    for model in (ConnectionOptions, SourceOptions, SinkOptions):
        fields = set(model.model_fields) - {"connection", "streaming"}
        assert fields <= set(model.OPTION_NAMES), model
    assert SourceOptions.OPTION_NAMES["starting_offsets"] == "startingOffsets"
    assert ConnectionOptions.OPTION_NAMES["tls_trust_all"] == "tls.trustAll"
    assert SinkOptions.OPTION_NAMES["max_in_flight"] == "maxInFlight"


# --------------------------------------------------------------------------------------------
# The option table: each option declared once
# --------------------------------------------------------------------------------------------

MODELS = (ConnectionOptions, SourceOptions, SinkOptions)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_option_field_is_fully_declared(model: type[OptionModel]) -> None:
    """Each option: an alias, a doc line, and for an integer both bounds (the docs render them)."""
    for name, info in model.option_fields().items():
        assert info.description and "\n" not in info.description, name
        if plain_type(info) is int:
            assert name in INTEGER_BOUNDS and bounds(info) == INTEGER_BOUNDS[name], name


def test_each_option_name_belongs_to_one_table_per_side() -> None:
    connection = set(ConnectionOptions.option_fields())
    assert not connection & set(SourceOptions.option_fields())
    assert not connection & set(SinkOptions.option_fields())
    assert set(KNOWN_SOURCE_OPTIONS) == connection | set(SourceOptions.option_fields())
    assert set(KNOWN_SINK_OPTIONS) == connection | set(SinkOptions.option_fields())


def test_alias_and_default_come_from_the_table() -> None:
    assert SourceOptions.alias("fail_on_data_loss") == "failOnDataLoss"
    assert ConnectionOptions.alias("tls_ca_file") == "tls.caFile"
    assert SourceOptions.default("poll_timeout_ms") == 30000
    assert SinkOptions.default("routing_strategy") == "hash"
    with pytest.raises(KeyError):
        SourceOptions.alias("failOnDataLoss")  # a field name, never the option name


def test_the_broker_settings_defaults_are_the_options_defaults() -> None:
    from pyspark_rmqs.broker.reader import ReadSettings
    from pyspark_rmqs.broker.writer import WriteSettings

    read, parsed = ReadSettings(), source()
    assert ReadSettings(**parsed.reader_settings()) == ReadSettings(metadata_fields=parsed.metadata_fields)
    assert (read.poll_timeout_ms, read.max_wait_ms, read.strict) == (30000, 300000, False)
    write, opts = WriteSettings(), sink()
    assert (write.confirm_timeout_ms, write.max_in_flight, write.enqueue_timeout_ms) == (
        opts.publisher_confirm_timeout_ms,
        opts.max_in_flight,
        opts.enqueue_timeout_ms,
    )
    assert (write.batch_size, write.compression, write.sub_entry_size, write.routing_strategy) == (
        opts.batch_size,
        opts.compression,
        opts.sub_entry_size,
        opts.routing_strategy,
    )


def test_secret_options_are_the_secret_fields() -> None:
    """redact.py sits below the options (it cannot import them): its list must match the table."""
    secret = {
        name for name, info in ConnectionOptions.option_fields().items() if plain_type(info) is SecretStr
    }
    assert secret == set(SECRET_OPTIONS)


# Literal option names still allowed outside pyspark_rmqs/options, each with its reason.
_LITERAL_OPTION_NAMES_ALLOWED = {
    ("redact.py", "tls.truststorePassword"),  # below options in the layering; checked just above
    ("redact.py", "tls.keystorePassword"),
    ("offsets.py", "startingOffsets"),  # offsets_from_json's default label for its errors
    ("routing.py", "partitionerClass"),  # broker/routing.py, being restructured: not yet on the table
}


def test_no_option_name_is_written_outside_the_options_package() -> None:
    """Code that passes or looks up an option uses `Model.alias(field)`: a typo fails at once."""
    names = {n for n in (*KNOWN_SOURCE_OPTIONS, *KNOWN_SINK_OPTIONS) if n != n.lower() or "." in n}
    root = Path(pyspark_rmqs.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        if "options" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.add((path.name, node.value))
    assert found <= _LITERAL_OPTION_NAMES_ALLOWED


# --------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------


def test_connection_defaults() -> None:
    c = parse_connection_options({"endpoints": "localhost"})
    assert c.endpoints == [("localhost", 5552)]
    assert c.uris == []
    assert c.username == "guest"
    assert c.password.get_secret_value() == "guest"
    assert c.vhost == "/"
    assert c.tls is False
    assert c.tls_trust_all is False
    assert c.tls_truststore is None and c.tls_truststore_password is None
    assert c.tls_keystore is None and c.tls_keystore_password is None
    assert c.tls_ca_file is None and c.tls_cert_file is None and c.tls_key_file is None
    assert c.address_resolver_class is None
    assert c.addresses() == [("localhost", 5552)]


def test_batch_source_defaults() -> None:
    o = source()
    assert o.streaming is False
    assert o.stream == "orders" and o.superstream is None
    assert o.name == "orders" and o.is_super_stream is False
    assert o.consumer_name is None
    assert o.metadata_fields == METADATA_FIELDS
    assert o.fail_on_data_loss is True
    assert o.starting_offsets == "earliest"
    assert o.starting_offset is None and o.starting_timestamp is None and o.starting_offsets_json is None
    assert o.ending_offsets == "latest"
    assert o.ending_offset is None and o.ending_offsets_json is None
    assert o.max_records_per_trigger is None
    assert o.max_bytes_per_trigger is None
    assert o.min_partitions is None
    assert o.server_side_offset_tracking is False
    assert o.filter_values is None
    assert o.filter_match_unfiltered is False
    assert o.filter_post_filter_class is None
    assert o.poll_timeout_ms == 30000
    assert o.max_wait_ms == 300000
    assert o.initial_credits == 0  # adaptive
    assert o.queue_capacity == 10000
    assert o.estimated_message_size_bytes == 1024
    assert o.strict_decoding is False


def test_streaming_source_defaults() -> None:
    o = source(streaming=True)
    assert o.streaming is True
    assert o.server_side_offset_tracking is False  # no consumerName: nothing to store offsets under
    assert source(streaming=True, consumerName="etl").server_side_offset_tracking is True
    assert o.ending_offsets is None
    assert o.starting_offsets == "earliest"


@pytest.mark.parametrize(("streaming", "value", "expected"), [(True, "false", False), (False, "TRUE", True)])
def test_server_side_offset_tracking_can_be_overridden(streaming: bool, value: str, expected: bool) -> None:
    o = source(streaming, consumerName="etl", serverSideOffsetTracking=value)
    assert o.server_side_offset_tracking is expected


@pytest.mark.parametrize("streaming", [True, False])
def test_server_side_offset_tracking_true_needs_a_consumer_name(streaming: bool) -> None:
    with pytest.raises(ConfigurationError) as e:
        source(streaming, serverSideOffsetTracking="true")
    assert str(e.value) == (
        "option 'serverSideOffsetTracking'=true stores offsets under option 'consumerName', which is "
        "not set: set consumerName to a stable name (or drop serverSideOffsetTracking)"
    )
    assert source(streaming, serverSideOffsetTracking="false").server_side_offset_tracking is False


def test_sink_defaults() -> None:
    o = sink()
    assert o.stream == "orders" and o.superstream is None and o.name == "orders"
    assert o.is_super_stream is False
    assert o.producer_name is None
    assert o.publisher_confirm_timeout_ms == 30000
    assert o.max_in_flight == 10000
    assert o.enqueue_timeout_ms == 10000
    assert o.batch_size == 500
    assert o.compression == "none"
    assert o.sub_entry_size == 1
    assert o.routing_strategy == "hash"
    assert o.partitioner_class is None
    assert o.filter_value_path is None
    assert o.ignore_unknown_columns is False


def test_models_are_frozen_and_picklable() -> None:
    o = source(password=SECRET)
    with pytest.raises(ValueError):
        o.stream = "other"  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(o))
    assert again == o
    assert again.connection.password.get_secret_value() == SECRET


# --------------------------------------------------------------------------------------------
# Keys: case-insensitivity, unknown, ignored, removed
# --------------------------------------------------------------------------------------------


def test_lookup_is_case_insensitive() -> None:
    o = parse_source_options(
        {
            "ENDPOINTS": "h:1",
            "Stream": "s",
            "STARTINGOFFSETS": "offset",
            "startingoffset": "7",
            "MaxRecordsPerTrigger": "10",
            "TLS": "true",
            "TLS.TRUSTALL": "True",
        },
        streaming=True,
    )
    assert o.starting_offsets == "offset" and o.starting_offset == 7
    assert o.max_records_per_trigger == 10
    assert o.connection.tls is True and o.connection.tls_trust_all is True
    assert o.stream == "s"


def test_lowercased_keys_as_spark_passes_them() -> None:
    options = {
        k.lower(): v for k, v in {**BASE, "consumerName": "c", "filterMatchUnfiltered": "true"}.items()
    }
    o = parse_source_options(options, streaming=True)
    assert o.consumer_name == "c" and o.filter_match_unfiltered is True


def test_same_key_twice_with_different_values_fails() -> None:
    msg = source_error({**BASE, "maxWaitMs": "1", "MAXWAITMS": "2"})
    assert "maxWaitMs" in msg and "more than once" in msg


def test_same_key_twice_with_same_value_is_fine() -> None:
    assert source(maxWaitMs="5", MAXWAITMS="5").max_wait_ms == 5


def test_unknown_option_suggests_closest_name() -> None:
    msg = source_error({**BASE, "startingOffsetz": "earliest"})
    assert msg == "unknown option 'startingOffsetz'; did you mean 'startingOffsets'?"


def test_starting_offset_singular_is_a_real_option() -> None:
    assert "startingOffset" in KNOWN_SOURCE_OPTIONS
    assert source(startingOffsets="offset", startingOffset="3").starting_offset == 3


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("maxRecordPerTrigger", "maxRecordsPerTrigger"),
        ("endpoint", "endpoints"),
        ("consumername_", "consumerName"),
    ],
)
def test_did_you_mean_source(typo: str, suggestion: str) -> None:
    assert f"did you mean '{suggestion}'?" in source_error({**BASE, typo: "1"})


def test_did_you_mean_sink() -> None:
    assert "did you mean 'producerName'?" in sink_error({**BASE, "producerNme": "p"})


def test_unknown_option_without_close_match_lists_valid_options() -> None:
    msg = source_error({**BASE, "zzzz": "1"})
    assert "unknown option 'zzzz'" in msg and "startingOffsets" in msg and "endpoints" in msg


def test_sink_option_on_source_is_rejected_with_explanation() -> None:
    msg = source_error({**BASE, "producerName": "p"})
    assert "producerName" in msg and "sink" in msg


def test_source_option_on_sink_is_rejected_with_explanation() -> None:
    msg = sink_error({**BASE, "startingOffsets": "earliest"})
    assert "startingOffsets" in msg and "source" in msg


def test_spark_and_path_keys_are_ignored() -> None:
    o = source(path="/tmp/x", **{"spark.sql.foo": "bar", "SPARK.other": "1", "paths": "[]"})
    assert o.stream == "orders"
    assert sink(path="x", **{"spark.x": "y"}).stream == "orders"


def test_none_values_are_treated_as_absent() -> None:
    o = parse_source_options({**BASE, "consumerName": None}, streaming=False)  # type: ignore[dict-item]
    assert o.consumer_name is None


def test_non_string_values_are_accepted() -> None:
    o = parse_source_options({**BASE, "maxWaitMs": 5, "failOnDataLoss": False}, streaming=False)  # type: ignore[dict-item]
    assert o.max_wait_ms == 5 and o.fail_on_data_loss is False


@pytest.mark.parametrize("key", ["filterValueColumn", "FILTERVALUECOLUMN"])
def test_removed_filter_value_column_on_source_and_sink(key: str) -> None:
    for msg in (source_error({**BASE, key: "region"}), sink_error({**BASE, key: "region"})):
        assert "filterValueColumn" in msg and "removed" in msg and "filterValuePath" in msg


def test_removed_filter_post_filter_class_v2() -> None:
    msg = source_error({**BASE, "filterPostFilterClassV2": "a.B"})
    assert "filterPostFilterClassV2" in msg and "removed" in msg and "'filterPostFilterClass'" in msg
    assert "removed" in sink_error({**BASE, "filterPostFilterClassV2": "a.B"})


# --------------------------------------------------------------------------------------------
# Value types
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["true", "TRUE", "True", " true "])
def test_boolean_true_spellings(value: str) -> None:
    assert source(strictDecoding=value).strict_decoding is True


@pytest.mark.parametrize("value", ["yes", "1", "on", "", "t"])
def test_boolean_rejects_other_values(value: str) -> None:
    msg = source_error({**BASE, "failOnDataLoss": value})
    assert "failOnDataLoss" in msg and "'true'" in msg and "'false'" in msg


@pytest.mark.parametrize(
    ("option", "value", "range_text"),
    [
        ("maxRecordsPerTrigger", "0", "between 1 and "),
        ("maxRecordsPerTrigger", "abc", "between 1 and "),
        ("maxBytesPerTrigger", "-5", "between 1 and "),
        ("minPartitions", "1.5", "between 1 and "),
        ("pollTimeoutMs", "0", "between 1 and "),
        ("maxWaitMs", "1_000", "between 1 and "),
        ("initialCredits", "-1", "between 0 and 1000"),
        ("initialCredits", "1001", "between 0 and 1000"),
        ("queueCapacity", "0", "between 1 and "),
        ("estimatedMessageSizeBytes", "", "between 1 and "),
        ("startingOffset", "-1", ">= 0"),
        ("startingTimestamp", "yesterday", ">= 0"),
    ],
)
def test_source_integer_ranges(option: str, value: str, range_text: str) -> None:
    extra = {option: value}
    if option == "startingOffset":
        extra["startingOffsets"] = "offset"
    if option == "startingTimestamp":
        extra["startingOffsets"] = "timestamp"
    msg = source_error({**BASE, **extra})
    assert f"'{option}'" in msg and range_text in msg


def test_integer_above_long_range() -> None:
    msg = source_error({**BASE, "maxRecordsPerTrigger": str(2**63)})
    assert "option 'maxRecordsPerTrigger' must be between 1 and 2147483647, got 9223372036854775808" in msg
    msg = source_error({**BASE, "startingOffsets": "offset", "startingOffset": str(2**63)})
    assert "option 'startingOffset' must be between 0 and 9223372036854775807" in msg


def test_source_integer_values_parse() -> None:
    o = source(
        maxRecordsPerTrigger="100",
        maxBytesPerTrigger="2048",
        minPartitions="4",
        pollTimeoutMs="1",
        maxWaitMs=" 20 ",
        initialCredits="1000",
        queueCapacity="5",
        estimatedMessageSizeBytes="64",
    )
    assert (o.max_records_per_trigger, o.max_bytes_per_trigger, o.min_partitions) == (100, 2048, 4)
    assert (o.poll_timeout_ms, o.max_wait_ms, o.initial_credits) == (1, 20, 1000)
    assert (o.queue_capacity, o.estimated_message_size_bytes) == (5, 64)


@pytest.mark.parametrize(
    ("option", "value", "range_text"),
    [
        ("maxInFlight", "0", "between 1 and "),
        ("enqueueTimeoutMs", "-1", "between 0 and "),
        ("batchSize", "0", "between 1 and "),
        ("subEntrySize", "0", "between 1 and "),
        ("publisherConfirmTimeoutMs", "0", "between 1 and "),
        ("batchSize", "ten", "between 1 and "),
    ],
)
def test_sink_integer_ranges(option: str, value: str, range_text: str) -> None:
    msg = sink_error({**BASE, option: value})
    assert f"'{option}'" in msg and range_text in msg


def test_enqueue_timeout_zero_is_allowed() -> None:
    assert sink(enqueueTimeoutMs="0").enqueue_timeout_ms == 0


@pytest.mark.parametrize("option", ["consumerName", "stream", "vhost", "username"])
def test_empty_strings_are_rejected(option: str) -> None:
    msg = source_error({**BASE, option: "  "})
    assert f"'{option}'" in msg and "empty" in msg


def test_reference_names_limited_to_256_bytes() -> None:
    assert "consumerName" in source_error({**BASE, "consumerName": "x" * 257})
    assert "producerName" in sink_error({**BASE, "producerName": "x" * 257})
    assert source(consumerName="x" * 256).consumer_name == "x" * 256


# --------------------------------------------------------------------------------------------
# Connection
# --------------------------------------------------------------------------------------------


def test_endpoints_parsing() -> None:
    c = parse_connection_options({"endpoints": "a:1, b ,[::1]:7,[fe80::1]"})
    assert c.endpoints == [("a", 1), ("b", 5552), ("::1", 7), ("fe80::1", 5552)]
    assert c.addresses() == c.endpoints


@pytest.mark.parametrize("value", ["a:0", "a:65536", "a:x", ":5552", "::1:5552", "[::1", "[::1]x"])
def test_bad_endpoints(value: str) -> None:
    msg = connection_error({"endpoints": value})
    assert "'endpoints'" in msg


def test_endpoint_port_error_names_range() -> None:
    assert "between 1 and 65535" in connection_error({"endpoints": "a:70000"})


def test_endpoints_or_uris_required() -> None:
    for msg in (
        connection_error({}),
        connection_error({"username": "u"}),
        source_error({"stream": "s"}),
        sink_error({"stream": "s", "endpoints": " , "}),
    ):
        assert "'endpoints'" in msg and "'uris'" in msg


def test_uris_parsing_and_credentials() -> None:
    c = parse_connection_options(
        {
            "uris": "rabbitmq-stream://alice:p%40ss@h1:6000/my%2Fvhost,rabbitmq-stream://alice:p%40ss@h2/my%2Fvhost"
        }
    )
    assert c.addresses() == [("h1", 6000), ("h2", 5552)]
    assert c.username == "alice"
    assert c.password.get_secret_value() == "p@ss"
    assert c.vhost == "my/vhost"
    assert c.tls is False
    assert c.uris == ["rabbitmq-stream://alice@h1:6000/my%2Fvhost", "rabbitmq-stream://alice@h2/my%2Fvhost"]


def test_uris_without_credentials_use_options() -> None:
    c = parse_connection_options(
        {"uris": "rabbitmq-stream://h", "username": "bob", "password": "pw", "vhost": "v"}
    )
    assert (c.username, c.password.get_secret_value(), c.vhost) == ("bob", "pw", "v")
    assert c.addresses() == [("h", 5552)]


def test_uri_default_vhost_encoded_slash() -> None:
    assert parse_connection_options({"uris": "rabbitmq-stream://u:p@h:5552/%2F"}).vhost == "/"


def test_uris_win_over_endpoints() -> None:
    c = parse_connection_options({"endpoints": "e1:1", "uris": "rabbitmq-stream://u:p@u1:2"})
    assert c.addresses() == [("u1", 2)]
    assert c.endpoints == [("e1", 1)]
    o = source(uris="rabbitmq-stream://u:p@u1:2")
    assert o.connection.addresses() == [("u1", 2)]


def test_tls_uri_implies_tls() -> None:
    c = parse_connection_options({"uris": "rabbitmq-stream+tls://u:p@h"})
    assert c.tls is True
    assert c.addresses() == [("h", 5551)]
    c2 = parse_connection_options({"uris": "RABBITMQ-STREAM+TLS://u:p@h:5553", "tls.trustAll": "true"})
    assert c2.tls is True and c2.tls_trust_all is True and c2.addresses() == [("h", 5553)]


def test_tls_false_conflicts_with_tls_uri() -> None:
    msg = connection_error({"uris": "rabbitmq-stream+tls://h", "tls": "false"})
    assert "'tls'" in msg and "'uris'" in msg


def test_endpoints_default_port_with_tls() -> None:
    assert parse_connection_options({"endpoints": "h", "tls": "true"}).endpoints == [("h", 5551)]


@pytest.mark.parametrize(
    "uri",
    ["http://u:s3cr3t-pw@h", "rabbitmq-stream://u:s3cr3t-pw@:5552", "rabbitmq-stream://u:s3cr3t-pw@h:99999"],
)
def test_bad_uri_errors_hide_password(uri: str) -> None:
    msg = connection_error({"uris": uri})
    assert "'uris'" in msg and "rabbitmq-stream" in msg
    assert SECRET not in msg


def test_uris_mixing_schemes_or_credentials_fail() -> None:
    assert "'uris'" in connection_error({"uris": "rabbitmq-stream://h1,rabbitmq-stream+tls://h2"})
    msg = connection_error({"uris": f"rabbitmq-stream://a:{SECRET}@h1,rabbitmq-stream://b:x@h2"})
    assert "'uris'" in msg and SECRET not in msg


def test_tls_options_parse() -> None:
    c = parse_connection_options(
        {
            "endpoints": "h",
            "tls": "true",
            "tls.truststore": "/t.jks",
            "tls.truststorePassword": "tp",
            "tls.keystore": "/k.jks",
            "tls.keystorePassword": "kp",
            "tls.caFile": "/ca.pem",
            "tls.certFile": "/c.pem",
            "tls.keyFile": "/k.pem",
        }
    )
    assert c.tls_truststore == "/t.jks" and c.tls_keystore == "/k.jks"
    assert c.tls_truststore_password is not None and c.tls_truststore_password.get_secret_value() == "tp"
    assert c.tls_keystore_password is not None and c.tls_keystore_password.get_secret_value() == "kp"
    assert (c.tls_ca_file, c.tls_cert_file, c.tls_key_file) == ("/ca.pem", "/c.pem", "/k.pem")
    assert "tp" not in repr(c).replace("tls_", "") and "'kp'" not in repr(c)


@pytest.mark.parametrize("option", ["tls.caFile", "tls.truststore", "tls.certFile"])
def test_tls_file_options_need_tls(option: str) -> None:
    msg = connection_error({"endpoints": "h", option: "/x.pem"})
    assert f"'{option}'" in msg and "'tls'" in msg


def test_trust_all_false_without_tls_is_fine() -> None:
    assert parse_connection_options({"endpoints": "h", "tls.trustAll": "false"}).tls is False


def test_store_password_without_store_fails_and_hides_it() -> None:
    msg = connection_error({"endpoints": "h", "tls": "true", "tls.keystorePassword": SECRET})
    assert "'tls.keystorePassword'" in msg and "'tls.keystore'" in msg and SECRET not in msg


def test_key_file_needs_cert_file() -> None:
    msg = connection_error({"endpoints": "h", "tls": "true", "tls.keyFile": "/k.pem"})
    assert "'tls.keyFile'" in msg and "'tls.certFile'" in msg


def test_address_resolver_class() -> None:
    c = parse_connection_options({"endpoints": "h", "addressResolverClass": "my.mod.Resolver"})
    assert c.address_resolver_class == "my.mod.Resolver"
    msg = connection_error({"endpoints": "h", "addressResolverClass": "not a class"})
    assert "'addressResolverClass'" in msg and "package.module.ClassName" in msg


def test_connection_parser_accepts_only_connection_keys_and_ignores_known_others() -> None:
    c = parse_connection_options({"endpoints": "h", "stream": "s", "producerName": "p", "path": "x"})
    assert c.endpoints == [("h", 5552)]
    assert "did you mean 'endpoints'?" in connection_error({"endpoint": "h"})


def test_cache_key_includes_secrets_and_is_hashable() -> None:
    a = parse_connection_options({"endpoints": "h", "password": "one"})
    b = parse_connection_options({"endpoints": "h", "password": "two"})
    a2 = parse_connection_options({"ENDPOINTS": "h", "PASSWORD": "one"})
    assert hash(a.cache_key()) == hash(a2.cache_key())
    assert a.cache_key() == a2.cache_key()
    assert a.cache_key() != b.cache_key()
    assert "one" in a.cache_key()
    assert {a.cache_key(): 1}[a2.cache_key()] == 1


# --------------------------------------------------------------------------------------------
# Secrets never shown
# --------------------------------------------------------------------------------------------


def test_repr_and_str_hide_secrets() -> None:
    o = parse_source_options(
        {
            "uris": f"rabbitmq-stream+tls://user:{SECRET}@h:5551/v",
            "stream": "s",
            "tls.truststore": "/t.jks",
            "tls.truststorePassword": SECRET + "-t",
            "tls.keystore": "/k.jks",
            "tls.keystorePassword": SECRET + "-k",
        },
        streaming=True,
    )
    for text in (repr(o), str(o), repr(o.connection), str(o.connection), o.model_dump_json()):
        assert SECRET not in text
    assert o.connection.password.get_secret_value() == SECRET
    s = parse_sink_options({"endpoints": "h", "stream": "s", "password": SECRET})
    assert SECRET not in repr(s) and SECRET not in str(s)


@pytest.mark.parametrize(
    "bad",
    [
        {"maxWaitMs": "x"},
        {"startingOffsets": "sometime"},
        {"unknownThing": "1"},
        {"superstream": "also"},
        {"tls.caFile": "/ca.pem"},
        {"filterValueColumn": "c"},
        {"tls": "maybe"},
    ],
)
def test_password_not_in_errors_elsewhere(bad: dict[str, str]) -> None:
    msg = source_error({**BASE, "password": SECRET, **bad})
    assert SECRET not in msg


def test_password_not_in_sink_errors() -> None:
    msg = sink_error({**BASE, "password": SECRET, "compression": "gzip"})
    assert SECRET not in msg


def test_error_has_no_cause_chain_leaking_secrets() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_connection_options({"uris": f"rabbitmq-stream://u:{SECRET}@h:notaport"})
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert SECRET not in str(info.value)


# --------------------------------------------------------------------------------------------
# Source: stream / superstream
# --------------------------------------------------------------------------------------------


def test_superstream_source() -> None:
    o = parse_source_options({"endpoints": "h", "superstream": "invoices"}, streaming=True)
    assert o.is_super_stream is True and o.name == "invoices" and o.stream is None


@pytest.mark.parametrize(
    "options", [{"endpoints": "h"}, {"endpoints": "h", "stream": "a", "superstream": "b"}]
)
def test_exactly_one_of_stream_superstream(options: dict[str, str]) -> None:
    for msg in (source_error(options), sink_error(options)):
        assert "'stream'" in msg and "'superstream'" in msg and "exactly one" in msg


# --------------------------------------------------------------------------------------------
# Source: metadataFields
# --------------------------------------------------------------------------------------------


def test_metadata_fields_subset_in_canonical_order() -> None:
    o = source(metadataFields="routing_key, PROPERTIES,routing_key")
    assert o.metadata_fields == ("properties", "routing_key")


def test_metadata_fields_empty_means_none() -> None:
    assert source(metadataFields="").metadata_fields == ()


def test_metadata_fields_unknown_lists_valid() -> None:
    msg = source_error({**BASE, "metadataFields": "properties,headers"})
    assert "metadataFields" in msg and "'headers'" in msg
    for field in METADATA_FIELDS:
        assert field in msg


# --------------------------------------------------------------------------------------------
# Source: starting / ending offsets
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["earliest", "latest", "LATEST"])
def test_starting_offsets_keywords(value: str) -> None:
    assert source(startingOffsets=value).starting_offsets == value.lower()


def test_starting_offsets_offset() -> None:
    o = source(startingOffsets="offset", startingOffset="0")
    assert o.starting_offsets == "offset" and o.starting_offset == 0


def test_starting_offsets_offset_requires_offset() -> None:
    msg = source_error({**BASE, "startingOffsets": "offset"})
    assert "'startingOffset'" in msg and ">= 0" in msg and "startingOffsets=offset" in msg


def test_starting_offsets_timestamp() -> None:
    o = source(True, startingOffsets="timestamp", startingTimestamp="1700000000000")
    assert o.starting_offsets == "timestamp" and o.starting_timestamp == 1700000000000


def test_starting_offsets_timestamp_requires_timestamp() -> None:
    msg = source_error({**BASE, "startingOffsets": "timestamp"})
    assert "'startingTimestamp'" in msg and "startingOffsets=timestamp" in msg


def test_starting_offset_without_offset_mode_fails() -> None:
    msg = source_error({**BASE, "startingOffset": "5"})
    assert "'startingOffset'" in msg and "startingOffsets=offset" in msg
    msg = source_error({**BASE, "startingOffsets": "latest", "startingTimestamp": "5"})
    assert "'startingTimestamp'" in msg and "startingOffsets=timestamp" in msg


def test_starting_offsets_invalid_lists_values() -> None:
    msg = source_error({**BASE, "startingOffsets": "beginning"})
    assert "'startingOffsets'" in msg
    for value in ("earliest", "latest", "offset", "timestamp", "JSON"):
        assert value in msg


def test_starting_offsets_json() -> None:
    o = parse_source_options(
        {"endpoints": "h", "superstream": "orders", "startingOffsets": '{"orders-0": 1200, "orders-1": -2}'},
        streaming=True,
    )
    assert o.starting_offsets == "json"
    assert o.starting_offsets_json == {"orders-0": 1200, "orders-1": -2}


@pytest.mark.parametrize(
    "value",
    [
        '{"orders": -3}',
        '{"orders": 1.5}',
        '{"orders": true}',
        '{"orders": "1"}',
        "{}",
        '{"orders": 1',
        "{bad}",
    ],
)
def test_starting_offsets_json_invalid(value: str) -> None:
    msg = source_error({**BASE, "startingOffsets": value})
    assert "'startingOffsets'" in msg
    assert "JSON" in msg or "-2 (earliest)" in msg


def test_starting_offsets_json_for_single_stream_must_name_it() -> None:
    msg = source_error({**BASE, "startingOffsets": '{"other": 1}'})
    assert "'startingOffsets'" in msg and "'other'" in msg and "'orders'" in msg
    assert source(startingOffsets='{"orders": 5}').starting_offsets_json == {"orders": 5}


def test_ending_offsets_variants() -> None:
    assert source(endingOffsets="latest").ending_offsets == "latest"
    o = source(endingOffsets="offset", endingOffset="10")
    assert o.ending_offsets == "offset" and o.ending_offset == 10
    o = source(endingOffsets='{"orders": -1}')
    assert o.ending_offsets == "json" and o.ending_offsets_json == {"orders": -1}


def test_ending_offsets_invalid_values() -> None:
    msg = source_error({**BASE, "endingOffsets": "earliest"})
    assert "'endingOffsets'" in msg and "latest" in msg and "offset" in msg
    msg = source_error({**BASE, "endingOffsets": '{"orders": -2}'})
    assert "'endingOffsets'" in msg and "-1 (latest)" in msg
    msg = source_error({**BASE, "endingOffsets": "offset"})
    assert "'endingOffset'" in msg and "endingOffsets=offset" in msg
    msg = source_error({**BASE, "endingOffset": "3"})
    assert "'endingOffset'" in msg and "endingOffsets=offset" in msg


@pytest.mark.parametrize(("key", "value"), [("endingOffsets", "latest"), ("ENDINGOFFSET", "5")])
def test_ending_offsets_are_batch_only(key: str, value: str) -> None:
    msg = source_error({**BASE, key: value}, streaming=True)
    assert "batch-only" in msg and "endingOffset" in msg


def test_ending_before_starting_fails() -> None:
    msg = source_error(
        {
            **BASE,
            "startingOffsets": "offset",
            "startingOffset": "10",
            "endingOffsets": "offset",
            "endingOffset": "5",
        }
    )
    assert "'endingOffset'" in msg and "'startingOffset'" in msg
    msg = source_error({**BASE, "startingOffsets": '{"orders": 10}', "endingOffsets": '{"orders": 5}'})
    assert "'endingOffsets'" in msg and "'startingOffsets'" in msg
    o = source(startingOffsets="offset", startingOffset="5", endingOffsets="offset", endingOffset="5")
    assert o.starting_offset == o.ending_offset == 5


def test_validate_partitions() -> None:
    o = parse_source_options(
        {
            "endpoints": "h",
            "superstream": "orders",
            "startingOffsets": '{"orders-0": 1, "orders-9": 2}',
            "endingOffsets": '{"orders-1": 5}',
        },
        streaming=False,
    )
    with pytest.raises(ConfigurationError) as info:
        o.validate_partitions(["orders-0", "orders-1", "orders-2"])
    msg = str(info.value)
    assert "'startingOffsets'" in msg and "'orders-9'" in msg
    assert "orders-0, orders-1, orders-2" in msg
    o.validate_partitions(["orders-0", "orders-1", "orders-9"])

    ending = parse_source_options(
        {"endpoints": "h", "superstream": "orders", "endingOffsets": '{"orders-7": 5}'}, streaming=False
    )
    with pytest.raises(ConfigurationError, match="endingOffsets"):
        ending.validate_partitions(["orders-0"])
    source().validate_partitions(["orders"])


# --------------------------------------------------------------------------------------------
# Source: filtering and extension points
# --------------------------------------------------------------------------------------------


def test_filter_values() -> None:
    o = source(filterValues="eu, us ,,apac", filterMatchUnfiltered="true", filterPostFilterClass="a.b.C")
    assert o.filter_values == ["eu", "us", "apac"]
    assert o.filter_match_unfiltered is True
    assert o.filter_post_filter_class == "a.b.C"


def test_filter_values_empty_fails() -> None:
    msg = source_error({**BASE, "filterValues": " , "})
    assert "'filterValues'" in msg


def test_filter_post_filter_class_must_be_dotted_path() -> None:
    msg = source_error({**BASE, "filterPostFilterClass": "NoModule"})
    assert "'filterPostFilterClass'" in msg and "dotted path" in msg


def test_strict_decoding() -> None:
    assert source(strictDecoding="true").strict_decoding is True


# --------------------------------------------------------------------------------------------
# Sink
# --------------------------------------------------------------------------------------------


def test_sink_values_parse() -> None:
    o = parse_sink_options(
        {
            "endpoints": "h",
            "superstream": "invoices",
            "producerName": "p1",
            "publisherConfirmTimeoutMs": "100",
            "maxInFlight": "7",
            "enqueueTimeoutMs": "3",
            "batchSize": "9",
            "compression": "ZSTD",
            "subEntrySize": "10",
            "routingStrategy": "custom",
            "partitionerClass": "my.routing.Partitioner",
            "filterValuePath": "application_properties.region",
            "ignoreUnknownColumns": "true",
        }
    )
    assert o.is_super_stream and o.name == "invoices"
    assert o.producer_name == "p1"
    assert (o.publisher_confirm_timeout_ms, o.max_in_flight, o.enqueue_timeout_ms, o.batch_size) == (
        100,
        7,
        3,
        9,
    )
    assert (o.compression, o.sub_entry_size) == ("zstd", 10)
    assert (o.routing_strategy, o.partitioner_class) == ("custom", "my.routing.Partitioner")
    assert o.filter_value_path == "application_properties.region"
    assert o.ignore_unknown_columns is True


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_requires_sub_entry_size(codec: str) -> None:
    msg = sink_error({**BASE, "compression": codec})
    assert "'compression'" in msg and "'subEntrySize'" in msg and "> 1" in msg
    assert sink(compression=codec, subEntrySize="2").compression == codec


def test_compression_invalid_lists_values() -> None:
    msg = sink_error({**BASE, "compression": "brotli"})
    assert "'compression'" in msg
    for value in ("none", "gzip", "snappy", "lz4", "zstd"):
        assert value in msg


def test_sub_entry_size_without_compression_is_fine() -> None:
    assert sink(subEntrySize="50").sub_entry_size == 50


def test_routing_strategy_values() -> None:
    assert sink(routingStrategy="KEY").routing_strategy == "key"
    msg = sink_error({**BASE, "routingStrategy": "random"})
    assert "'routingStrategy'" in msg and "hash" in msg and "key" in msg and "custom" in msg


def test_custom_routing_requires_partitioner_class() -> None:
    msg = sink_error({**BASE, "routingStrategy": "custom"})
    assert "'routingStrategy'" in msg and "'partitionerClass'" in msg


def test_partitioner_class_requires_custom_routing() -> None:
    msg = sink_error({**BASE, "partitionerClass": "a.B"})
    assert "'partitionerClass'" in msg and "routingStrategy=custom" in msg


def test_partitioner_class_must_be_dotted_path() -> None:
    msg = sink_error({**BASE, "routingStrategy": "custom", "partitionerClass": "a b"})
    assert "'partitionerClass'" in msg and "dotted path" in msg


@pytest.mark.parametrize(
    "path",
    [
        "application_properties.region",
        "message_annotations.x-tenant",
        "properties.subject",
        "properties.group_id",
        "routing_key",
    ],
)
def test_filter_value_path_valid(path: str) -> None:
    assert sink(filterValuePath=path).filter_value_path == path


@pytest.mark.parametrize(
    "path", ["region", "application_properties.", "properties.nope", "headers.region", "value"]
)
def test_filter_value_path_invalid(path: str) -> None:
    msg = sink_error({**BASE, "filterValuePath": path})
    assert "'filterValuePath'" in msg and "application_properties.<key>" in msg and "routing_key" in msg


def test_sink_accepts_connection_options() -> None:
    o = parse_sink_options({"uris": "rabbitmq-stream+tls://u:p@h", "stream": "s"})
    assert o.connection.tls is True and o.connection.addresses() == [("h", 5551)]


def test_direct_construction_keeps_pydantic_constraints() -> None:
    c = ConnectionOptions(endpoints=[("h", 1)])
    with pytest.raises(ValueError):
        SourceOptions(connection=c, stream="s", initial_credits=-1)
    assert SinkOptions(connection=c, stream="s").batch_size == 500


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


@st.composite
def recased(draw: st.DrawFn, name: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if flip else c.lower() for c, flip in zip(name, flips, strict=True))


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_any_casing_of_keys_parses_the_same(data: st.DataObject) -> None:
    options = {"endpoints": "h:1", "stream": "s", "maxWaitMs": "7", "startingOffsets": "latest"}
    recased_options = {data.draw(recased(k)): v for k, v in options.items()}
    assert parse_source_options(recased_options, streaming=True) == parse_source_options(
        options, streaming=True
    )


@settings(max_examples=100, deadline=None)
@given(
    key=st.sampled_from([*KNOWN_SOURCE_OPTIONS, "bogusOption", "startingOffsetz"]),
    value=st.text(max_size=20),
)
def test_password_never_in_any_source_error(key: str, value: str) -> None:
    options = {**BASE, "password": SECRET, "tls.truststorePassword": SECRET}
    options.setdefault("tls", "true")
    options.setdefault("tls.truststore", "/t.jks")
    if key.lower() not in {k.lower() for k in options}:
        options[key] = value
    try:
        parsed = parse_source_options(options, streaming=False)
    except ConfigurationError as exc:
        assert SECRET not in str(exc)
    else:
        assert SECRET not in repr(parsed) and SECRET not in str(parsed)
