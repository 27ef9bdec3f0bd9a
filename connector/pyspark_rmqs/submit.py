"""The spark-submit application of a watermark run: the whole run in the job's driver.

    APP=$(python -c 'import pyspark_rmqs.jobs as j; print(j.APPLICATION)')
    spark-submit --master spark://host:7077 "$APP" \\
        --consumer orders-etl --superstream orders --output /lake/orders --pipeline orders/ingest/<run id>

The broker connection comes from the environment, as the `rmqs` command's (`RMQS_URI`, or
`RMQS_ENDPOINTS` with `RMQS_USERNAME` / `RMQS_PASSWORD` / `RMQS_VHOST`, and the TLS variables), never
from the arguments: anyone who lists processes or reads a spark-submit log sees those.

What it does is `jobs.run_job` (docs/deployment.md, "Cluster jobs"): plan or resume under the
consumer's lease, read, commit the exactly-once output, then store. It prints the run summary as
one line, `RMQS_SUMMARY {json}`, and exits 0; 75 (EX_TEMPFAIL) when the failure is worth retrying
(`errors.classify`: another run holds the consumer, the broker is away...), 1 otherwise; either way
the message on stderr names no secret. With `--dagster-pipes` it runs inside Dagster Pipes
(`dagster_pipes.open_dagster_pipes`, the package the launching `PipesSubprocessClient` talks to)
and reports the summary as the asset's materialization metadata.

A public path where users type it (spark-submit's application file): nothing in pyspark_rmqs
imports it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script (spark-submit's application), Python puts this file's folder first on sys.path:
# the package's own modules (`errors`, `options`, `core`...) would shadow any top-level module of
# that name a library imports (the imports above are the standard library's, which it has none of).
# The installed package is found the ordinary way instead.
_HERE = Path(__file__).resolve().parent
if __name__ == "__main__" and sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    del sys.path[0]

EXIT_RETRYABLE = 75  # EX_TEMPFAIL: the orchestrator's retry policy applies


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pyspark_rmqs/submit.py",
        description="One watermark run of a consumer into an exactly-once file output, in this driver.",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--stream", help="A stream.")
    target.add_argument("--superstream", help="A super stream (all its partitions).")
    p.add_argument("--consumer", required=True, help="The consumer whose stored offset is the watermark.")
    p.add_argument("--output", required=True, help="The exactly-once output folder (local or mounted).")
    p.add_argument("--format", default="parquet", help="The output's Spark file format (default parquet).")
    p.add_argument(
        "--pipeline",
        help="The run identity recorded with the run (e.g. dag/task/run_id): the same on every retry.",
    )
    p.add_argument("--retry-count", type=int, default=0, help="Tries before this one (for the summary).")
    p.add_argument("--max-messages", type=int, help="Cap on the messages one run reads.")
    p.add_argument("--starting-offsets", default="earliest", choices=("earliest", "latest"))
    p.add_argument("--allow-data-loss", action="store_true", help="Skip (and report) what retention removed.")
    p.add_argument("--lease-wait-s", type=float, help="How long to wait for a run holding the consumer.")
    p.add_argument("--dagster-pipes", action="store_true", help="Report to Dagster Pipes (dagster_pipes).")
    return p


def metadata(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as Pipes metadata: scalars as they are, the rest (ranges, extra) as JSON."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if v is None or isinstance(v, bool | int | float | str):
            out[k] = v
        else:
            out[k] = {"raw_value": v, "type": "json"}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run itself: connection from the environment, `jobs.run_job`, the summary as a dict."""
    from pyspark_rmqs.cli.common import flags_from_env
    from pyspark_rmqs.core.redact import redacted_errors
    from pyspark_rmqs.runs.submitted import run_job

    flags = flags_from_env()
    with redacted_errors(flags.secrets()):
        summary = run_job(
            flags.connect(),
            consumer=args.consumer,
            output_path=args.output,
            stream=args.stream,
            superstream=args.superstream,
            output_format=args.format,
            pipeline=args.pipeline,
            retry_count=args.retry_count,
            max_messages=args.max_messages,
            starting_offsets=args.starting_offsets,
            fail_on_data_loss=not args.allow_data_loss,
            lease_wait_s=args.lease_wait_s,
        )
    return summary.to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run, print `RMQS_SUMMARY {json}`; the exit code says whether a retry may help."""
    from pyspark_rmqs.cli.common import flags_from_env
    from pyspark_rmqs.core.errors import classify
    from pyspark_rmqs.core.redact import redact_text

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.dagster_pipes:
            from dagster_pipes import open_dagster_pipes

            with open_dagster_pipes() as pipes:
                summary = run(args)
                pipes.report_asset_materialization(metadata=metadata(summary))
        else:
            summary = run(args)
    except Exception as e:
        c = classify(e)
        print(f"rmqs job failed: {redact_text(c.message, flags_from_env().secrets())}", file=sys.stderr)
        return EXIT_RETRYABLE if c.retryable else 1
    print("RMQS_SUMMARY " + json.dumps(summary, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
