"""Operator arguments: template fields, rendered-value coercion and error mapping (no broker, no DB)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs import values
from airflow_rmqs.failures import airflow_failures
from airflow_rmqs.operators import (
    RabbitMQStreamDrainOperator,
    RabbitMQStreamPublishOperator,
    RabbitMQStreamReadOperator,
)
from pyspark_rmqs.core.errors import BrokerUnavailableError, ConfigurationError, DataLossError

pytestmark = pytest.mark.airflow


def test_positions_from_rendered_templates() -> None:
    assert values.position(None, "start", "watermark") == "watermark"
    assert values.position(" Latest ", "end", "latest") == "latest"
    assert values.position('{"o-0": 5, "o-1": -2}', "start", "watermark") == '{"o-0": 5, "o-1": -2}'
    assert values.position("{'o-0': 5}", "start", "watermark") == '{"o-0": 5}'  # a rendered dict Param
    assert values.position({"o-0": 7}, "end", "latest") == '{"o-0": 7}'
    assert values.position("2025-01-01 10:00:00+00:00", "start", "w") == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert values.position("2025-01-01T10:00:00Z", "start", "w") == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert values.position(datetime(2025, 1, 1), "start", "w") == datetime(2025, 1, 1, tzinfo=UTC)
    assert values.position("1735725600000", "end", "latest") == 1735725600000  # epoch millis
    with pytest.raises(ConfigurationError, match="'start' must be one of"):
        values.position("yesterday", "start", "watermark")
    with pytest.raises(ConfigurationError, match="'end' is not a JSON object"):
        values.position("{nope", "end", "latest")


def test_options_and_ints_from_rendered_templates() -> None:
    assert values.options('{"compression": "snappy", "x": true}', "o") == {
        "compression": "snappy",
        "x": "true",
    }
    assert values.options(None, "o") == {}
    assert values.optional_int("None", "max_messages") is None
    assert values.optional_int("250", "max_messages") == 250
    with pytest.raises(ConfigurationError, match="'max_messages' must be at least 1"):
        values.optional_int(0, "max_messages")


def test_error_mapping() -> None:
    with pytest.raises(AirflowFailException, match="DataLossError: gone"), airflow_failures():
        raise DataLossError("gone")
    with pytest.raises(BrokerUnavailableError), airflow_failures():
        raise BrokerUnavailableError("down")  # retryable: Airflow retries it
    spark_text = (
        "PythonException: ...\n"
        "pyspark_rmqs.core.errors.DataLossError: offsets [0, 5) of stream 's' were removed"
    )
    with pytest.raises(AirflowFailException, match=r"^DataLossError: offsets \[0, 5\)"), airflow_failures():
        raise RuntimeError(spark_text)
    with pytest.raises(RuntimeError, match=r"password=\*\*\*") as leaked, airflow_failures(["s3cret"]):
        raise ValueError("bad password=s3cret")
    assert "s3cret" not in str(leaked.value) and leaked.value.__cause__ is None


def test_operator_arguments_and_template_fields() -> None:
    read = RabbitMQStreamReadOperator(task_id="r", superstream="orders", consumer_name="c", output_path="/o")
    assert {"start", "end", "output_path", "max_messages", "consumer_name", "output_options"} <= set(
        read.template_fields
    )
    with pytest.raises(ValueError, match="exactly one of 'stream' or 'superstream'"):
        RabbitMQStreamReadOperator(task_id="r", consumer_name="c", output_path="/o")
    with pytest.raises(ValueError, match="exactly one of 'output_path' or 'process'"):
        RabbitMQStreamReadOperator(task_id="r", stream="s", consumer_name="c")
    with pytest.raises(ValueError, match="needs a consumer_name"):
        RabbitMQStreamReadOperator(task_id="r", stream="s", output_path="/o")
    drain = RabbitMQStreamDrainOperator(
        task_id="d", stream="s", consumer_name="c", checkpoint_location="/cp", output_path="/o"
    )
    assert {"checkpoint_location", "output_path"} <= set(drain.template_fields)
    with pytest.raises(ValueError, match="exactly one of 'input_path' or 'dataframe_callable'"):
        RabbitMQStreamPublishOperator(task_id="p", stream="s")


def test_read_and_drain_operators_serialise_runs_per_consumer_by_default() -> None:
    """Two runs on one consumer name would read one range twice: one task instance at a time unless asked."""
    read = RabbitMQStreamReadOperator(task_id="r", stream="s", consumer_name="c", output_path="/tmp/x")
    drain = RabbitMQStreamDrainOperator(
        task_id="d", stream="s", consumer_name="c", checkpoint_location="/tmp/c", output_path="/tmp/x"
    )
    assert read.max_active_tis_per_dag == 1 and drain.max_active_tis_per_dag == 1
    wider = RabbitMQStreamReadOperator(
        task_id="w", stream="s", consumer_name="c", output_path="/tmp/x", max_active_tis_per_dag=3
    )
    assert wider.max_active_tis_per_dag == 3


def test_consume_operator_writes_iceberg_tables_through_the_iceberg_sink(tmp_path: Path) -> None:
    from airflow_rmqs.operators import RabbitMQStreamConsumeOperator
    from pyspark_rmqs.runs.consume import ParquetSink
    from pyspark_rmqs.runs.outputs.iceberg import IcebergSink

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"}
    ice = RabbitMQStreamConsumeOperator(
        task_id="i",
        stream="s",
        consumer_name="c",
        output_path="lake.t",
        output_format="iceberg",
        iceberg_catalog=catalog,
    )
    sink = ice._sink()
    assert isinstance(sink, IcebergSink) and sink.identifier == "lake.t"
    files = RabbitMQStreamConsumeOperator(
        task_id="p", stream="s", consumer_name="c", output_path=str(tmp_path)
    )
    assert isinstance(files._sink(), ParquetSink)
    with pytest.raises(ValueError, match="output_format must be 'parquet' or 'iceberg'"):
        RabbitMQStreamConsumeOperator(
            task_id="x", stream="s", consumer_name="c", output_path="p", output_format="csv"
        )


def test_read_and_consume_share_one_declaration_of_the_bounded_read_parameters() -> None:
    """The bounded-read parameters, their defaults, checks and template fields are declared once
    (`_BoundedReadOperator`) and mean the same in the Spark and the Spark-free operator."""
    import inspect

    from airflow_rmqs.operator_base import BOUNDED_READ_FIELDS, _BoundedReadOperator
    from airflow_rmqs.operators import RabbitMQStreamConsumeOperator

    shared = {
        p.name: p.default
        for p in inspect.signature(_BoundedReadOperator.__init__).parameters.values()
        if p.kind == p.KEYWORD_ONLY
    }
    assert shared == {
        "consumer_name": None,
        "start": "watermark",
        "end": "latest",
        "starting_offsets": "earliest",
        "max_messages": None,
        "store_watermark": None,  # watermark runs store; explicit ranges are backfills
        "fail_on_data_loss": True,
        "metadata_fields": None,
    }
    for op in (RabbitMQStreamReadOperator, RabbitMQStreamConsumeOperator):
        assert issubclass(op, _BoundedReadOperator)
        own = set(inspect.signature(op.__init__).parameters)
        assert not own & set(shared), f"{op.__name__} declares {own & set(shared)} again"
        assert tuple(op.template_fields[: len(BOUNDED_READ_FIELDS)]) == BOUNDED_READ_FIELDS
        assert op.template_fields_renderers["start"] == op.template_fields_renderers["end"] == "json"
        sink = {"output_path": "/o"}
        made = op(task_id="t", stream="s", consumer_name="c", **sink)  # type: ignore[arg-type]
        assert {k: getattr(made, k) for k in shared} == {**shared, "consumer_name": "c"}
        assert made.max_active_tis_per_dag == 1
        with pytest.raises(ValueError, match="needs a consumer_name"):
            op(task_id="t", stream="s", **sink)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="exactly one of 'stream' or 'superstream'"):
            op(task_id="t", stream="s", superstream="ss", consumer_name="c", **sink)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:Task 'n' was never mapped")
def test_unknown_operator_arguments_still_fail_when_the_dag_is_parsed() -> None:
    """Every class names its parameters, so Airflow rejects a misspelt one, directly or in expand()."""
    from airflow.sdk import DAG

    from airflow_rmqs.operators import (
        RabbitMQStreamConsumeOperator,
        RabbitMQStreamProduceOperator,
    )

    base = {"stream": "s", "consumer_name": "c", "output_path": "/o"}
    for op in (RabbitMQStreamReadOperator, RabbitMQStreamConsumeOperator):
        with pytest.raises(TypeError, match=r"Invalid arguments were passed.*\n.*'consumer_nme'"):
            op(task_id="t", consumer_nme="x", **base)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Invalid arguments were passed"):
        RabbitMQStreamProduceOperator(task_id="p", stream="s", producer_function=list, routing="key")  # type: ignore[call-arg]
    with DAG("rmqs_expand_args", schedule=None):
        mapped = RabbitMQStreamConsumeOperator.partial(task_id="m", stream="s", output_path="/o")
        mapped.expand(consumer_name=["a", "b"])  # a shared parameter is a known one
        with pytest.raises(TypeError, match="unexpected keyword argument 'consumer_nme'"):
            RabbitMQStreamConsumeOperator.partial(task_id="n", stream="s", output_path="/o").expand(
                consumer_nme=["a"]
            )


def test_every_operator_is_importable_from_airflow_rmqs_operators() -> None:
    from airflow_rmqs import operators, plain_operators

    for name in (
        "RabbitMQStreamReadOperator",
        "RabbitMQStreamDrainOperator",
        "RabbitMQStreamPublishOperator",
        "RabbitMQStreamConsumeOperator",
        "RabbitMQStreamProduceOperator",
    ):
        assert name in operators.__all__ and getattr(operators, name).__name__ == name
    assert operators.RabbitMQStreamConsumeOperator is plain_operators.RabbitMQStreamConsumeOperator


def test_connection_ids_and_spark_conf_are_templated_on_every_operator_and_sensor() -> None:
    """As the Airflow Kafka provider templates `kafka_config_id`: one DAG picks a team's or an
    environment's connections from params or Variables."""
    import jinja2

    from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamProduceOperator
    from airflow_rmqs.sensors import RabbitMQStreamLagSensor, RabbitMQStreamNewDataSensor

    conn = {"rabbitmq_stream_conn_id": "{{ params.rmq }}"}
    spark = {
        **conn,
        "spark_conn_id": "{{ params.spark }}",
        "spark_conf": {"spark.executor.memory": "{{ params.mem }}"},
    }
    made = [
        RabbitMQStreamReadOperator(task_id="r", stream="s", consumer_name="c", output_path="/o", **spark),
        RabbitMQStreamDrainOperator(
            task_id="d", stream="s", consumer_name="c", checkpoint_location="/cp", output_path="/o", **spark
        ),
        RabbitMQStreamPublishOperator(task_id="p", stream="s", input_path="/i", **spark),
        RabbitMQStreamConsumeOperator(task_id="c", stream="s", consumer_name="c", output_path="/o", **conn),
        RabbitMQStreamProduceOperator(task_id="pr", stream="s", producer_function=list, **conn),
        RabbitMQStreamLagSensor(task_id="l", stream="s", consumer_name="c", **conn),
        RabbitMQStreamNewDataSensor(task_id="n", stream="s", consumer_name="c", **conn),
    ]
    context = {"params": {"rmq": "rmq_team_a", "spark": "spark_team_a", "mem": "4g"}}
    for op in made:
        op.render_template_fields(context, jinja_env=jinja2.Environment())
        assert op.rabbitmq_stream_conn_id == "rmq_team_a", type(op).__name__
        if "spark_conn_id" in spark and hasattr(op, "spark_conn_id"):
            assert (op.spark_conn_id, op.spark_conf) == ("spark_team_a", {"spark.executor.memory": "4g"})
            assert op.template_fields_renderers["spark_conf"] == "json"
    assert sum(hasattr(op, "spark_conn_id") for op in made) == 3


def test_spark_conn_id_reads_the_spark_connect_connection_type_user_id_from_login() -> None:
    """The Apache Spark provider's `spark_connect` type keeps the user id in Login ("User ID")."""
    from airflow.models.connection import Connection

    from airflow_rmqs.operators import spark_connect_url

    typed = Connection(
        conn_id="sc", conn_type="spark_connect", host="sc://spark.example", login="etl", password="t0k"
    )
    assert spark_connect_url(typed) == ("sc://spark.example:15002/;user_id=etl;token=t0k", None)
    master = Connection(conn_id="m", conn_type="spark", host="spark://master", port=7077)
    assert spark_connect_url(master) == (None, "spark://master:7077")
