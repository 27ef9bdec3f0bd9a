"""A Spark-free watermark run (consume into Parquet) that kills its own process at a chosen point.

    python -m tests.e2e.faults.consume_job CONFIG_JSON

CONFIG_JSON: {"endpoints", "username", "password", "vhost", "superstream", "consumer", "out", "kill"};
`kill`: `sink` (after the first partition stream's file is in place, the others not written),
`commit` (after the commit record, before the watermark store) or `stored` (after the store), or
any other point of `kill_points.py`. With `"storage": "pyarrow"` or `"fsspec"` the output is an
object store (`out` an `s3://` URI) reached through pyarrow's S3 file system or fsspec's s3fs,
signed with the AWS environment the test passes (the credentials are never in the arguments).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.e2e.faults.kill_points import arm, die


def main(cfg: dict[str, Any]) -> None:
    from pyspark_rmqs import jobs
    from pyspark_rmqs.options import parse_connection_options
    from pyspark_rmqs.runs import consume

    conn = parse_connection_options({k: cfg[k] for k in ("endpoints", "username", "password", "vhost")})
    kill = cfg["kill"]
    arm(kill, engine="arrow")
    plan = jobs.plan_read(conn, superstream=cfg["superstream"], consumer=cfg["consumer"])
    consume.run_consume(conn, plan, sink(cfg))
    if kill == "stored":
        die()


def sink(cfg: dict[str, Any]) -> Any:
    """A ParquetSink into `out`, or with `"iceberg": {catalog properties}` an IcebergSink of table
    `out` whose warehouse is on the object store (S3 properties from the AWS environment)."""
    import os

    from pyspark_rmqs.runs import consume

    if cfg.get("iceberg"):
        from pyspark_rmqs.runs.outputs.iceberg import IcebergSink

        s3 = {
            "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
            "s3.endpoint": os.environ["AWS_ENDPOINT_URL"],
            "s3.region": os.environ["AWS_REGION"],
        }
        return IcebergSink(cfg["out"], {**cfg["iceberg"], **s3})
    return consume.ParquetSink(cfg["out"], **storage(cfg.get("storage")))


def storage(kind: str | None) -> dict[str, Any]:
    """The ParquetSink arguments reaching the object store the AWS environment names."""
    import os

    if kind is None:
        return {}
    if kind == "pyarrow":
        from pyarrow import fs

        return {
            "filesystem": fs.S3FileSystem(
                access_key=os.environ["AWS_ACCESS_KEY_ID"],
                secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                endpoint_override=os.environ["AWS_ENDPOINT_URL"],
                region=os.environ["AWS_REGION"],
            )
        }
    return {
        "storage_options": {
            "key": os.environ["AWS_ACCESS_KEY_ID"],
            "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
            "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
        }
    }


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
