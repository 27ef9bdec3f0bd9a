"""TLS end to end against the local test broker and its test CA (scripts/broker.sh).

`broker.sh up` makes a test CA, a server certificate for localhost / 127.0.0.1 and a client
certificate (`broker.sh tls-dir` prints where), and opens a stream TLS listener on 127.0.0.1:5551
that verifies client certificates when one is presented. Other CAs and certificates are made here,
per test, with openssl. Skipped when RMQS_TEST_URI names another broker: its CA is not ours.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_rmqs.broker import connect as connect_module
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core import codec
from pyspark_rmqs.core.errors import BrokerUnavailableError, ConfigurationError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from tests.support.broker import REPO, BrokerSettings

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        bool(os.environ.get("RMQS_TEST_URI")),
        reason="RMQS_TEST_URI is set: the TLS tests need the local broker's test CA and TLS listener",
    ),
]

TLS_PORT = 5551


@pytest.fixture(scope="module")
def tls_dir(broker: BrokerSettings) -> Path:
    """The host folder of the test CA and certificates, from `broker.sh tls-dir`."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "broker.sh"), "tls-dir"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, f"broker.sh tls-dir failed: {out.stderr}"
    folder = Path(out.stdout.strip())
    for name in ("ca.pem", "server.pem", "client.pem", "client.key"):
        assert (folder / name).is_file(), f"{folder / name} is missing"
    try:
        socket.create_connection(("127.0.0.1", TLS_PORT), timeout=3).close()
    except OSError:
        pytest.fail(
            f"no TLS listener on 127.0.0.1:{TLS_PORT}: the broker predates its TLS configuration; "
            "restart it with: bash scripts/broker.sh down && bash scripts/broker.sh up"
        )
    return folder


def tls_conn(
    broker: BrokerSettings, endpoint: str = f"localhost:{TLS_PORT}", **tls: str
) -> ConnectionOptions:
    return parse_connection_options(
        {
            "endpoints": endpoint,
            "username": broker.username,
            "password": broker.password,
            "vhost": broker.vhost,
            "tls": "true",
            **tls,
        }
    )


def openssl(*args: str | Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key)."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", key, "-out", cert)  # fmt: skip
    return cert, key


def make_cert(folder: Path, ca: tuple[Path, Path], name: str) -> tuple[Path, Path]:
    """A certificate signed by `ca`: (certificate, key)."""
    cert, key, csr = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}.csr"
    openssl(
        "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", key, "-out", csr
    )
    openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-set_serial", "7", "-days", "2",
            "-out", cert)  # fmt: skip
    return cert, key


def write_and_read(conn: ConnectionOptions, stream: str, n: int = 50) -> None:
    """Tail of a fresh stream, publish `n` messages, tail again and read them back: all over `conn`."""
    client = BrokerClient(conn)
    assert client.tail(stream) == 0
    values = [f"tls-{i}".encode() for i in range(n)]
    with StreamProducer(conn, stream, superstream=False, settings=WriteSettings()) as producer:
        producer.send([codec.encode(v) for v in values])
        producer.flush()
    assert client.tail(stream) == n
    batches = list(RangeReader(conn, stream, 0, n, ReadSettings(metadata_fields=("properties",))))
    table = pa.Table.from_batches(batches)
    assert table.column("value").to_pylist() == values
    assert table.column("offset").to_pylist() == list(range(n))


def expect_unavailable(conn: ConnectionOptions, stream: str, *fragments: str) -> str:
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as info:
        BrokerClient(conn).tail(stream)
    took = time.monotonic() - started
    msg = str(info.value)
    assert took < 5, f"took {took:.1f} s: {msg}"
    for fragment in fragments:
        assert fragment in msg, msg
    assert conn.password.get_secret_value() not in msg
    return msg


# --------------------------------------------------------------------------------------------


