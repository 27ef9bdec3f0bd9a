"""Spark's option keys, looked up case-insensitively: unknown keys fail with "did you mean".

Spark hands a data source a case-insensitive dict of strings (lower-cased by the time a Python
data source sees it). `normalize` maps every key to the name users type, drops Spark's own keys,
and fails on an unknown, removed, misplaced or contradictory key. `hiding_secrets` is the net under
every parse function: no error it raises holds a secret of the options it was given.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.redact import redacted_errors, secrets_in

REMOVED_OPTIONS: Mapping[str, str] = {
    "filterValueColumn": "use 'filterValuePath' on the sink instead "
    "(e.g. filterValuePath=application_properties.region)",
    "filterPostFilterClassV2": "use 'filterPostFilterClass' instead",
}
"""Options that were removed (hard cutoff): giving one fails fast with what to use instead."""

# Keys Spark itself puts into a data source's options (not ours to validate).
_SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation", "queryname"})

_P = ParamSpec("_P")
_R = TypeVar("_R")


def hiding_secrets(
    parse: Callable[Concatenate[Mapping[str, str], _P], _R],
) -> Callable[Concatenate[Mapping[str, str], _P], _R]:
    """Wrap a `parse_*` function: no error it raises holds a secret of the options it was given.

    Messages are written without secrets (values go through `redact`); this is the net under them.
    """

    @functools.wraps(parse)
    def parse_hiding_secrets(options: Mapping[str, str], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with redacted_errors(secrets_in(options)):
            return parse(options, *args, **kwargs)

    return parse_hiding_secrets


def _levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def suggest(key: str, candidates: tuple[str, ...]) -> str | None:
    """The closest known option name: difflib's candidates, ranked by edit distance, then length."""
    import difflib  # only for a misspelt option: start-up cost of Spark's per-query Python process

    by_lower = {name.lower(): name for name in candidates}
    wanted = key.lower()
    close = difflib.get_close_matches(wanted, list(by_lower), n=5, cutoff=0.6)
    if not close:
        return None
    best = min(
        close,
        key=lambda c: (
            _levenshtein(wanted, c),
            abs(len(c) - len(wanted)),
            -difflib.SequenceMatcher(None, wanted, c).ratio(),
        ),
    )
    return by_lower[best]


def normalize(
    options: Mapping[str, Any],
    *,
    known: tuple[str, ...],
    context: str,
    ignored: tuple[str, ...] = (),
    elsewhere: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Case-insensitive lookup: canonical option name -> string value; unknown keys fail.

    `ignored` are known names accepted and dropped; `elsewhere` maps a name valid only in another
    context (as users type it) to a phrase saying where it belongs.
    """
    by_lower = {name.lower(): name for name in known}
    ignored_lower = {name.lower() for name in ignored}
    removed = {name.lower(): (name, hint) for name, hint in REMOVED_OPTIONS.items()}
    misplaced = {name.lower(): (name, where) for name, where in (elsewhere or {}).items()}
    result: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for raw_key, raw_value in options.items():
        if raw_value is None:
            continue
        key = str(raw_key).strip()
        lower = key.lower()
        if lower.startswith("spark.") or lower in _SPARK_KEYS:
            continue
        if lower in removed:
            name, hint = removed[lower]
            raise ConfigurationError(f"option '{name}' was removed; {hint}")
        if lower in ignored_lower:
            continue
        if lower not in by_lower:
            if lower in misplaced:
                name, where = misplaced[lower]  # Spark lower-cases keys: show the name users type
                raise ConfigurationError(f"option '{name}' {where}; it is not valid for {context}")
            suggestion = suggest(key, (*known, *ignored))
            if suggestion is not None:
                raise ConfigurationError(f"unknown option '{key}'; did you mean '{suggestion}'?")
            raise ConfigurationError(
                f"unknown option '{key}' for {context}; valid options are: {', '.join(known)}"
            )
        name = by_lower[lower]
        value = raw_value if isinstance(raw_value, str) else str(raw_value)
        if isinstance(raw_value, bool):
            value = value.lower()
        if name in result and result[name] != value:
            raise ConfigurationError(
                f"option '{name}' is given more than once with different values "
                f"(as '{spelled[name]}' and '{key}'); option names are case-insensitive"
            )
        result[name] = value
        spelled[name] = key
    return result
