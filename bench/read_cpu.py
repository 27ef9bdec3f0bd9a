"""Where the machine's CPU goes during a warm Spark read: the JVM, Spark's Python workers, the broker.

    .venv/bin/python -m bench.read_cpu [--messages N] [--batches 100,1000,10000] [--rounds 2]

For each publish-batch size B (rstream `send_batch`, as `bench.spark_read`), a 2-partition super
stream of N 100-byte messages is read into the `noop` sink (fixed columns) by one warm local session,
`--rounds` times; each read prints its wall time and the CPU seconds (user + system, from /proc) that
every `java` process, every Spark Python process and the local broker used over it. On a 2-core
machine their sum against twice the wall time says whether the read waits or the machine is full
(docs/operations.md, cold reads: the warm targets).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import connection, fill_batches, spark_session, temp_super_stream
from bench.spark_read import _spark_read, spread


def cpu_s(matches: Callable[[str], bool]) -> float:
    """CPU seconds so far of the processes whose command line `matches`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not matches(cmd):
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


KINDS: dict[str, Callable[[str], bool]] = {
    "JVM": lambda cmd: cmd.split(" ")[0].endswith("/java"),
    "Python workers": lambda cmd: "pyspark.daemon" in cmd or "pyspark.worker" in cmd,
    "broker": lambda cmd: "beam.smp" in cmd,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batches", default="100,1000,10000")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    conn = connection()
    spark = spark_session("rmqs-bench-read-cpu")
    cores = os.cpu_count() or 1
    for b in (int(x) for x in args.batches.split(",")):
        with temp_super_stream(conn, 2, f"bench-read-cpu-{b}") as (name, parts):
            fill_batches(conn, spread(parts, args.messages), args.messages, b)
            _spark_read(spark, name, "")  # warm-up: the JVM compiles the read's code
            for _ in range(args.rounds):
                before = {k: cpu_s(f) for k, f in KINDS.items()}
                t = time.perf_counter()
                rows = _spark_read(spark, name, "")
                wall = time.perf_counter() - t
                used = {k: cpu_s(f) - before[k] for k, f in KINDS.items()}
                assert rows == args.messages, f"read {rows:,} of {args.messages:,}"
                spent = ", ".join(f"{k} {v:.2f} s" for k, v in used.items())
                print(
                    f"warm read B={b}: {rows:,} in {wall:.2f} s; CPU {spent}; "
                    f"{sum(used.values()) / (wall * cores):.0%} of {cores} cores",
                    flush=True,
                )


if __name__ == "__main__":
    main()
