"""`rmqs`: look at streams, lag, offsets and messages; move watermarks; create, delete and publish.

Every command that talks to the broker takes the same connection flags (--uri, --endpoints,
--username, --password, --vhost, --tls, --ca-file, --cert-file, --key-file, --trust-all) or their
environment variables (RMQS_URI, RMQS_ENDPOINTS, ..., RMQS_TRUST_ALL); the default is the local
broker on localhost:5552. Exit codes: 0 success, 1 an error, 2 a usage error, 3 lag above --max-lag.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from pyspark_rmqs import __version__
from pyspark_rmqs.cli import commits as cli_commits
from pyspark_rmqs.cli import peek as cli_peek
from pyspark_rmqs.cli import streams as cli_streams
from pyspark_rmqs.cli import watermark as cli_watermark
from pyspark_rmqs.cli.common import CHECKOUT_ONLY, checkout_root, fail, no_checkout
from pyspark_rmqs.cli.sample import sample_orders, send_records

__all__ = ["app", "main", "sample_orders", "send_records"]

_HELP = "\n\n".join(" ".join(paragraph.split()) for paragraph in (__doc__ or "").split("\n\n"))
app = typer.Typer(add_completion=True, no_args_is_help=True, help=_HELP)
# `broker` and `demo` run the checkout's scripts and examples: listed in `rmqs --help` only where a
# checkout is found (an installed wheel hides them), and their help says so wherever they are listed.
_IN_CHECKOUT = checkout_root() is not None
broker_app = typer.Typer(
    no_args_is_help=True, help=f"Install, start and stop the local RabbitMQ 4.0 broker. {CHECKOUT_ONLY}"
)
watermark_app = typer.Typer(no_args_is_help=True, help="Show or move a consumer's watermark (stored offset).")
stream_app = typer.Typer(no_args_is_help=True, help="Manage streams and super streams.")
commits_app = typer.Typer(
    no_args_is_help=True, help="The commit history of an exactly-once output folder (no broker)."
)
app.add_typer(broker_app, name="broker", hidden=not _IN_CHECKOUT)
app.add_typer(watermark_app, name="watermark")
app.add_typer(stream_app, name="stream")
app.add_typer(commits_app, name="commits")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"rmqs {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the rmqs version and exit."
        ),
    ] = False,
) -> None:
    pass


# The command tree: each command lives with what it shows or changes (cli_watermark: a consumer's
# watermark and lag; cli_peek: messages; cli_streams: the streams themselves); this is its index.
app.command("lag")(cli_watermark.lag_command)
app.command("offsets")(cli_streams.offsets_command)
app.command("peek")(cli_peek.peek_command)
watermark_app.command("show")(cli_watermark.show_command)
watermark_app.command("set")(cli_watermark.set_command)
app.command("create")(cli_streams.create_command)
stream_app.command("delete")(cli_streams.delete_command)
app.command("publish")(cli_streams.publish_command)
commits_app.command("expire")(cli_commits.expire_command)


# ----------------------------------------------------------------------------- broker and demo


def _broker_script() -> Path:
    root = checkout_root()
    if root is None:
        fail(no_checkout("broker"))
    return root / "scripts" / "broker.sh"


def _broker(action: str) -> None:
    rc = subprocess.call(["bash", str(_broker_script()), action])
    raise typer.Exit(rc)


@broker_app.command("up")
def broker_up() -> None:
    """Install (once) and start a local RabbitMQ 4.0 on loopback (stream 5552, management 15672)."""
    _broker("up")


@broker_app.command("down")
def broker_down() -> None:
    """Stop the local broker (only the processes this project started)."""
    _broker("down")


@broker_app.command("status")
def broker_status() -> None:
    """Is the local broker running? (exit code 3 when it is not)"""
    proc = subprocess.run(["bash", str(_broker_script()), "status"], capture_output=True, text=True)
    typer.echo((proc.stdout + proc.stderr).strip())
    raise typer.Exit(proc.returncode)


@app.command("spark-archive")
def spark_archive(
    path: Annotated[
        Path | None,
        typer.Option(
            "--path",
            show_default=False,
            help="Where to write it (default: RMQS_SPARK_CLASS_ARCHIVE, else ~/.cache/rmqs/).",
        ),
    ] = None,
    compiled_pyspark: Annotated[
        bool,
        typer.Option(
            "--compiled-pyspark",
            help="Also make Spark's Python processes in this environment import its compiled pyspark "
            "instead of pyspark.zip's sources (a .pth in site-packages; every Spark session here).",
        ),
    ] = False,
) -> None:
    """Dump a class-data archive of Spark's classes for the local sessions rmqs starts.

    Run it once where the tasks run (when the image or virtualenv is built): the driver JVM of every
    later local session of the Airflow operators and Dagster's SparkSessionResource maps Spark's
    classes from it instead of loading them, which cuts the JVM's start. Needs pyspark and Java.
    With --compiled-pyspark, every Python process Spark starts here skips compiling pyspark from
    its zip (0.8-0.9 s of CPU each, four of them before a cold read's first row).
    """
    from pyspark_rmqs.spark import jvm  # finds Spark's jars; imports no pyspark

    if compiled_pyspark:
        from pyspark_rmqs.spark import pythonpath

        try:
            copy = pythonpath.install()
        except OSError as e:
            fail(str(e))
        typer.echo(f"rmqs: wrote {copy} and its .pth: Spark's Python processes here import compiled pyspark")
    try:
        done = jvm.dump_archive(path)
    except (RuntimeError, OSError) as e:
        fail(str(e))
    typer.echo(f"rmqs: wrote {done}; local sessions rmqs starts use it while Spark is not reinstalled")


@app.command(hidden=not _IN_CHECKOUT)
def demo(
    uri: Annotated[
        str | None,
        typer.Option(
            "--uri", envvar="RMQS_URI", show_default=False, help="Broker URI (default: the local broker)."
        ),
    ] = None,
) -> None:
    """Run the end-to-end demo (what `make demo` runs once the environment is set up).

    From a checkout of the rmqs repository only (not in the wheel).
    """
    root = checkout_root()
    if root is None or not (root / "dags").is_dir():
        fail(no_checkout("demo"))
    env = dict(os.environ)
    if uri:
        env["RMQS_URI"] = uri
    # The demo runs in its own process: demo uses the CLI's pieces, never the reverse.
    raise typer.Exit(subprocess.call([sys.executable, "-m", "pyspark_rmqs.cli.demo"], cwd=root, env=env))


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    app()


if __name__ == "__main__":
    main()
