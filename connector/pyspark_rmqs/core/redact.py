"""The one redaction helper (DESIGN §9): every URI and option value that may reach a message.

Error messages travel far: Spark driver logs, Airflow task logs, Dagster run failures. Two tools:

- `redact_uri` / `redact_option` show a value without its secret, understanding user-info with
  reserved characters (`/ @ : # ? %`), percent-encoding, unicode and malformed URIs. When the
  structure is unclear, more is hidden, never less: everything between `://` and the last `@`
  goes, and a value with no parseable structure goes whole.
- `secrets_in` + `redact_text` / `redacted_errors` are the safety net: the secret values found
  in raw options (passwords, the password inside each `uris` entry) are removed from any message,
  in every spelling they may take there (as typed, percent-encoded or decoded, escaped by repr).

This module must stay import-light: Airflow triggerers and Dagster daemons use it without pyspark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import quote, unquote

from pyspark_rmqs.core.errors import RmqsError

MASK = "***"

SECRET_OPTIONS = frozenset({"password", "tls.truststorePassword", "tls.keystorePassword"})
"""Options whose whole value is secret (a `uris` entry holds one inside)."""

_SECRET_KEYS = frozenset(re.sub(r"[._]", "", name.lower()) for name in SECRET_OPTIONS)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# A user name shown as typed: letters (any script), digits, RFC 3986 unreserved and sub-delims, %XX.
_PLAIN_USER = re.compile(r"(?:[\w.~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*")
_HOST_PORT = re.compile(r"(?:[\w.-]+|\[[0-9A-Fa-f:.]+\])(?::\d*)?")


def redact_uri(uri: str) -> str:
    """`uri` as it may be shown: the password in its user-info (and any doubtful user name) masked.

    `rabbitmq-stream://bob:se/cr3t@h:5552/v` -> `rabbitmq-stream://bob:***@h:5552/v`. Without
    a scheme the value is shown only if it cannot hold credentials (no `@` and no `:`).
    """
    scheme, sep, rest = uri.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return MASK if ("@" in uri or ":" in uri) else uri
    at = rest.rfind("@")  # a password may hold '@', '/', '#', '?': the host follows the last '@'
    if at >= 0:
        return f"{scheme}://{_shown_userinfo(rest[:at])}@{rest[at + 1 :]}"
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if _HOST_PORT.fullmatch(authority):
        return uri
    return f"{scheme}://{MASK}"  # no '@', yet not host:port: 'user:password' without a host, say


def _shown_userinfo(userinfo: str) -> str:
    user, colon, _password = userinfo.partition(":")
    shown_user = user if _PLAIN_USER.fullmatch(user) else MASK
    return f"{shown_user}:{MASK}" if colon else shown_user


def redact_option(name: str, value: str) -> str:
    """An option value as it may be shown: secrets masked whole, `uris` and `endpoints` entries
    without their user-info; any other option's value unchanged."""
    key = name.lower()
    if _is_secret_key(key):
        return MASK
    if key == "uris":
        return ",".join(redact_uri(part) for part in value.split(","))
    if key == "endpoints":
        return ",".join(MASK + part[part.rfind("@") :] if "@" in part else part for part in value.split(","))
    return value


def _is_secret_key(key: str) -> bool:
    return re.sub(r"[._]", "", key.lower()) in _SECRET_KEYS


def secrets_in(options: Mapping[str, object]) -> list[str]:
    """The secret values in raw options (keys in any case, `tls.keystorePassword` or
    `tls_keystore_password`): passwords, and the password of each `uris` / `endpoints` entry."""
    found: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        text = str(value)
        if _is_secret_key(str(key)):
            found.append(text)
        elif str(key).lower() in ("uris", "endpoints"):
            found += [p for part in (text, *text.split(",")) if (p := _userinfo_password(part))]
    return [s for s in dict.fromkeys(found) if s]


def _userinfo_password(uri: str) -> str | None:
    """What follows the first ':' of the user-info (up to the last '@'), or None."""
    rest = uri.partition("://")[2] or uri
    at = rest.rfind("@")
    if at < 0:
        return None
    _user, colon, password = rest[:at].partition(":")
    return password if colon else None


def _spellings(secret: str) -> set[str]:
    """Forms a secret can take in a message: as typed, percent-decoded/-encoded, repr/JSON-escaped."""
    forms = {secret, unquote(secret), quote(secret, safe=""), quote(secret), repr(secret)[1:-1]}
    forms.add(json.dumps(secret)[1:-1])
    return {f for f in forms if f}


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every spelling of every secret replaced by MASK (longest first)."""
    forms = sorted({f for s in secrets if s for f in _spellings(s)}, key=len, reverse=True)
    for form in forms:
        text = text.replace(form, MASK)
    return text


@contextmanager
def redacted_errors(secrets: Iterable[str]) -> Iterator[None]:
    """Re-raise an rmqs error whose message holds one of `secrets` with those parts masked.

    Messages are built to hold no secret; this makes sure of it at the edges where raw options are
    parsed (the cause is dropped: its message may hold the secret too).
    """
    hidden = [s for s in secrets if s]
    try:
        yield
    except RmqsError as e:
        text = str(e)
        clean = redact_text(text, hidden)
        if clean == text:
            raise
        raise type(e)(clean) from None
