"""Where a Spark-free run writes (objectstore.py) and what readers trust (committed.py), without a store."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.runs.outputs import committed
from pyspark_rmqs.runs.outputs.objectstore import locate, storage_secrets, without_secrets


def test_a_local_folder_is_local_and_an_s3_uri_is_not(tmp_path: Path) -> None:
    assert locate(str(tmp_path)).local
    assert locate(f"file://{tmp_path}").base == str(tmp_path)
    remote = locate(
        "s3://bucket/orders", storage_options={"key": "k", "secret": "s", "endpoint_url": "http://x"}
    )
    assert not remote.local and remote.base == "bucket/orders"
    assert remote.uri_of("a.parquet") == "s3://bucket/orders/a.parquet"


def test_storage_option_errors_name_the_option() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        locate("s3://b/o", filesystem=object(), storage_options={"key": "k"})
    with pytest.raises(ConfigurationError, match="fsspec knows no file system"):
        locate("nosuchscheme://b/o", storage_options={"x": "y"})


def test_storage_secrets_are_found_nested_and_masked() -> None:
    options = {
        "key": "AKIDEXAMPLE",
        "secret": "wJalrXUtnFEMI",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1", "aws_session_token": "tok-123456"},
    }
    assert set(storage_secrets(options)) == {"AKIDEXAMPLE", "wJalrXUtnFEMI", "tok-123456"}
    shown = without_secrets(options)
    assert (
        shown["endpoint_url"] == "http://127.0.0.1:9000"
        and shown["client_kwargs"]["region_name"] == "eu-west-1"
    )
    assert "wJalrXUtnFEMI" not in json.dumps(shown) and "tok-123456" not in json.dumps(shown)


def _parquet(path: Path, offsets: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"stream": ["s"] * len(offsets), "offset": offsets}), path)


def test_committed_files_are_the_manifests_files_only(tmp_path: Path) -> None:
    _parquet(tmp_path / "s-0-2-aaa.parquet", [0, 1])
    _parquet(tmp_path / "s-2-4-bbb.parquet", [2, 3])  # a run that died before its commit record
    (tmp_path / "_rmqs_commits").mkdir()
    (tmp_path / "_rmqs_commits" / "aaa.json").write_text(json.dumps({"files": ["s-0-2-aaa.parquet"]}))
    assert committed.committed_files(str(tmp_path)) == [str(tmp_path / "s-0-2-aaa.parquet")]
    table = committed.committed_dataset(str(tmp_path)).to_table()
    assert table.column("offset").to_pylist() == [0, 1]


def test_committed_files_of_a_spark_file_sink_follow_its_log(tmp_path: Path) -> None:
    """Files of logged batches count; a part file a killed batch left (0 bytes) does not."""
    _parquet(tmp_path / "part-0.parquet", [0, 1])
    _parquet(tmp_path / "part-1.parquet", [2])
    (tmp_path / "part-2.parquet").write_bytes(b"")  # a killed batch's leftover
    log = tmp_path / "_spark_metadata"
    log.mkdir()
    for batch, name in ((0, "part-0.parquet"), (1, "part-1.parquet")):
        entry = {"path": f"file://{tmp_path / name}", "size": 1, "isDir": False, "action": "add"}
        (log / str(batch)).write_text("v1\n" + json.dumps(entry) + "\n")
    files = committed.committed_files(str(tmp_path))
    assert files == [str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet")]
    assert sorted(committed.committed_dataset(str(tmp_path)).to_table().column("offset").to_pylist()) == [
        0,
        1,
        2,
    ]


def test_credentials_in_a_uri_query_are_never_shown() -> None:
    """A URI's query (pyarrow's S3 options; older releases took keys there) is not shown, nor any
    value of it in an error."""
    where = locate("s3://bucket/orders?region=us-east-1")
    assert where.uri == "s3://bucket/orders" and where.uri_of("x.parquet") == "s3://bucket/orders/x.parquet"
    with pytest.raises(ConfigurationError) as e:
        locate("s3://bucket/orders?secret_key=S3CR3TQUERY&nonsense_option=1")
    assert "S3CR3TQUERY" not in str(e.value)


def test_committed_files_include_each_time_windows_own_manifests(tmp_path: Path) -> None:
    """A Dagster time window keeps its runs under `rmqs_window=<key>/`, with their records there."""
    for key, offsets in (("2026-01-01", [0, 1]), ("2026-01-02", [2])):
        folder = tmp_path / f"rmqs_window={key}"
        _parquet(folder / f"s-{key}.parquet", offsets)
        (folder / "_rmqs_commits").mkdir()
        (folder / "_rmqs_commits" / "t.json").write_text(json.dumps({"files": [f"s-{key}.parquet"]}))
    _parquet(tmp_path / "rmqs_window=2026-01-03" / "s-dead.parquet", [3])  # no manifest
    table = committed.committed_dataset(str(tmp_path)).to_table()
    assert sorted(table.column("offset").to_pylist()) == [0, 1, 2]
    assert sorted(set(table.column("rmqs_window").to_pylist())) == ["2026-01-01", "2026-01-02"]


def test_spark_exactly_once_files_refuse_an_object_store_and_say_what_to_use() -> None:
    from pyspark_rmqs.runs.outputs.delivery import FileCommits

    with pytest.raises(ConfigurationError, match="object stores lack") as e:
        FileCommits("s3://bucket/orders")
    assert "Spark-free consume" in str(e.value) and "Iceberg" in str(e.value)
