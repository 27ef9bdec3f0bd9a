"""Open an authenticated stream-protocol connection from `ConnectionOptions`.

Two kinds of connection: to the seeds (the configured addresses, tried in order: metadata calls,
and every connection to a single-node broker), and to one node of a cluster that the Metadata
command named (`node=`; topology.py says which). A node's advertised address is dialled as it is,
or through `addressResolverClass`. A resolver may send every connection through one address (a
load balancer): the connection then lands on whichever node the balancer picked, so the client reads
the node it reached from the connection properties (the broker's `advertised_host` /
`advertised_port`) and reconnects until it is the wanted one, up to `LANDING_ATTEMPTS` times.
Errors become the taxonomy of `errors.py` and name the addresses tried, never the password.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from rstream import exceptions as rx
from rstream import schema

from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.topology import Node, node_of
from pyspark_rmqs.core.errors import AuthenticationError, BrokerUnavailableError, ConfigurationError


class _RedactSaslFrames(logging.Filter):
    """rstream logs each frame it sends at DEBUG, SaslAuthenticate included: with the password."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, schema.SaslAuthenticate) for a in args):
            record.args = tuple(
                "SaslAuthenticate(<redacted>)" if isinstance(a, schema.SaslAuthenticate) else a for a in args
            )
        return True


logging.getLogger("rstream.client").addFilter(_RedactSaslFrames())

log = logging.getLogger(__name__)
_warned_trust_all = False
LANDING_ATTEMPTS = 20
"""Connections through a resolved address (a load balancer) until one lands on the wanted node."""
LANDING_PAUSE_S = 0.05


def ssl_context(conn: Any) -> ssl.SSLContext | None:
    """An SSL context for `tls=true` (PEM files; a JKS truststore is converted, see tls.py)."""
    if not getattr(conn, "tls", False):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if getattr(conn, "tls_trust_all", False):
        global _warned_trust_all
        if not _warned_trust_all:
            _warned_trust_all = True
            log.warning(
                "tls.trustAll=true: the broker's TLS certificate and host name are not verified; "
                "anyone on the network path can impersonate the broker (use it for development only)"
            )
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ca = getattr(conn, "tls_ca_file", None)
    if ca:
        ctx.load_verify_locations(cafile=ca)
    truststore = getattr(conn, "tls_truststore", None)
    if truststore:
        from pyspark_rmqs.broker.tls import truststore_pem

        ctx.load_verify_locations(cadata=truststore_pem(truststore, _secret(conn, "tls_truststore_password")))
    cert = getattr(conn, "tls_cert_file", None)
    if cert:
        ctx.load_cert_chain(cert, getattr(conn, "tls_key_file", None) or None)
    keystore = getattr(conn, "tls_keystore", None)
    if keystore:
        from pyspark_rmqs.broker.tls import load_keystore

        load_keystore(ctx, keystore, _secret(conn, "tls_keystore_password"))
    return ctx


def _secret(conn: Any, name: str) -> str | None:
    v = getattr(conn, name, None)
    if v is None:
        return None
    return v.get_secret_value() if hasattr(v, "get_secret_value") else str(v)


async def connect(conn: Any, name: str = "rmqs", node: Node | None = None) -> RmqsClient:
    """A started, authenticated client on the first reachable seed, or on `node` when given."""
    if node is not None:
        return await _connect_node(conn, node, name)
    errors: list[str] = []
    ctx = ssl_context(conn)
    for host, port in _addresses(conn):
        client = await _open(conn, host, port, name, ctx, errors)
        if client is not None:
            return client
    if not errors:
        raise ConfigurationError("no broker address: set the 'endpoints' or 'uris' option")
    raise BrokerUnavailableError("could not connect to RabbitMQ Streams at " + ", ".join(errors))


