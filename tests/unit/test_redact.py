"""Secrets never echoed: `pyspark_rmqs.core.redact` and every option parse that builds a message from a
URI or an option value.

Passwords hold the characters that break URI parsing (`/ @ : # ? %`) and unicode; they are given
raw, percent-encoded and in each option that can carry one. The assertion is always the same: no
spelling of the secret (as typed, percent-encoded or decoded) appears in any exception text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.redact import (
    MASK,
    redact_option,
    redact_text,
    redact_uri,
    redacted_errors,
    secrets_in,
)
from pyspark_rmqs.options import parse_connection_options, parse_sink_options, parse_source_options

RESERVED = "/@:#?%"
PASSWORDS = [
    "se/cr3t-Pw",
    "p@ss@w0rd-X",
    "pa:ss:w0rd-Y",
    "h#sh-S3cret",
    "qu?ery-S3cret",
    "50%off-S3cret",
    "%2Fenc0ded-S3cret",
    "ünï/cødé-Pässwörd",
    "all/@:#?%-Of-Them",
]


def spellings(secret: str) -> list[str]:
    return [s for s in {secret, quote(secret, safe=""), unquote(secret)} if len(s) >= 4]


def assert_hidden(text: str, secret: str) -> None:
    for s in spellings(secret):
        assert s not in text, f"{s!r} shown in: {text}"


# --------------------------------------------------------------------------------------------- redact_uri


@pytest.mark.parametrize("password", PASSWORDS)
def test_redact_uri_hides_a_raw_password_with_reserved_characters(password: str) -> None:
    shown = redact_uri(f"rabbitmq-stream://bob:{password}@broker.example:5552/prod")
    assert shown == f"rabbitmq-stream://bob:{MASK}@broker.example:5552/prod"


@pytest.mark.parametrize("password", PASSWORDS)
def test_redact_uri_hides_a_percent_encoded_password(password: str) -> None:
    shown = redact_uri(f"rabbitmq-stream+tls://bob:{quote(password, safe='')}@h:5551/%2F")
    assert shown == f"rabbitmq-stream+tls://bob:{MASK}@h:5551/%2F"


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("rabbitmq-stream://h:5552/v", "rabbitmq-stream://h:5552/v"),  # nothing to hide
        ("rabbitmq-stream://bob@h/v", "rabbitmq-stream://bob@h/v"),  # a user name alone
        ("rabbitmq-stream://[::1]:5552", "rabbitmq-stream://[::1]:5552"),
        ("rabbitmq-stream://bób:pw@h", f"rabbitmq-stream://bób:{MASK}@h"),  # unicode user names show
        ("rabbitmq-stream://b%40b:pw@h", f"rabbitmq-stream://b%40b:{MASK}@h"),
        ("rabbitmq-stream://se/cr3t@h", f"rabbitmq-stream://{MASK}@h"),  # no ':': a doubtful user
        ("rabbitmq-stream://bob:S3cret", f"rabbitmq-stream://{MASK}"),  # no host: not host:port
        ("rabbitmq-stream://bob:S3/cret", f"rabbitmq-stream://{MASK}"),
        ("rabbitmq-stream://h/v@x", f"rabbitmq-stream://{MASK}@x"),  # doubt: more hidden, never less
        ("bob:S3cret@h:5552", MASK),  # no scheme: no structure to trust
        ("S3cret@h", MASK),
        ("bob:S3cret", MASK),
        ("x y://bob:S3cret@h", MASK),  # not a scheme
        ("localhost", "localhost"),  # cannot hold credentials
        ("", ""),
    ],
)
def test_redact_uri_on_odd_and_malformed_values(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    user=st.text(st.characters(codec="utf-8", exclude_characters="@:,"), max_size=8),
    password=st.text(st.characters(codec="utf-8", exclude_characters=","), min_size=10, max_size=24),
    tail=st.sampled_from(["h", "h:5552", "h:5552/v", "[::1]:5551/%2F", "h/v@x", "h?x#y"]),
)
@example(user="bob", password="/@:#?%/@:#?%", tail="h")
def test_redact_uri_never_shows_a_password(user: str, password: str, tail: str) -> None:
    for uri in (f"rabbitmq-stream://{user}:{password}@{tail}", f"{user}:{password}@{tail}"):
        assert password not in redact_uri(uri)
        assert password not in redact_option("uris", uri)


# --------------------------------------------------------------------------------------------- options


def test_redact_option() -> None:
    for name in ("password", "PASSWORD", "tls.keystorePassword", "tls_truststore_password"):
        assert redact_option(name, "S3cret") == MASK
    assert redact_option("uris", "rabbitmq-stream://a:x/y@h1,rabbitmq-stream://a:x/y@h2") == (
        f"rabbitmq-stream://a:{MASK}@h1,rabbitmq-stream://a:{MASK}@h2"
    )
    assert redact_option("endpoints", "bob:S3cret@h:5552,h2:5552") == f"{MASK}@h:5552,h2:5552"
    assert redact_option("stream", "orders") == "orders"


def test_secrets_in_raw_options() -> None:
    found = secrets_in(
        {
            "PassWord": "Pw-1",
            "tls_keystore_password": "Pw-2",
            "tls.truststorePassword": "Pw-3",
            "uris": "rabbitmq-stream://a:Pw/4@h1,rabbitmq-stream://a:Pw/4@h2",
            "endpoints": "u:Pw-5@h",
            "stream": "not-a-secret",
            "vhost": None,
        }
    )
    assert {"Pw-1", "Pw-2", "Pw-3", "Pw/4", "Pw-5"} <= set(found)
    assert not any("not-a-secret" in s for s in found)
    # a ',' in a password splits the list: the whole value's user-info counts too
    assert "Pw,6" in secrets_in({"uris": "rabbitmq-stream://a:Pw,6@h"})


def test_redact_text_hides_every_spelling() -> None:
    secret = "ünï/c@de%x"
    text = f"raw {secret} enc {quote(secret, safe='')} path {quote(secret)} repr {secret!r}"
    clean = redact_text(text, [secret])
    assert_hidden(clean, secret)
    assert clean.startswith("raw *** enc *** path *** repr")


def test_redacted_errors_reraises_the_same_type_without_the_secret() -> None:
    with pytest.raises(ConfigurationError) as e, redacted_errors(["S3cret"]):
        raise ConfigurationError("option 'x' got 'S3cret'")
    assert str(e.value) == "option 'x' got '***'"
    assert e.value.__cause__ is None and e.value.__suppress_context__


Parse = Callable[[Mapping[str, str]], Any]
PARSERS: dict[str, Parse] = {
    "connection": parse_connection_options,
    "source": lambda o: parse_source_options({**o, "stream": "s"}, streaming=False),
    "streaming": lambda o: parse_source_options({**o, "stream": "s"}, streaming=True),
    "sink": lambda o: parse_sink_options({**o, "stream": "s"}),
}


def error_text(parse: Parse, options: Mapping[str, str]) -> str:
    with pytest.raises(ConfigurationError) as e:
        parse(options)
    return str(e.value)


@pytest.mark.parametrize("where", list(PARSERS))
@pytest.mark.parametrize("password", PASSWORDS)
def test_uri_with_a_raw_reserved_password_fails_without_showing_it(where: str, password: str) -> None:
    """The issue's case: `option 'uris' has an invalid URI 'rabbitmq-stream://bob:se/cr3t@...'`."""
    uri = f"rabbitmq-stream://bob:{password}@broker:5552/vhost"
    try:
        parsed = PARSERS[where]({"uris": uri})
    except ConfigurationError as e:
        assert "option 'uris'" in str(e)
        assert_hidden(str(e), password)
        return
    # '@', ':' and '%' alone still parse: the password is then exactly what was typed
    conn = getattr(parsed, "connection", parsed)
    assert conn.password.get_secret_value() == unquote(password)
    assert_hidden(repr(parsed) + str(conn.uris), password)


