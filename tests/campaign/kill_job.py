"""A campaign consumer's watermark run in a process of its own, held at a point so the campaign can
SIGKILL or SIGSTOP it there (`killed.py`).

    python -m tests.campaign.kill_job CONFIG_JSON

CONFIG_JSON: {"target", "superstream", "consumer", "starting", "output" (a Parquet folder, or null for
a function sink appending to "rows"), "rows", "point", "ready", "go", "heartbeat_s"}. The run is the
pipeline's own public entry point, `RabbitMQStreamConsumeOperator(...).execute({})`, with the
connection `rmqs_campaign` from the environment. At `point` it creates `ready` and waits for `go`:

- `sink:<k>`: before batch `k` reaches the output (0: nothing delivered yet; 1: one batch delivered);
- `before_delivered`, `before_store`, `after_first_store`, `before_stored`: the run protocol's steps
  after the sink (faults.CRASH_POINTS; `after_first_store` stores the first partition's watermark).

A function sink appends `<body hex> <stream> <offset>` lines to `rows` and flushes after each batch:
what it persisted is what the user's sink holds after the kill. When the run ends (the point was
never reached, or `go` appeared) it prints one JSON line: `{"summary": ...}` or `{"error", "message",
"after_go"}` (`after_go`: batches it began after `go`, i.e. after it ran again).

A real SIGKILL needs a real process: nothing in the dying process gets to clean up (no `finally`, no
lease release, no connection close frame), unlike the in-process `Crash` of faults.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.campaign.env import prepare_airflow, quiet

CONN_ID = "rmqs_campaign"


def main(cfg: dict[str, Any]) -> None:
    prepare_airflow()
    quiet()
    from airflow_rmqs.operators import RabbitMQStreamConsumeOperator
    from pyspark_rmqs.errors import classify
    from pyspark_rmqs.runs import consume
    from pyspark_rmqs.runs.outputs import commit_index
    from tests.campaign.config import COMPACT_EVERY
    from tests.campaign.faults import stop_at
    from tests.campaign.object_store import sink_options
    from tests.e2e.faults.holder_job import shorten_heartbeats

    commit_index.COMPACT_EVERY = COMPACT_EVERY  # as the machine that started this process
    shorten_heartbeats(int(cfg["heartbeat_s"]))
    ready, go = Path(cfg["ready"]), Path(cfg["go"])
    point: str = cfg["point"]
    counts = {"batches": 0, "after_go": 0}

    def hold() -> None:
        ready.touch()
        while not go.exists():  # killed or paused in here
            time.sleep(0.02)

    def before_batch() -> None:
        if go.exists():
            counts["after_go"] += 1
        if point == f"sink:{counts['batches']}":
            hold()

    real_write = consume.ParquetSink.write

    def write(self: consume.ParquetSink, batch: Any) -> None:
        before_batch()
        real_write(self, batch)
        counts["batches"] += 1

    consume.ParquetSink.write = write  # type: ignore[method-assign]

    def sink(batch: Any) -> None:
        before_batch()
        with open(cfg["rows"], "a") as f:
            rows = zip(
                batch.column("value").to_pylist(),
                batch.column("stream").to_pylist(),
                batch.column("offset").to_pylist(),
                strict=True,
            )
            f.writelines(f"{bytes(v).hex()} {s} {int(o)}\n" for v, s, o in rows)
            f.flush()
        counts["batches"] += 1

    where = {"superstream": cfg["target"]} if cfg["superstream"] else {"stream": cfg["target"]}
    out: dict[str, Any] = sink_options(cfg["output"]) if cfg["output"] else {"apply_function": sink}
    try:
        op = RabbitMQStreamConsumeOperator(
            task_id=f"campaign-killed-{cfg['consumer']}",
            rabbitmq_stream_conn_id=CONN_ID,
            consumer_name=cfg["consumer"],
            starting_offsets=cfg["starting"],
            **where,
            **out,
        )
        with stop_at(point, lambda _why: hold()):
            result: dict[str, Any] = {"summary": op.execute({})}
    except Exception as e:
        c = classify(e)
        result = {"error": c.error or type(e).__name__, "message": c.message[:2000]}
    result["after_go"] = counts["after_go"]
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
