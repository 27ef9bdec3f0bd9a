"""The broker layer's settings derive from the option tables, each in one place.

`SourceOptions.reader_settings()` and `SinkOptions.writer_settings()` are the only mappings from
options to `ReadSettings` / `WriteSettings`. An option added to a table must either reach its
settings there or be named here as used elsewhere (by the planner, the encoder, per task), so a new
option cannot be silently left out of the executors' settings.
"""

from __future__ import annotations

import dataclasses

import pytest

from pyspark_rmqs.broker.reader import ReadSettings
from pyspark_rmqs.broker.writer import WriteSettings
from pyspark_rmqs.options import SinkOptions, SourceOptions, parse_sink_options
from pyspark_rmqs.options import parse_source_options as parse_source
from pyspark_rmqs.options.fields import OptionModel
from pyspark_rmqs.spark.sink import Dedup, write_settings

BASE = {"endpoints": "localhost:5552", "stream": "orders"}

# Option fields whose value does not travel in the writer's settings, and where it goes instead.
NOT_WRITER_SETTINGS = {
    "stream": "the producer's target (StreamProducer's arguments)",
    "superstream": "the producer's target (StreamProducer's arguments)",
    "producer_name": "one name per task with its publishing ids (spark/sink.py dedup_for)",
    "filter_value_path": "the encoder (batches.MessageEncoder)",
    "ignore_unknown_columns": "the driver's schema check (spark/sink.py)",
}
# Option fields whose value does not travel in the reader's settings, and where it goes instead.
NOT_READER_SETTINGS = {
    "stream": "the planner (planning.partition_streams)",
    "superstream": "the planner (planning.partition_streams)",
    "consumer_name": "the planner and streaming commits",
    "starting_offsets": "the planner (planning.resolve_positions)",
    "starting_offset": "the planner",
    "starting_timestamp": "the planner",
    "ending_offsets": "the planner",
    "ending_offset": "the planner",
    "max_records_per_trigger": "streaming admission control",
    "max_bytes_per_trigger": "streaming admission control",
    "estimated_message_size_bytes": "streaming admission control",
    "min_partitions": "the planner's splits",
    "server_side_offset_tracking": "streaming commits",
    "filter_post_filter_class": "loaded where the read runs (spark/common.read_settings)",
}


def _option_fields(model: type[OptionModel]) -> list[str]:
    """The fields of `model` that are options users type (the connection is a table of its own)."""
    return [f for f, info in model.model_fields.items() if info.alias]


def _marked(opts: OptionModel, field: str) -> tuple[OptionModel, object]:
    """`opts` with a unique marker in `field` (in a list: some settings take a field's items)."""
    marker = object()
    return opts.model_copy(update={field: [marker]}), marker


def _shows(marker: object, settings: dict[str, object]) -> bool:
    return any(v == [marker] or v == (marker,) for v in settings.values())


# Only the options that must reach the settings: the exceptions are checked by
# test_the_exceptions_name_real_options, not counted here as passing cases.
@pytest.mark.parametrize("field", [f for f in _option_fields(SinkOptions) if f not in NOT_WRITER_SETTINGS])
def test_every_sink_option_reaches_the_writer_settings_or_says_where_it_goes(field: str) -> None:
    opts, marker = _marked(parse_sink_options(BASE), field)
    assert _shows(marker, opts.writer_settings()), (  # type: ignore[attr-defined]
        f"option '{SinkOptions.alias(field)}' is neither in SinkOptions.writer_settings() nor in "
        "NOT_WRITER_SETTINGS (with the place that uses it)"
    )


@pytest.mark.parametrize("field", [f for f in _option_fields(SourceOptions) if f not in NOT_READER_SETTINGS])
def test_every_source_option_reaches_the_reader_settings_or_says_where_it_goes(field: str) -> None:
    opts, marker = _marked(parse_source(BASE, streaming=False), field)
    assert _shows(marker, opts.reader_settings()), (  # type: ignore[attr-defined]
        f"option '{SourceOptions.alias(field)}' is neither in SourceOptions.reader_settings() nor in "
        "NOT_READER_SETTINGS (with the place that uses it)"
    )


def test_the_exceptions_name_real_options() -> None:
    assert set(NOT_WRITER_SETTINGS) <= set(_option_fields(SinkOptions))
    assert set(NOT_READER_SETTINGS) <= set(_option_fields(SourceOptions))


def test_writer_settings_are_write_settings_with_the_given_values() -> None:
    opts = parse_sink_options(
        {
            **BASE,
            "publisherConfirmTimeoutMs": "1234",
            "maxInFlight": "77",
            "enqueueTimeoutMs": "55",
            "batchSize": "9",
            "compression": "zstd",
            "subEntrySize": "4",
        }
    )
    names = {f.name for f in dataclasses.fields(WriteSettings)}
    assert set(opts.writer_settings()) <= names
    s = WriteSettings(**opts.writer_settings())
    assert (s.confirm_timeout_ms, s.max_in_flight, s.enqueue_timeout_ms, s.batch_size) == (1234, 77, 55, 9)
    assert (s.compression, s.sub_entry_size, s.routing_strategy, s.partitioner_class) == (
        "zstd",
        4,
        "hash",
        None,
    )
    assert WriteSettings(**parse_sink_options(BASE).writer_settings()) == WriteSettings()
    assert set(parse_source(BASE, streaming=False).reader_settings()) <= {
        f.name for f in dataclasses.fields(ReadSettings)
    }


def test_the_sink_task_settings_are_the_options_plus_the_task_identity() -> None:
    opts = parse_sink_options({**BASE, "maxInFlight": "77", "batchSize": "9"})
    s = write_settings(opts, Dedup("etl-job-p3", 5 << 32 | 1, 6 << 32))
    assert s == WriteSettings(
        **opts.writer_settings(),
        producer_name="etl-job-p3",
        resume_sequence=False,
        first_publishing_id=5 << 32 | 1,
        publishing_id_limit=6 << 32,
    )
    assert (s.max_in_flight, s.batch_size) == (77, 9)
