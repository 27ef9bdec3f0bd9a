"""docs/options.md's option tables, rendered from the option models (so docs and code cannot drift).

`render(model)` is one table: every option of the model, its default, its doc line with its valid
range, and the broker version it needs. tests/unit/test_docs.py fails when docs/options.md differs;
`python -m pyspark_rmqs.options.reference docs/options.md` rewrites the tables in place.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from pyspark_rmqs.options.connection import ConnectionOptions
from pyspark_rmqs.options.fields import LONG_MAX, OptionModel, bounds, extra, plain_type
from pyspark_rmqs.options.sink import SinkOptions
from pyspark_rmqs.options.source import SourceOptions

TABLES: dict[str, type[OptionModel]] = {
    "connection": ConnectionOptions,
    "source": SourceOptions,
    "sink": SinkOptions,
}
"""Marker name in docs/options.md (`<!-- options:NAME -->`) -> the model whose table goes there."""

_BLOCK = re.compile(r"(<!-- options:(\w+) -->\n)(.*?)(<!-- /options:\2 -->)", re.S)


def shown_default(info: FieldInfo) -> str:
    """The default as the docs write it: `30000`, `true`, `guest`, or — for none."""
    if "shown" in extra(info):
        return str(extra(info)["shown"])
    value = info.get_default(call_default_factory=True)
    if value is None or value == [] or value == ():
        return "—"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"`{value}`"


def shown_range(info: FieldInfo) -> str:
    """An integer option's range as the docs write it: `1 to 65,535`, or `≥ 0`; "" otherwise."""
    if plain_type(info) is not int:
        return ""
    lo, hi = bounds(info)
    return f"≥ {lo}" if hi == LONG_MAX else f"{lo:,} to {hi:,}"


def row(name: str, info: FieldInfo) -> str:
    doc = info.description or ""
    valid = shown_range(info)
    if valid:
        doc = f"{doc} ({valid})"
    broker = extra(info).get("broker")
    return f"| `{name}` | {shown_default(info)} | {doc} | {broker + ' |' if broker else '|'}"


def render(model: type[OptionModel]) -> str:
    """The markdown table of every option of `model`."""
    lines = ["| option | default | meaning and validation | broker |", "|---|---|---|---|"]
    lines += [row(name, info) for name, info in model.option_fields().items()]
    return "\n".join(lines) + "\n"


def rewrite(text: str) -> str:
    """`text` (docs/options.md) with every marked table rendered afresh."""
    return _BLOCK.sub(lambda m: m.group(1) + render(TABLES[m.group(2)]) + m.group(4), text)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/options.md")
    path.write_text(rewrite(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
