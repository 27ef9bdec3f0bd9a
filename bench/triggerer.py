"""Many watchers in a real Airflow triggerer: its loop's stalls and what causes them.

    .venv/bin/python -m bench.triggerer [--watchers 100] [--superstreams 2] [--partitions 50]
        [--seconds 150] [--poll-interval 1] [--freeze]

`bench.orchestration --watchers` runs the triggers on an event loop of its own. This runs them where a
deployment does: `airflow triggerer` (its supervisor and the forked trigger runner, SQLite metadata
database), with N `AssetWatcher`s of `RabbitMQStreamNewDataTrigger` (each its own consumer name, S
super streams of P partitions, nothing published while it runs, so every poll is a steady one).

Airflow's own watchdog measures the loop: the runner sleeps 0.1 s and logs "Triggerer's async thread
was blocked for X seconds" when the sleep took longer than `[triggerer]
blocked_main_thread_warning_threshold`; the bench sets it to 0.15 s, so every line is a stall of more
than 50 ms (the issue's target). A `sitecustomize` on the triggerer's `PYTHONPATH` records each full
(generation 2) collection of the runner process and how long it stopped the loop.

The same triggerer with no watcher at all runs first (the baseline: Airflow's own loop and heap), then
the one with the watchers. `--freeze` sets `[rabbitmq_streams] triggerer_gc_freeze` (docs/airflow.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.common import connection
from bench.orchestration import airflow_connection, setup
from pyspark_rmqs.broker.client import BrokerClient

SITECUSTOMIZE = '''
"""bench.triggerer: log every full collection of a process running an event loop (the trigger runner)."""
import asyncio, gc, os, time

_log = os.environ.get("RMQS_BENCH_GC_LOG")
_began = [0.0]


def _collection(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        _began[0] = time.perf_counter()
        return
    if asyncio._get_running_loop() is None:  # the supervisor and the CLI: no loop to stall
        return
    ms = (time.perf_counter() - _began[0]) * 1000
    with open(_log, "a") as f:
        f.write(f"{os.getpid()} {time.time():.3f} {ms:.1f} {len(gc.get_objects())}\\n")


if _log:
    gc.callbacks.append(_collection)
'''

DAG = '''
"""bench.triggerer: {watchers} asset watchers, nothing downstream (no event fires: nothing is published)."""
from datetime import datetime

from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

SUPERSTREAMS = {superstreams!r}
assets = [
    Asset(
        name=f"rmqs-bench-watcher-{{i}}",
        watchers=[
            AssetWatcher(
                name=f"rmqs-bench-watcher-{{i}}",
                trigger=RabbitMQStreamNewDataTrigger(
                    superstream=SUPERSTREAMS[i % len(SUPERSTREAMS)],
                    consumer_name=f"bench-triggerer-{{i}}",
                    poll_interval={poll_interval},
                ),
            )
        ],
    )
    for i in range({watchers})
]

with DAG(dag_id="rmqs_bench_watchers", schedule=assets or None, start_date=datetime(2025, 1, 1)):
    pass
'''


def airflow(home: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, check=True, cwd=home, stdout=subprocess.DEVNULL
    )


def run_triggerer(
    database: Path, watchers: int, names: list[str], seconds: float, poll_interval: float, freeze: bool
) -> dict:
    """One `airflow triggerer` with `watchers` asset watchers, watched for `seconds` once all started."""
    home = Path(tempfile.mkdtemp(prefix="rmqs-bench-triggerer-"))
    shutil.copy(database, home / "airflow.db")
    (home / "dags").mkdir()
    (home / "site").mkdir()
    (home / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (home / "dags" / "watchers.py").write_text(
        textwrap.dedent(DAG).format(watchers=watchers, superstreams=names, poll_interval=poll_interval)
    )
    gc_log = home / "collections.log"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",  # a paused DAG's watchers do not run
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW__TRIGGERER__BLOCKED_MAIN_THREAD_WARNING_THRESHOLD": "0.15",
        "AIRFLOW__RABBITMQ_STREAMS__TRIGGERER_GC_FREEZE": str(freeze),
        # the checkout's packages (an editable install) stay importable after the sitecustomize
        "PYTHONPATH": os.pathsep.join(p for p in [str(home / "site"), os.environ.get("PYTHONPATH")] if p),
        "RMQS_BENCH_GC_LOG": str(gc_log),
    }
    airflow(home, env, "dags", "reserialize")  # the asset watchers' triggers into the database
    out = home / "triggerer.log"
    with out.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "triggerer", "--skip-serve-logs"],
            env=env,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = _wait_running(out, watchers, proc)
        gc_log.write_text("")  # start-up's collections are not the steady state's
        mark = len(out.read_text(errors="replace"))
        time.sleep(seconds)
        text = out.read_text(errors="replace")[mark:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stalls = [float(x) for x in _blocked(text)]
    full = [line.split() for line in gc_log.read_text().splitlines() if line.strip()]
    return {
        "watchers": watchers,
        "start_s": started,
        "stalls_s": stalls,
        "full_ms": [float(f[2]) for f in full],
        "heap": [int(f[3]) for f in full],
        "home": str(home),
    }


def migrated_database() -> Path:
    """One migrated SQLite metadata database, copied by every run (a migration takes ~30 s)."""
    home = Path(tempfile.mkdtemp(prefix="rmqs-bench-triggerer-db-"))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    airflow(home, env, "db", "migrate")
    return home / "airflow.db"


def _wait_running(out: Path, watchers: int, proc: subprocess.Popen[bytes]) -> float:
    """Until the runner has started every watcher (Airflow logs each trigger it starts)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        if proc.poll() is not None:
            raise RuntimeError(f"airflow triggerer exited {proc.returncode}: see {out}")
        text = out.read_text(errors="replace")
        started = sum(1 for ln in text.splitlines() if "trigger ID " in ln and " starting" in ln)
        if started >= watchers and "Starting the triggerer" in text:
            time.sleep(2 if watchers == 0 else 5)  # the first poll of every watcher
            return time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError(f"the triggerer did not start {watchers} watchers in 120 s: see {out}")


