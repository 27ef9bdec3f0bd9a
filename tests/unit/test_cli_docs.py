"""docs/cli.md against the typer app: every command, option, environment variable and exit code.

The reference cannot drift from the code: a command or option added to `rmqs` without a line in
docs/cli.md, or an option without help text, fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from pyspark_rmqs.cli.app import app
from pyspark_rmqs.cli.common import CONNECTION_FLAGS, EXIT_ERROR, EXIT_LAG

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "cli.md").read_text()
CONNECTION_OPTIONS = {"--" + name.replace("_", "-") for name in CONNECTION_FLAGS}


def commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    cmd = cmd or typer.main.get_command(app)
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from commands(sub, (*path, name))
    else:
        yield path, cmd


COMMANDS = dict(commands())


def options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "option" and "--help" not in p.opts]


def section(path: tuple[str, ...]) -> str:
    """The text of `### `rmqs PATH`` up to the next heading."""
    heading = f"### `rmqs {' '.join(path)}`"
    assert heading in DOC, f"docs/cli.md has no section {heading}"
    return re.split(r"\n#{2,3} ", DOC.split(heading, 1)[1], maxsplit=1)[0]


def test_the_commands_users_type_exist() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {"lag", "offsets", "peek", "watermark show", "watermark set", "create", "stream delete"} <= names
    assert {"publish", "demo", "broker up", "broker down", "broker status"} <= names


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_command_and_option_is_documented(path: tuple[str, ...]) -> None:
    cmd = COMMANDS[path]
    text = section(path)
    assert cmd.help and cmd.help.split(".")[0] in text
    for opt in options(cmd):
        long = next(o for o in opt.opts if o.startswith("--"))
        if long in CONNECTION_OPTIONS:
            continue
        assert f"`{long}" in text, f"rmqs {' '.join(path)} {long} is missing from its section of docs/cli.md"


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_has_help(path: tuple[str, ...]) -> None:
    for opt in options(COMMANDS[path]):
        assert opt.help and len(opt.help) > 8, f"rmqs {' '.join(path)} {opt.opts} has no help text"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in COMMANDS if p[0] not in ("broker", "demo", "spark-archive", "commits")),
    ids=" ".join,
)
def test_every_broker_command_takes_the_connection_flags(path: tuple[str, ...]) -> None:
    longs = {o for opt in options(COMMANDS[path]) for o in opt.opts}
    assert longs >= CONNECTION_OPTIONS
    envs = {opt.envvar for opt in options(COMMANDS[path]) if opt.envvar}
    assert {
        "RMQS_URI",
        "RMQS_TLS",
        "RMQS_CA_FILE",
        "RMQS_CERT_FILE",
        "RMQS_KEY_FILE",
        "RMQS_TRUST_ALL",
    } <= envs


def test_connection_flags_env_and_exit_codes_are_documented() -> None:
    flags = DOC.split("## Connection flags", 1)[1].split("\n## ", 1)[0]
    cmd = COMMANDS[("lag",)]
    for opt in options(cmd):
        long = next(o for o in opt.opts if o.startswith("--"))
        if long in CONNECTION_OPTIONS:
            assert f"| `{long}` | `{opt.envvar}` |" in flags
    codes = DOC.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in (0, EXIT_ERROR, 2, EXIT_LAG):
        assert f"\n| {code} |" in codes


def test_cli_page_is_in_the_nav() -> None:
    assert "cli.md" in (ROOT / "mkdocs.yml").read_text()


WITH_CONSUMER = sorted(p for p in COMMANDS if any("--consumer" in o.opts for o in options(COMMANDS[p])))


@pytest.mark.parametrize("path", WITH_CONSUMER, ids=" ".join)
def test_consumer_name_is_an_alias_of_consumer(path: tuple[str, ...]) -> None:
    """`--consumer-name` (the spelling of `consumer_name` everywhere else) sets what `--consumer` sets."""
    cmd = COMMANDS[path]
    for flag in ("--consumer", "--consumer-name"):
        ctx = cmd.make_context(" ".join(path), ["--stream", "s", flag, "lake"], resilient_parsing=True)
        assert ctx.params["consumer"] == "lake", (path, flag)
