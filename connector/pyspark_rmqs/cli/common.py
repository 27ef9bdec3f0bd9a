"""What every `rmqs` command shares: connection flags, errors without secrets, confirmations.

Each command that talks to the broker is decorated with `connected`: it gains the same connection
and TLS flags (and their `RMQS_*` environment variables), receives one `ConnectionFlags`, and every
error it raises ends as one red line on stderr with exit code 1 (never a traceback, never a
password: messages go through `pyspark_rmqs.core.redact`). Exit codes are constants here so the docs
and the tests name the same numbers.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console

from pyspark_rmqs.core.redact import redact_text, redacted_errors, secrets_in
from pyspark_rmqs.core.target import Target

EXIT_OK = 0
EXIT_ERROR = 1  # a broker, stream, argument or confirmation error (usage errors are 2)
EXIT_LAG = 3  # `rmqs lag --max-lag N`: the total lag is above N

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

# ------------------------------------------------------------------ flags of several commands

StreamOpt = Annotated[str | None, typer.Option("--stream", help="A stream.")]
SuperOpt = Annotated[str | None, typer.Option("--superstream", help="A super stream (all its partitions).")]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", help="Print JSON on stdout instead of a table (a stable shape, see the CLI docs)."
    ),
]
# `--consumer-name` spells it as the operators, assets and options do (`consumer_name`, `consumerName`).
ConsumerOpt = Annotated[
    str,
    typer.Option(
        "--consumer", "--consumer-name", help="The consumer name whose stored offset is the watermark."
    ),
]
YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Do it without asking (needed when stdin is not a terminal).")
]

# --------------------------------------------------------------------------- connection flags

UriOpt = Annotated[
    str | None,
    typer.Option(
        "--uri",
        envvar="RMQS_URI",
        help="Broker URI, rabbitmq-stream://user:pass@host:port/vhost (rabbitmq-stream+tls:// for TLS).",
        show_default=False,
    ),
]
EndpointsOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoints",
        envvar="RMQS_ENDPOINTS",
        help="host:port[,host:port] when no --uri is given (default localhost:5552).",
    ),
]
UserOpt = Annotated[
    str | None, typer.Option("--username", envvar="RMQS_USERNAME", help="User name (default guest).")
]
PasswordOpt = Annotated[
    str | None,
    typer.Option("--password", envvar="RMQS_PASSWORD", show_default=False, help="Password (default guest)."),
]
VhostOpt = Annotated[
    str | None, typer.Option("--vhost", envvar="RMQS_VHOST", help="Virtual host (default /).")
]
TlsOpt = Annotated[
    bool,
    typer.Option("--tls", envvar="RMQS_TLS", help="Connect with TLS (the broker's TLS port, e.g. 5551)."),
]
CaFileOpt = Annotated[
    str | None,
    typer.Option(
        "--ca-file", envvar="RMQS_CA_FILE", help="PEM file of the CA(s) that signed the broker's certificate."
    ),
]
CertFileOpt = Annotated[
    str | None,
    typer.Option("--cert-file", envvar="RMQS_CERT_FILE", help="PEM client certificate (mutual TLS)."),
]
KeyFileOpt = Annotated[
    str | None,
    typer.Option("--key-file", envvar="RMQS_KEY_FILE", help="PEM private key of --cert-file, unencrypted."),
]
TrustAllOpt = Annotated[
    bool,
    typer.Option(
        "--trust-all",
        envvar="RMQS_TRUST_ALL",
        help="Do not verify the broker's certificate or host name (development only; prints a warning).",
    ),
]

CONNECTION_FLAGS: dict[str, tuple[Any, Any]] = {
    "uri": (UriOpt, None),
    "endpoints": (EndpointsOpt, None),
    "username": (UserOpt, None),
    "password": (PasswordOpt, None),
    "vhost": (VhostOpt, None),
    "tls": (TlsOpt, False),
    "ca_file": (CaFileOpt, None),
    "cert_file": (CertFileOpt, None),
    "key_file": (KeyFileOpt, None),
    "trust_all": (TrustAllOpt, False),
}


@dataclass(frozen=True)
class ConnectionFlags:
    """The connection flags of one command line, turned into options on demand."""

    uri: str | None = None
    endpoints: str | None = None
    username: str | None = None
    password: str | None = None
    vhost: str | None = None
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    trust_all: bool = False

    def options(self) -> dict[str, str]:
        """Connector options (`uris` or `endpoints`, credentials, `tls.*`); they hold the password."""
        from pyspark_rmqs.options import ConnectionOptions

        n = ConnectionOptions.alias
        opts: dict[str, str] = {}
        if self.uri:
            opts[n("uris")] = self.uri
        else:
            opts[n("endpoints")] = self.endpoints or "localhost:5552"
        for k, v in (("username", self.username), ("password", self.password), ("vhost", self.vhost)):
            if v is not None:
                opts[n(k)] = v
        tls_on = self.tls or self.trust_all or bool(self.ca_file or self.cert_file)
        if tls_on:
            opts[n("tls")] = "true"
        if self.trust_all:
            opts[n("tls_trust_all")] = "true"
        for k, v in (("tls_ca_file", self.ca_file), ("tls_cert_file", self.cert_file)):
            if v:
                opts[n(k)] = v
        if self.key_file:
            opts[n("tls_key_file")] = self.key_file
        return opts

    def secrets(self) -> list[str]:
        return secrets_in(self.options())

    def connect(self) -> Any:
        """`ConnectionOptions` for the broker clients; warns once on stderr for --trust-all."""
        from pyspark_rmqs.options import parse_connection_options

        if self.trust_all:
            err.print(
                "[bold yellow]warning:[/] --trust-all: the broker's TLS certificate and host name are not "
                "verified; anyone on the network path can impersonate the broker (development only)"
            )
        with redacted_errors(self.secrets()):
            return parse_connection_options(self.options())


def flags_from_env(environ: Mapping[str, str] | None = None) -> ConnectionFlags:
    """The connection the `RMQS_*` variables give (the flags' own variables, nothing on argv).

    For programs that are not `rmqs` commands but take the broker the same way: the spark-submit
    application `pyspark_rmqs/submit.py`, whose arguments any process list shows.
    """
    import typing

    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for name, (annotation, default) in CONNECTION_FLAGS.items():
        (option,) = [m for m in typing.get_args(annotation)[1:] if hasattr(m, "envvar")]
        raw = env.get(str(option.envvar))
        if raw is None or raw == "":
            continue
        found[name] = raw.strip().lower() in ("1", "true", "yes", "on") if isinstance(default, bool) else raw
    return ConnectionFlags(**found)


def fail(message: object, secrets: list[str] | None = None, code: int = EXIT_ERROR) -> NoReturn:
    """One red line on stderr, secrets masked, and exit `code`."""
    text = redact_text(str(message), secrets or [])
    err.print(f"[bold red]rmqs:[/] {text}", markup=True, highlight=False)
    raise typer.Exit(code)


def connected(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the connection flags to a command that takes `conn: ConnectionFlags`; errors exit 1.

    The wrapper's signature is the command's own parameters followed by the connection flags, so
    typer shows them in every command's help, in the same order, with their environment variables.
    """
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "conn"]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        for name, (annotation, default) in CONNECTION_FLAGS.items()
    ]
    hints = typing_hints(fn)

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        flags = ConnectionFlags(**{name: kwargs.pop(name) for name in CONNECTION_FLAGS})
        with guarded(flags.secrets()):
            return fn(conn=flags, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name]) for p in own]
    wrapper.__signature__ = sig.replace(parameters=[*params, *extra])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*params, *extra]}
    del wrapper.__wrapped__  # typer must see the wrapper's signature, not the command's
    return wrapper