def _blocked(text: str) -> list[str]:
    marker = "blocked for "
    return [line.split(marker, 1)[1].split()[0] for line in text.splitlines() if marker in line]


def line(r: dict, seconds: float) -> str:
    stalls, full = r["stalls_s"], r["full_ms"]
    stall = f"longest {max(stalls) * 1000 - 100:.0f} ms over the 0.1 s sleep" if stalls else "none"
    collections = (
        f"{len(full)}, {statistics.median(full):.0f} ms median, longest {max(full):.0f} ms "
        f"(heap {max(r['heap']):,} objects)"
        if full
        else "0"
    )
    return (
        f"triggerer, {r['watchers']} watchers, {seconds:.0f} s: loop stalls over 50 ms (Airflow's watchdog) "
        f"{len(stalls)} ({stall}); full collections in the runner {collections}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--watchers", type=int, default=100)
    p.add_argument("--superstreams", type=int, default=2)
    p.add_argument("--partitions", type=int, default=50)
    p.add_argument("--seconds", type=float, default=150)
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--freeze", action="store_true", help="[rabbitmq_streams] triggerer_gc_freeze = True")
    p.add_argument("--no-baseline", action="store_true", help="skip the triggerer without watchers")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still deletes its streams
    conn = connection()
    airflow_connection(conn)
    names = setup(conn, args.partitions, args.superstreams)
    database = migrated_database()
    try:
        runs: list[tuple[int, list[str]]] = [] if args.no_baseline else [(0, [])]
        for watchers, streams in [*runs, (args.watchers, names)]:
            r = run_triggerer(database, watchers, streams, args.seconds, args.poll_interval, args.freeze)
            print(line(r, args.seconds), flush=True)
            print(json.dumps({k: v for k, v in r.items() if k != "heap"}), file=sys.stderr)
    finally:
        client = BrokerClient(conn)
        for name in names:
            client.delete_super_stream(name)


if __name__ == "__main__":
    main()
