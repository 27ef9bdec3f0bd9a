"""The XCom `files` value (issue 46): the same type from the Spark read operator and the Spark-free
consume operator, a list of the paths of the run's files, what a downstream task loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamReadOperator
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.timeout(600)]


def offsets_in(files: list[str]) -> list[int]:
    return sorted(o for f in files for o in pq.read_table(f, columns=["offset"])["offset"].to_pylist())


def test_read_and_consume_return_the_paths_of_their_files(
    spark: Any, broker: BrokerSettings, streams: Any, tmp_path: Path
) -> None:
    s = streams.stream("files")
    publish(broker, s, [f"m{i}".encode() for i in range(500)])
    for op in (
        RabbitMQStreamReadOperator(
            task_id="read", stream=s, consumer_name="spark-files", output_path=str(tmp_path / "read")
        ),
        RabbitMQStreamConsumeOperator(
            task_id="consume", stream=s, consumer_name="arrow-files", output_path=str(tmp_path / "consume")
        ),
    ):
        first = op.execute({})
        files = first["files"]
        assert isinstance(files, list) and files and all(isinstance(f, str) for f in files), first
        assert all(Path(f).is_file() and Path(f).is_relative_to(tmp_path / op.task_id) for f in files)
        assert offsets_in(files) == list(range(500)), op.task_id  # every offset once, in these files
