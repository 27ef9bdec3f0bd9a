"""A PKCS12 client keystore leaves no key material behind: not on success, failure or exception.

Python's ssl loads a key only from a file. `tls.load_keystore` writes it encrypted with a one-time
passphrase into a private temporary directory that is gone when the SSL context is built. Each test
points `tempfile.tempdir` at an empty directory of its own and checks it is empty afterwards.
"""

from __future__ import annotations

import datetime
import ssl
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from pyspark_rmqs.broker import tls
from pyspark_rmqs.broker.connect import ssl_context
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options

STORE_PASSWORD = "Keyst0re-Pw"


def certificate(key: ec.EllipticCurvePrivateKey, name: str = "rmqs-client") -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


def keystore(path: Path) -> Path:
    """A PKCS12 file with a key and its self-signed certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = certificate(key)
    path.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"client", key, cert, None, serialization.BestAvailableEncryption(STORE_PASSWORD.encode())
        )
    )
    return path


def options(store: Path, password: str = STORE_PASSWORD) -> ConnectionOptions:
    return parse_connection_options(
        {
            "endpoints": "localhost",
            "tls": "true",
            "tls.keystore": str(store),
            "tls.keystorePassword": password,
        }
    )


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory every tempfile call uses during the test (empty at the start)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(folder))
    return folder


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def spy_load_cert_chain(
    monkeypatch: pytest.MonkeyPatch, then: Callable[..., Any] | None = None
) -> list[dict[str, Any]]:
    """Record what the key file looks like while ssl reads it; `then` replaces the real call."""
    seen: list[dict[str, Any]] = []
    real = ssl.SSLContext.load_cert_chain

    def load(self: ssl.SSLContext, certfile: str, keyfile: str | None = None, password: Any = None) -> None:
        p = Path(certfile)
        seen.append(
            {
                "text": p.read_text(),
                "file_mode": stat.S_IMODE(p.stat().st_mode),
                "dir_mode": stat.S_IMODE(p.parent.stat().st_mode),
            }
        )
        (then or real)(self, certfile, keyfile, password)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", load)
    return seen


def test_keystore_loads_and_leaves_nothing(
    temp_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = spy_load_cert_chain(monkeypatch)
    ctx = ssl_context(options(keystore(tmp_path / "client.p12")))
    assert isinstance(ctx, ssl.SSLContext)
    assert leftovers(temp_dir) == []
    [during] = seen
    assert "BEGIN ENCRYPTED PRIVATE KEY" in during["text"]  # the plain key never reaches the disk
    assert "BEGIN PRIVATE KEY" not in during["text"]
    assert "BEGIN CERTIFICATE" in during["text"]
    assert (during["file_mode"], during["dir_mode"]) == (0o600, 0o700)


def test_ssl_refusing_the_key_fails_and_leaves_nothing(
    temp_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: Any) -> None:
        raise ssl.SSLError(116, "[X509: KEY_VALUES_MISMATCH] key values mismatch")

    seen = spy_load_cert_chain(monkeypatch, then=refuse)
    with pytest.raises(ConfigurationError, match=r"option 'tls\.keystore': the key and certificate in"):
        ssl_context(options(keystore(tmp_path / "client.p12")))
    assert len(seen) == 1
    assert leftovers(temp_dir) == []


def test_exception_while_loading_leaves_nothing(
    temp_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: Any) -> None:
        raise KeyboardInterrupt  # not even an Exception: the directory still goes

    seen = spy_load_cert_chain(monkeypatch, then=boom)
    with pytest.raises(KeyboardInterrupt):
        ssl_context(options(keystore(tmp_path / "client.p12")))
    assert len(seen) == 1
    assert leftovers(temp_dir) == []


def test_failure_while_writing_leaves_nothing(
    temp_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_args: Any) -> bytes:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tls, "_encrypted_pem", fail)
    with pytest.raises(OSError, match="No space left"):
        ssl_context(options(keystore(tmp_path / "client.p12")))
    assert leftovers(temp_dir) == []


def test_wrong_keystore_password_fails_before_writing(temp_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read .* as PKCS12") as e:
        ssl_context(options(keystore(tmp_path / "client.p12"), password="Not-The-Pw"))
    assert "Not-The-Pw" not in str(e.value) and STORE_PASSWORD not in str(e.value)
    assert leftovers(temp_dir) == []
