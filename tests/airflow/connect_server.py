"""Airflow task processes against the shared Spark Connect server (tests/support/connect_server.py).

The tasks run in another process (`connect_tasks.py`): a Connect session sets
`SPARK_CONNECT_MODE_ENABLED` for good and cannot be created next to the test run's local
SparkSession, as an Airflow task process never has one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.broker import REPO


def run_task_process(
    scenario: str, args: dict[str, Any], env: dict[str, str], log: Path, timeout: float = 180.0
) -> tuple[dict[str, Any], str]:
    """Run `connect_tasks.<scenario>(**args)` in a fresh Python (an Airflow task process).

    Returns (its result, everything the process wrote to stdout and stderr), also kept in `log`.
    A process still running `timeout - 20` s in prints every thread's stack and exits.
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE"))}
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    args = {**args, "stacks_after_s": timeout - 20}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.airflow.connect_tasks", scenario, json.dumps(args)],
        env=full_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    log.write_text(output)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"task process '{scenario}' failed ({proc.returncode}), see {log}:\n{output[-6000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :]), output