def typing_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(fn, include_extras=True)


class guarded:
    """Context: any error becomes `fail(...)` with secrets masked; click's own exits pass through."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = secrets

    def __enter__(self) -> guarded:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or isinstance(exc, typer.Exit | KeyboardInterrupt | SystemExit):
            return False
        # Exits, aborts and usage errors of click (older typer releases use it) or of the click copy
        # current typer vendors (typer._click): matched by module, as rmqs does not depend on click.
        if type(exc).__module__.split(".")[0] in ("click", "typer"):
            return False
        from pyspark_rmqs.core.errors import RmqsError

        if isinstance(exc, RmqsError | OSError | ValueError):
            fail(exc, self.secrets)
        fail(f"unexpected error: {type(exc).__name__}: {exc}", self.secrets)


# ------------------------------------------------------------------------------------ helpers


def target(stream: str | None, superstream: str | None) -> Target:
    """The --stream / --superstream pair as one `Target`; exactly one must be given (else exit 1)."""
    return Target.of(stream, superstream, labels=("--stream", "--superstream"))


def show_watermark(v: int | None) -> str:
    """A watermark in a table: the offset, or '-' when none is stored."""
    return "-" if v is None else str(v)


def print_json(data: Any) -> None:
    """JSON on stdout, nothing else on stdout (progress and warnings go to stderr)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def stdin_is_tty() -> bool:
    """Whether a person can answer a prompt (tests replace this to drive the prompt)."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def confirm(question: str, yes: bool) -> None:
    """Go on with --yes; else ask on a terminal; refuse (exit 1) without one or on 'no'."""
    if yes:
        return
    if not stdin_is_tty():
        fail(f"{question} - refusing without --yes: stdin is not a terminal, so nobody can confirm")
    if not typer.confirm(question, default=False, err=True):
        fail("cancelled: nothing was changed")


def checkout_root() -> Path | None:
    """The rmqs checkout (the folder holding scripts/broker.sh), or None when installed without one.

    Looks beside the installed package (an editable install from a checkout), then in the current
    directory and its parents.
    """
    here = Path(__file__).resolve()  # <checkout>/connector/pyspark_rmqs/cli/common.py
    candidates = [here.parents[3], *[p for p in (Path.cwd(), *Path.cwd().parents)]]
    for root in candidates:
        if (root / "scripts" / "broker.sh").is_file():
            return root
    return None


CHECKOUT_ONLY = "From a checkout of the rmqs repository only (not in the wheel)."
"""Said in the help of `rmqs broker` and `rmqs demo`, which run the checkout's scripts and examples."""


def no_checkout(command: str) -> str:
    """Why `rmqs COMMAND` cannot run here (a wheel install, no checkout), and what to do instead."""
    return (
        f"`rmqs {command}` needs a checkout of the rmqs repository (it runs scripts/broker.sh and the "
        "example DAG and assets from there), and none was found beside the installed package or in the "
        "current directory or its parents. Run it from a checkout (make demo / make broker-up); with rmqs "
        "installed from a wheel, point the other commands at your own broker with --uri or RMQS_URI"
    )