def test_tls_dir_holds_a_ca_and_certificates_for_localhost(tls_dir: Path) -> None:
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tls_dir / "server.pem"), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:localhost" in text and "IP Address:127.0.0.1" in text
    for cert in ("server.pem", "client.pem"):
        check = subprocess.run(
            ["openssl", "verify", "-CAfile", str(tls_dir / "ca.pem"), str(tls_dir / cert)],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_pem_ca_file(broker: BrokerSettings, streams: Any, tls_dir: Path) -> None:
    conn = tls_conn(broker, **{"tls.caFile": str(tls_dir / "ca.pem")})
    write_and_read(conn, streams.stream("tls-pem"))


@pytest.mark.parametrize(
    "options",
    [
        {"endpoints": f"127.0.0.1:{TLS_PORT}"},  # the server certificate has IP:127.0.0.1 too
        {"uris": f"rabbitmq-stream+tls://guest:guest@localhost:{TLS_PORT}/%2F"},
        {"uris": "rabbitmq-stream+tls://guest:guest@localhost/%2F"},  # 5551 is the TLS default port
    ],
    ids=["ip-address", "tls-uri", "tls-uri-default-port"],
)
def test_pem_ca_file_other_addresses(
    broker: BrokerSettings, streams: Any, tls_dir: Path, options: dict[str, str]
) -> None:
    if broker.username != "guest" and "uris" in options:
        pytest.skip("the URI carries the default credentials")
    conn = parse_connection_options({**options, "tls": "true", "tls.caFile": str(tls_dir / "ca.pem")})
    assert BrokerClient(conn).tail(streams.stream("tls-addr")) == 0


def test_jks_truststore(broker: BrokerSettings, streams: Any, tls_dir: Path, tmp_path: Path) -> None:
    keytool = shutil.which("keytool")
    if keytool is None:
        pytest.skip("keytool (a JRE) is not installed")
    store, secret = tmp_path / "truststore.jks", "Trust-St0re-PW"
    subprocess.run(
        [keytool, "-importcert", "-noprompt", "-alias", "rmqs-test-ca", "-file", str(tls_dir / "ca.pem"),
         "-keystore", str(store), "-storetype", "JKS", "-storepass", secret],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    conn = tls_conn(broker, **{"tls.truststore": str(store), "tls.truststorePassword": secret})
    assert secret not in repr(conn)
    write_and_read(conn, streams.stream("tls-jks"), n=5)


def test_jks_truststore_with_a_wrong_password_names_the_option(
    broker: BrokerSettings, streams: Any, tls_dir: Path, tmp_path: Path
) -> None:
    keytool = shutil.which("keytool")
    if keytool is None:
        pytest.skip("keytool (a JRE) is not installed")
    store = tmp_path / "truststore.jks"
    subprocess.run(
        [keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", str(tls_dir / "ca.pem"),
         "-keystore", str(store), "-storetype", "JKS", "-storepass", "right-password"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    conn = tls_conn(broker, **{"tls.truststore": str(store), "tls.truststorePassword": "Wr0ng-Store-PW"})
    with pytest.raises(ConfigurationError) as info:
        BrokerClient(conn).tail(streams.stream("tls-jks-pw"))
    assert "tls.truststore" in str(info.value) and "Wr0ng-Store-PW" not in str(info.value)


def test_wrong_ca_fails_clearly(broker: BrokerSettings, streams: Any, tls_dir: Path, tmp_path: Path) -> None:
    other_ca, _ = make_ca(tmp_path, "another-test-ca")
    conn = tls_conn(broker, **{"tls.caFile": str(other_ca)})
    msg = expect_unavailable(
        conn, streams.stream("tls-wrong-ca"), f"localhost:{TLS_PORT}", "TLS", "certificate"
    )
    assert "verif" in msg  # "TLS certificate verification failed: ..."


def test_system_trust_store_does_not_know_the_test_ca(
    broker: BrokerSettings, streams: Any, tls_dir: Path
) -> None:
    expect_unavailable(
        tls_conn(broker), streams.stream("tls-no-ca"), f"localhost:{TLS_PORT}", "TLS", "certificate"
    )


def test_host_name_is_verified(broker: BrokerSettings, streams: Any, tls_dir: Path) -> None:
    """The certificate is for localhost and 127.0.0.1: another name of the same address fails."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = ""
    if address != "127.0.0.1" or name == "localhost":
        pytest.skip(f"this host's name ({name}) does not resolve to 127.0.0.1, where the broker listens")
    conn = tls_conn(broker, f"{name}:{TLS_PORT}", **{"tls.caFile": str(tls_dir / "ca.pem")})
    msg = expect_unavailable(conn, streams.stream("tls-host"), f"{name}:{TLS_PORT}", "TLS", "certificate")
    assert "mismatch" in msg.lower() or "not valid for" in msg


def test_tls_client_on_the_plain_port(broker: BrokerSettings, streams: Any, tls_dir: Path) -> None:
    conn = tls_conn(broker, f"localhost:{broker.port}", **{"tls.caFile": str(tls_dir / "ca.pem")})
    expect_unavailable(conn, streams.stream("tls-mixup"), f"localhost:{broker.port}", "TLS port")


def test_trust_all_works_and_warns_once(
    broker: BrokerSettings, streams: Any, tls_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr(connect_module, "_warned_trust_all", False)
    caplog.set_level(logging.WARNING, logger=connect_module.__name__)
    s = streams.stream("tls-trust-all")
    # two configurations (so two connections): the warning is still logged once per process
    assert BrokerClient(tls_conn(broker, **{"tls.trustAll": "true"})).tail(s) == 0
    assert BrokerClient(tls_conn(broker, f"127.0.0.1:{TLS_PORT}", **{"tls.trustAll": "true"})).tail(s) == 0
    warnings = [
        r for r in caplog.records if r.name == connect_module.__name__ and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    text = warnings[0].getMessage()
    assert "tls.trustAll" in text and "not verified" in text


def test_client_certificate(broker: BrokerSettings, streams: Any, tls_dir: Path) -> None:
    conn = tls_conn(
        broker,
        **{
            "tls.caFile": str(tls_dir / "ca.pem"),
            "tls.certFile": str(tls_dir / "client.pem"),
            "tls.keyFile": str(tls_dir / "client.key"),
        },
    )
    write_and_read(conn, streams.stream("tls-client-cert"), n=5)


def test_client_certificate_as_pkcs12_keystore(
    broker: BrokerSettings, streams: Any, tls_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("cryptography")
    store, secret = tmp_path / "client.p12", "Key-St0re-PW"
    openssl("pkcs12", "-export", "-in", tls_dir / "client.pem", "-inkey", tls_dir / "client.key",
            "-out", store, "-passout", f"pass:{secret}")  # fmt: skip
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("rmqs-tls-*"))
    conn = tls_conn(
        broker,
        **{"tls.caFile": str(tls_dir / "ca.pem"), "tls.keystore": str(store), "tls.keystorePassword": secret},
    )
    assert BrokerClient(conn).tail(streams.stream("tls-p12")) == 0
    # the key is unpacked for ssl's load_cert_chain only: no copy of it stays behind
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("rmqs-tls-*")) == before


def test_client_certificate_from_an_unknown_ca_is_refused(
    broker: BrokerSettings, streams: Any, tls_dir: Path, tmp_path: Path
) -> None:
    """The broker verifies a client certificate when one is presented (verify_peer)."""
    intruder = make_cert(tmp_path, make_ca(tmp_path, "intruder-ca"), "intruder")
    conn = tls_conn(
        broker,
        **{
            "tls.caFile": str(tls_dir / "ca.pem"),
            "tls.certFile": str(intruder[0]),
            "tls.keyFile": str(intruder[1]),
        },
    )
    expect_unavailable(
        conn, streams.stream("tls-intruder"), f"localhost:{TLS_PORT}", "TLS", "client certificate"
    )