async def _connect_node(conn: Any, node: Node, name: str) -> RmqsClient:
    """A client on `node`: its advertised address, or what `addressResolverClass` maps it to; in the
    latter case only a connection whose broker says it is `node` is kept (a load balancer)."""
    ctx = ssl_context(conn)
    resolver = _resolver(conn)
    host, port = resolver.resolve(node.host, node.port) if resolver is not None else (node.host, node.port)
    errors: list[str] = []
    landed: list[str] = []
    for _ in range(LANDING_ATTEMPTS if resolver is not None else 1):
        client = await _open(conn, host, port, name, ctx, errors)
        if client is None:
            break
        reached = node_of(client.server_properties)
        if resolver is None or reached is None or reached == node:
            if reached is None and resolver is not None:
                log.debug("%s:%s advertises no host and port: cannot check it is %s", host, port, node)
            return client
        landed.append(str(reached))
        await _close_quietly(client)
        await asyncio.sleep(LANDING_PAUSE_S)
    if landed:
        raise BrokerUnavailableError(
            f"connections to {host}:{port} (node {node} through addressResolverClass) landed on "
            f"{', '.join(sorted(set(landed)))}, never on {node}, in {len(landed)} attempts: the load "
            "balancer must spread connections over every node, or the resolver must map each node to "
            "an address that reaches it"
        )
    where = f"node {node}" + (f" (through addressResolverClass: {host}:{port})" if resolver else "")
    raise BrokerUnavailableError(f"could not connect to {where}: " + ", ".join(errors))


async def _open(
    conn: Any, host: str, port: int, name: str, ctx: ssl.SSLContext | None, errors: list[str]
) -> RmqsClient | None:
    """A started, authenticated client at host:port; None (with the reason in `errors`) when the
    address does not answer. Refused credentials and virtual hosts raise: no other address helps."""
    username = conn.username
    password = _secret(conn, "password") or ""
    client = RmqsClient(host, port, ssl_context=ctx, connection_name=name)
    try:
        await client.start()
        await client.authenticate(vhost=conn.vhost, username=username, password=password)
        return client
    except (rx.AuthenticationFailure, rx.SASLAuthenticationFailureLoopback) as e:
        await _close_quietly(client)
        raise AuthenticationError(
            f"the broker at {host}:{port} refused user '{username}' (check username and password)"
        ) from e
    except rx.VirtualHostAccessFailure as e:
        await _close_quietly(client)
        raise AuthenticationError(
            f"user '{username}' has no access to virtual host '{conn.vhost}' on {host}:{port} "
            "(the virtual host does not exist, or the user has no permissions there)"
        ) from e
    except ssl.SSLCertVerificationError as e:
        await _close_quietly(client)
        detail = e.verify_message or e.reason
        errors.append(f"{host}:{port} (TLS certificate verification failed: {detail})")
    except ssl.SSLError as e:
        await _close_quietly(client)
        reason = str(e.reason or e)
        if "ALERT" in reason and ("_CA" in reason or "CERTIFICATE" in reason):
            reason += "; the broker refused the client certificate (tls.certFile / tls.keystore)"
        errors.append(f"{host}:{port} (TLS: {reason})")
    except ConnectionRefusedError:
        await _close_quietly(client)
        errors.append(f"{host}:{port} (connection refused)")
    except (OSError, ConnectionError, TimeoutError, rx.ServerError) as e:
        await _close_quietly(client)
        errors.append(f"{host}:{port} ({_describe(e, tls=ctx is not None)})")
    return None


def _describe(e: BaseException, *, tls: bool) -> str:
    """What went wrong at one address, with a hint when TLS and plain ports look mixed up."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if tls and isinstance(e, ConnectionResetError):
        text += "; reset during the TLS handshake: is this a TLS port?"
    elif not tls and isinstance(e, TimeoutError):
        text += "; no answer to the handshake: if this is a TLS port, set tls=true"
    return text


def _addresses(conn: Any) -> list[tuple[str, int]]:
    """Configured addresses, mapped through `addressResolverClass` (load balancers, NAT) when set."""
    addresses = list(conn.addresses())
    resolver = _resolver(conn)
    if resolver is None:
        return addresses
    return [resolver.resolve(h, p) for h, p in addresses]


def _resolver(conn: Any) -> Any:
    """The `addressResolverClass` instance, or None when the option is not set."""
    path = getattr(conn, "address_resolver_class", None)
    if not path:
        return None
    from pyspark_rmqs.core.extensions import AddressResolver, load
    from pyspark_rmqs.options import ConnectionOptions

    return load(path, ConnectionOptions.alias("address_resolver_class"), AddressResolver)


async def _close_quietly(client: RmqsClient) -> None:
    try:
        await client.close()
    except Exception:
        pass
