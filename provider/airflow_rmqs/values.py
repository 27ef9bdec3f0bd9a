"""Coerce rendered template values into what `pyspark_rmqs.runs.steps` expects.

Jinja renders everything to strings: `{{ params.start }}` gives `'{"orders-0": 5}'` (or the
Python repr of a dict), `{{ data_interval_start }}` gives `'2024-01-01 00:00:00+00:00'`. These
helpers turn such strings back into offsets, timestamps, ints and dicts, and raise
`ConfigurationError` (never retried) naming the parameter when they cannot.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pyspark_rmqs.broker.positions import Position
from pyspark_rmqs.errors import ConfigurationError

_WORDS = ("watermark", "earliest", "latest")


def _object(text: str, name: str) -> dict[str, Any]:
    """A JSON object, or a dict's Python repr (what a rendered dict Param looks like)."""
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigurationError(f"'{name}' is not a JSON object: {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"'{name}' must be a JSON object; got {text[:80]!r}")
    return value


def _timestamp(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def position(value: Any, name: str, default: str) -> Position:
    """A start or end: 'watermark'/'earliest'/'latest', per-stream offsets, or a timestamp.

    Offsets (a dict or a JSON object string) go to the planner as JSON, which validates them; a
    datetime or an ISO-8601 string is a timestamp (naive = UTC); an int is epoch milliseconds.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, datetime):
        return _timestamp(value)
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ConfigurationError(
            f"'{name}' must be a string, offsets or a timestamp; got {type(value).__name__}"
        )
    text = value.strip()
    if text.lower() in _WORDS:
        return text.lower()
    if text.startswith("{"):
        return json.dumps(_object(text, name))
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return _timestamp(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        pass
    raise ConfigurationError(
        f"'{name}' must be one of {', '.join(_WORDS)}, offsets JSON like "
        f'{{"orders-0": 1200}}, an ISO-8601 timestamp or epoch milliseconds; got {text[:80]!r}'
    )


def options(value: Any, name: str) -> dict[str, str]:
    """A dict of option strings from a dict or a rendered JSON object (None -> {})."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = _object(value.strip(), name)
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"'{name}' must be a dict of options; got {type(value).__name__}")
    return {str(k): ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in value.items()}


def optional_int(value: Any, name: str, minimum: int = 1) -> int | None:
    """An int from an int or a rendered string; None, '' and 'None' mean unset."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"'{name}' must be an integer; got {value!r}") from None
    if number < minimum:
        raise ConfigurationError(f"'{name}' must be at least {minimum}; got {number}")
    return number


def optional_str(value: Any) -> str | None:
    """A rendered optional string: '' and 'None' (what Jinja makes of None) mean unset."""
    if value is None:
        return None
    text = str(value).strip()
    return None if text in ("", "None") else text
