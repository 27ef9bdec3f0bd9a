"""A Spark-free watermark run that holds its consumer's lease and stops, so the test can pause or kill it.

    python -m tests.e2e.faults.holder_job CONFIG_JSON

CONFIG_JSON: {"endpoints", "username", "password", "vhost", "stream", "consumer", "out", "seen",
"ready", "go", "heartbeat_s"}. The run plans (taking the lease and writing its `planned` record),
reads the whole range into a `ParquetSink` at `out` (appending every offset its sink receives to
`seen`, one per line), and, with the range in its sink and before its commit, creates `ready` and
waits for `go` to exist: the test pauses (SIGSTOP) or kills (SIGKILL) it there. Once it goes on, it
prints one JSON line: what the run did (`stored`) or the error that stopped it (`error`, `retryable`,
`commit_state`, `message`).

`heartbeat_s` shortens the heartbeat every broker connection of this process negotiates (rmqs asks
for 60 s, so a paused process would lose its lease only after two to three minutes): the lease then
ends after a few missed heartbeats, as it would after minutes with the default. A connection that
asks for no heartbeat keeps none.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def shorten_heartbeats(seconds: int) -> None:
    """Every `RmqsClient` of this process asks for at most `seconds` between heartbeats (0 stays 0)."""
    from pyspark_rmqs.broker.protocol import RmqsClient

    real_init = RmqsClient.__init__

    def init(self: RmqsClient, host: str, port: int, **kw: Any) -> None:
        real_init(self, host, port, **kw)
        if self._heartbeat:  # the value rstream answers the broker's Tune with (the minimum of both)
            self._heartbeat = min(self._heartbeat, seconds)

    RmqsClient.__init__ = init  # type: ignore[method-assign]


def main(cfg: dict[str, Any]) -> None:
    import pyarrow as pa

    from pyspark_rmqs import jobs
    from pyspark_rmqs.errors import classify
    from pyspark_rmqs.options import parse_connection_options
    from pyspark_rmqs.runs import consume

    shorten_heartbeats(int(cfg["heartbeat_s"]))
    conn = parse_connection_options({k: cfg[k] for k in ("endpoints", "username", "password", "vhost")})
    seen, ready, go = Path(cfg["seen"]), Path(cfg["ready"]), Path(cfg["go"])

    class HeldSink(consume.ParquetSink):
        """The run's exactly-once output; it notes every offset it is handed and stops before the commit."""

        def write(self, batch: pa.RecordBatch) -> None:
            with seen.open("a") as f:
                f.writelines(f"{o}\n" for o in batch.column("offset").to_pylist())
            super().write(batch)

        def close(self) -> None:
            super().close()
            ready.touch()
            while not go.exists():  # the test pauses or kills the process in here
                time.sleep(0.05)

    plan = jobs.plan_read(conn, stream=cfg["stream"], consumer=cfg["consumer"])
    try:
        summary = consume.run_consume(conn, plan, HeldSink(cfg["out"]))
    except Exception as e:
        c = classify(e)
        print(
            json.dumps(
                {
                    "error": type(e).__name__,
                    "retryable": bool(c.retryable),
                    "commit_state": None if c.commit_state is None else str(c.commit_state),
                    "message": str(e),
                }
            ),
            flush=True,
        )
        return
    print(json.dumps({"stored": bool(summary.watermark_stored), "rows": summary.rows}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