@pytest.mark.parametrize("where", list(PARSERS))
@pytest.mark.parametrize("password", PASSWORDS)
def test_percent_encoded_password_in_a_uri_round_trips_and_never_shows(where: str, password: str) -> None:
    uri = f"rabbitmq-stream://bob:{quote(password, safe='')}@broker:5552/vhost"
    parsed = PARSERS[where]({"uris": uri})
    conn = getattr(parsed, "connection", parsed)
    assert conn.password.get_secret_value() == password
    assert_hidden(repr(parsed) + str(conn.uris) + str(parsed.model_dump()), password)
    # an unrelated mistake next to it: the message names that, and not the password
    text = error_text(PARSERS[where], {"uris": uri, "vhost": "v", "tls": "maybe"})
    assert "option 'tls'" in text
    assert_hidden(text, password)


@pytest.mark.parametrize("where", list(PARSERS))
@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize(
    "mistake",
    [
        {"tls": "maybe"},
        {"endpoints": "h:notaport"},
        {"tls.keystorePassword": "x"},  # without tls.keystore
        {"uris": "rabbitmq-stream://h:99999"},
    ],
    ids=["bool", "port", "store-password", "uri-port"],
)
def test_password_option_never_shows(where: str, password: str, mistake: dict[str, str]) -> None:
    options = {"endpoints": "h", "password": password, **mistake}
    assert_hidden(error_text(PARSERS[where], options), password)


@pytest.mark.parametrize("password", PASSWORDS)
def test_credentials_typed_into_endpoints_never_show(password: str) -> None:
    text = error_text(parse_connection_options, {"endpoints": f"bob:{password}@h:5552"})
    assert "option 'endpoints'" in text
    assert_hidden(text, password)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    password=st.text(min_size=12, max_size=30).filter(lambda p: any(c in p for c in RESERVED)),
    encode=st.booleans(),
    parser=st.sampled_from(list(PARSERS)),
)
def test_no_password_in_any_parse_error(password: str, encode: bool, parser: str) -> None:
    given_pw = quote(password, safe="") if encode else password
    for options in (
        {"uris": f"rabbitmq-stream://bob:{given_pw}@h:5552/v", "tls": "maybe"},
        {"uris": f"rabbitmq-stream://bob:{given_pw}@h:5552/v"},
        {"endpoints": "h", "password": password, "endpoints ": "x"},
        {"endpoints": "h", "password": password, "minPartitions": "zero"},
    ):
        try:
            PARSERS[parser](options)
        except ConfigurationError as e:
            assert password not in str(e) and given_pw not in str(e)
