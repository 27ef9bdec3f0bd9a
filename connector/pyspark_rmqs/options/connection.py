"""The connection options' table (`ConnectionOptions`), their URI and endpoint parsing, their rules.

Shared by reads, writes, the Airflow connection, the Dagster resource and the CLI. Secrets
(`password`, the store passwords, the password inside a `uris` entry) are kept in `SecretStr` and
never appear in an error message or a repr.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Self
from urllib.parse import unquote, urlsplit

from pydantic import SecretStr, model_validator

from pyspark_rmqs.core.redact import redact_option, redact_uri
from pyspark_rmqs.options.fields import OptionModel, Reader, build, err, option, show, split_list

DEFAULT_PORT = 5552
DEFAULT_TLS_PORT = 5551
URI_SCHEMES = ("rabbitmq-stream", "rabbitmq-stream+tls")

_TLS_FILES = ("tls_truststore", "tls_keystore", "tls_ca_file", "tls_cert_file", "tls_key_file")
_STORE_PASSWORDS = {"tls_truststore_password": "tls_truststore", "tls_keystore_password": "tls_keystore"}


class ConnectionOptions(OptionModel):
    """Where and how to connect. `uris` wins over `endpoints` when both are given.

    `uris` keeps each given URI with its password removed (the password lives in `password`), so
    nothing printed or dumped from this model shows a secret.
    """

    endpoints: list[tuple[str, int]] = option(
        "endpoints",
        None,
        "`host:port` list, comma-separated (port 5552, or 5551 with TLS; IPv6 as `[::1]:5552`). "
        "One of `endpoints` / `uris` is required.",
        kind="parsed",
        factory=list,
    )
    uris: list[str] = option(
        "uris",
        None,
        "`rabbitmq-stream://user:pass@host:port/vhost` list; `rabbitmq-stream+tls://` turns TLS on. "
        "Wins over `endpoints`; its credentials and vhost override the options below. All URIs must "
        "share scheme, credentials and vhost. Percent-encode reserved characters in the user name and "
        "password (`/` as `%2F`, `@` as `%40`, `#` as `%23`, `?` as `%3F`, `%` as `%25`, `,` as "
        "`%2C`); a URI that does not parse fails naming `uris`, with its user-info hidden.",
        kind="parsed",
        factory=list,
    )
    username: str = option("username", "guest", "user name")
    password: SecretStr = option(
        "password", SecretStr("guest"), "password; never printed in errors, logs or reprs", shown="`guest`"
    )
    vhost: str = option("vhost", "/", "virtual host")
    tls: bool = option("tls", False, "TLS on the stream protocol; the `tls.*` options need it")
    tls_truststore: str | None = option(
        "tls.truststore", None, "a JKS / PKCS12 truststore, converted with `keytool`"
    )
    tls_truststore_password: SecretStr | None = option(
        "tls.truststorePassword", None, "the truststore's password; never printed"
    )
    tls_keystore: str | None = option("tls.keystore", None, "a PKCS12 client keystore")
    tls_keystore_password: SecretStr | None = option(
        "tls.keystorePassword", None, "the keystore's password; never printed"
    )
    tls_trust_all: bool = option("tls.trustAll", False, "accept any server certificate (development only)")
    tls_ca_file: str | None = option("tls.caFile", None, "CA certificates (PEM) to trust")
    tls_cert_file: str | None = option("tls.certFile", None, "client certificate (PEM)")
    tls_key_file: str | None = option("tls.keyFile", None, "client key (PEM), with `tls.certFile`")
    address_resolver_class: str | None = option(
        "addressResolverClass",
        None,
        "dotted path of a class with `resolve(host, port) -> (host, port)`, applied to every address "
        "before connecting, the seeds and the nodes the metadata names (load balancers, NAT: the client "
        "then checks the node it reached); no-argument constructor, importable on executors",
        kind="class",
    )

    @model_validator(mode="after")
    def _rules(self) -> Self:
        n = self.alias
        if not self.uris and not self.endpoints:
            raise err(
                f"one of the options '{n('endpoints')}' (comma-separated host:port) or '{n('uris')}' "
                "(comma-separated rabbitmq-stream://user:password@host:port/vhost) is required"
            )
        enabling = [n(f) for f in _TLS_FILES if getattr(self, f) is not None]
        enabling += [n(f) for f in _STORE_PASSWORDS if getattr(self, f) is not None]
        if self.tls_trust_all:
            enabling.append(n("tls_trust_all"))
        if enabling and not self.tls:
            raise err(
                f"option '{enabling[0]}' needs TLS: set option '{n('tls')}' to true "
                f"(or use rabbitmq-stream+tls:// in '{n('uris')}')"
            )
        for password, store in _STORE_PASSWORDS.items():
            if getattr(self, password) is not None and getattr(self, store) is None:
                raise err(f"option '{n(password)}' is set but option '{n(store)}' is not")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise err(f"option '{n('tls_key_file')}' is set but option '{n('tls_cert_file')}' is not")
        return self

    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) to connect to: from `uris` when present, else from `endpoints`."""
        if self.uris:
            return [_uri_address(uri) for uri in self.uris]
        return list(self.endpoints)

    def to_options(self) -> dict[str, str]:
        """Back to Spark options (secrets included): what a job hands `spark.read.options(...)`.

        The result holds the password: pass it to Spark, never log or return it.
        """
        out: dict[str, str] = {}
        for field, option_name in self.OPTION_NAMES.items():
            value = getattr(self, field)
            if value is None or value == [] or (field == "tls_trust_all" and not value):
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if field == "endpoints":
                value = ",".join(f"{h}:{p}" for h, p in value)
            elif field == "uris":
                value = ",".join(value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            out[option_name] = str(value)
        if self.uris:
            out.pop(self.alias("endpoints"), None)
        return out

    def cache_key(self) -> tuple[Any, ...]:
        """A hashable identity of this configuration, secrets included, for a connection pool.

        It contains secret values: use it as a key only, never print or log it.
        """

        def reveal(secret: SecretStr | None) -> str | None:
            return None if secret is None else secret.get_secret_value()

        return (
            tuple(self.addresses()),
            self.username,
            reveal(self.password),
            self.vhost,
            self.tls,
            self.tls_truststore,
            reveal(self.tls_truststore_password),
            self.tls_keystore,
            reveal(self.tls_keystore_password),
            self.tls_trust_all,
            self.tls_ca_file,
            self.tls_cert_file,
            self.tls_key_file,
            self.address_resolver_class,
        )


CONNECTION_OPTIONS = ConnectionOptions.OPTION_NAMES
"""Field name -> the option name users type, for every connection option."""


def _uri_address(uri: str) -> tuple[str, int]:
    parts = urlsplit(uri)
    default = DEFAULT_TLS_PORT if parts.scheme.lower().endswith("+tls") else DEFAULT_PORT
    return parts.hostname or "", parts.port or default


class _ParsedUri(NamedTuple):
    shown: str  # the URI without its password
    tls: bool
    user: str | None
    password: str | None
    vhost: str | None


def _parse_uri(entry: str) -> _ParsedUri:
    name = ConnectionOptions.alias("uris")
    shown = redact_uri(entry)
    expected = "rabbitmq-stream://user:password@host:port/vhost (or rabbitmq-stream+tls://...)"
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError:
        raise err(f"option '{name}' has an invalid URI {shown!r}; expected {expected}") from None
    scheme = parts.scheme.lower()
    if scheme not in URI_SCHEMES:
        raise err(
            f"option '{name}' has an invalid URI {shown!r}: the scheme must be one of "
            f"{', '.join(URI_SCHEMES)}; expected {expected}"
        )
    if not parts.hostname:
        raise err(f"option '{name}' has a URI without a host {shown!r}; expected {expected}")
    if port is not None and not 1 <= port <= 65535:
        raise err(f"option '{name}' has a port outside 1..65535 in {shown!r}")
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else None
    # Keep the URI without its password: the password is carried as a SecretStr.
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{host}:{port}" if port is not None else host
    if parts.username is not None:
        netloc = f"{parts.username}@{netloc}"
    clean = f"{scheme}://{netloc}{parts.path}"
    return _ParsedUri(clean, scheme.endswith("+tls"), user, password, vhost)


def _parse_endpoint(entry: str, default_port: int) -> tuple[str, int]:
    name = ConnectionOptions.alias("endpoints")
    expected = "comma-separated host:port (port defaults to 5552, 5551 with tls; IPv6 as [::1]:5552)"
    shown = show(redact_option(name, entry))  # `user:password@` typed by mistake stays hidden
    host, port_text = entry, None
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise err(f"option '{name}' has an invalid entry {shown}; expected {expected}")
        host, rest = entry[1:end], entry[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise err(f"option '{name}' has an invalid entry {shown}; expected {expected}")
            port_text = rest[1:]
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
    elif entry.count(":") > 1:
        raise err(
            f"option '{name}' has an invalid entry {shown}; write IPv6 hosts in brackets, like [::1]:5552"
        )
    host = host.strip()
    if not host:
        raise err(f"option '{name}' has an entry without a host {shown}; expected {expected}")
    if port_text is None:
        return host, default_port
    port_text = port_text.strip()
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise err(
            f"option '{name}' has an invalid port in {shown}; the port must be an integer between 1 and 65535"
        )
    return host, int(port_text)


def connection_from(values: dict[str, str]) -> ConnectionOptions:
    """The connection options among normalized `values`; the `tls.*` and address rules checked."""
    r = Reader(values, ConnectionOptions)
    fields = r.given()
    explicit_tls: bool | None = fields.get("tls")
    parsed = [_parse_uri(entry) for entry in split_list(r.raw("uris") or "")]
    uri_tls = False
    if parsed:
        uris = r.name("uris")
        if len({p.tls for p in parsed}) > 1:
            raise err(f"option '{uris}' mixes schemes; use one of {', '.join(URI_SCHEMES)} for all entries")
        if len({(p.user, p.password, p.vhost) for p in parsed}) > 1:
            raise err(f"option '{uris}' entries must all use the same credentials and virtual host")
        uri_tls = parsed[0].tls
        if uri_tls and explicit_tls is False:
            raise err(
                f"option '{r.name('tls')}' is false but option '{uris}' uses rabbitmq-stream+tls://; "
                "remove one"
            )
        first = parsed[0]
        if first.user is not None:
            fields["username"] = first.user
        if first.password is not None:
            fields["password"] = SecretStr(first.password)
        if first.vhost is not None:
            fields["vhost"] = first.vhost
    fields["tls"] = uri_tls or bool(explicit_tls)
    default_port = DEFAULT_TLS_PORT if fields["tls"] else DEFAULT_PORT
    endpoints = [_parse_endpoint(entry, default_port) for entry in split_list(r.raw("endpoints") or "")]
    return build(ConnectionOptions, **fields, endpoints=endpoints, uris=[p.shown for p in parsed])
