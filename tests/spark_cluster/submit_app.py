"""spark-submit's application in the tier's fault tests: `pyspark_rmqs/submit.py` with one fault.

    spark-submit ... tests/spark_cluster/submit_app.py <the application's arguments>

`RMQS_TEST_JOB_FAULT` picks the fault, installed in the driver before the run starts:
- `kill-after-commit`: right after the output's commit record is written (the run's files are
  committed, its record still `planned`, no watermark stored), SIGKILL the job's whole process
  group: the spark-submit JVM and this Python driver, as a lost machine or `kill -9` would;
- `paced:<rows>:<seconds>`: the output's writing tasks pass `<rows>` rows per `<seconds>` (a read
  long enough for a test to act while the job holds the consumer's lease).
Anything else runs the application unchanged.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def install(fault: str) -> None:
    if fault == "kill-after-commit":
        from pyspark_rmqs.runs.outputs import delivery

        commit = delivery.FileCommits.commit

        def commit_then_die(self: Any, *args: Any, **kwargs: Any) -> Any:
            commit(self, *args, **kwargs)
            os.killpg(os.getpgrp(), signal.SIGKILL)

        delivery.FileCommits.commit = commit_then_die  # type: ignore[method-assign]
    elif fault.startswith("paced:"):
        from pyspark_rmqs.runs import spark_io
        from tests.spark_cluster.checks import paced

        _, rows, seconds = fault.split(":")
        write_to = spark_io.FileOutput.write_to

        def paced_write(self: Any, df: Any, path: str, mode: str) -> None:
            write_to(self, df.mapInArrow(paced(int(rows), float(seconds)), df.schema), path, mode)

        spark_io.FileOutput.write_to = paced_write  # type: ignore[method-assign]


if __name__ == "__main__":
    # Run as a script: this folder is first on sys.path, the repository (where `tests` lives) is not.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    install(os.environ.get("RMQS_TEST_JOB_FAULT", ""))
    from pyspark_rmqs.submit import main

    sys.exit(main())
