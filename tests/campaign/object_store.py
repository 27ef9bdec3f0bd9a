"""Exactly-once outputs in an object store: the Airflow Parquet consumers write to `s3://` instead.

With `CampaignConfig.outputs == "s3"` the exactly-once consumers of the Airflow consume operator
(c2, c3, in process and in `run_killed`'s child) write `s3://<bucket>/<pipeline>` through
`output_conn_id`, against moto's S3 server on loopback (tests/support/s3.py, IAM enforced, one
per process, a bucket per sequence). The commit records, the index and the Parquet objects then
go through the object-store paths (`ArrowFolder`, conditional writes, no rename), under every rule
the local folders see: crashes at each protocol step, SIGKILL, a paused holder, concurrent runs,
retention, re-created streams. The Dagster arrow-engine consumer (c5) writes there too, through an
`ObjectStoreResource` under its asset's `output_storage_key`. The Spark consumers (c6, c9) keep
local folders: Spark would need Hadoop's S3A, which the suite does not install.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any

from tests.support import s3

CONN_ID = "rmqs_campaign_s3"
_SERVER: list[s3.S3Server] = []


def server() -> s3.S3Server:
    """This process's moto server (started on first use, stopped at exit), and the Airflow
    connection `rmqs_campaign_s3` holding its credentials, in the environment a child inherits."""
    if not _SERVER:
        started = s3.start()
        assert started.process is not None
        atexit.register(s3.stop, started.process)
        lake = {
            "conn_type": "aws",
            "login": started.key,
            "password": started.secret,
            "extra": {"endpoint_url": started.endpoint, "region_name": started.region},
        }
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(lake)
        _SERVER.append(started)
    return _SERVER[0]


def started() -> bool:
    """Whether this process's moto server runs (a sequence wrote to `s3://`)."""
    return bool(_SERVER)


def storage_options(output: str) -> dict[str, Any] | None:
    """What a reader of `output` signs with (None: a local folder)."""
    return server().storage_options() if output.startswith("s3://") else None


def sink_options(output: str) -> dict[str, Any]:
    """The operator's output arguments for `output`."""
    return {"output_path": output, **({"output_conn_id": CONN_ID} if output.startswith("s3://") else {})}
