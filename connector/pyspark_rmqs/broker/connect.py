"""Open an authenticated stream-protocol connection from `ConnectionOptions`.

Addresses are tried in order; errors become the taxonomy of `errors.py` and name the addresses
tried, never the password.
"""

from __future__ import annotations

import ssl
from typing import Any

from rstream import exceptions as rx

from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.errors import AuthenticationError, BrokerUnavailableError, ConfigurationError


def ssl_context(conn: Any) -> ssl.SSLContext | None:
    """An SSL context for `tls=true` (PEM files; a JKS truststore is converted, see tls.py)."""
    if not getattr(conn, "tls", False):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if getattr(conn, "tls_trust_all", False):
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
        from pyspark_rmqs.broker.tls import keystore_pem_files

        cert_file, key_file = keystore_pem_files(keystore, _secret(conn, "tls_keystore_password"))
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def _secret(conn: Any, name: str) -> str | None:
    v = getattr(conn, name, None)
    if v is None:
        return None
    return v.get_secret_value() if hasattr(v, "get_secret_value") else str(v)


async def connect(conn: Any, name: str = "rmqs") -> RmqsClient:
    """A started, authenticated client on the first reachable address."""
    errors: list[str] = []
    ctx = ssl_context(conn)
    username = conn.username
    password = _secret(conn, "password") or ""
    for host, port in _addresses(conn):
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
                f"user '{username}' has no access to virtual host '{conn.vhost}' on {host}:{port}"
            ) from e
        except ssl.SSLError as e:
            await _close_quietly(client)
            errors.append(f"{host}:{port} (TLS: {e.reason or e})")
        except ConnectionRefusedError:
            await _close_quietly(client)
            errors.append(f"{host}:{port} (connection refused)")
        except (OSError, ConnectionError, TimeoutError, rx.ServerError) as e:
            await _close_quietly(client)
            errors.append(f"{host}:{port} ({type(e).__name__}: {e})" if str(e) else f"{host}:{port}")
    if not errors:
        raise ConfigurationError("no broker address: set the 'endpoints' or 'uris' option")
    raise BrokerUnavailableError("could not connect to RabbitMQ Streams at " + ", ".join(errors))


def _addresses(conn: Any) -> list[tuple[str, int]]:
    """Configured addresses, mapped through `addressResolverClass` (load balancers, NAT) when set."""
    addresses = list(conn.addresses())
    path = getattr(conn, "address_resolver_class", None)
    if not path:
        return addresses
    from pyspark_rmqs.extensions import AddressResolver, load

    resolver: AddressResolver = load(path, "addressResolverClass", AddressResolver)
    return [resolver.resolve(h, p) for h, p in addresses]


async def _close_quietly(client: RmqsClient) -> None:
    try:
        await client.close()
    except Exception:
        pass
