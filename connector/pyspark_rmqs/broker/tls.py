"""Java key stores for TLS: Python's ssl module takes PEM, Java users have JKS / PKCS12 files.

The truststore is converted with `keytool` (shipped with the Java that Spark needs anyway); a
client keystore is read as PKCS12 with `cryptography` when installed; its key reaches the disk
only encrypted, and only for the `load_cert_chain` call. PEM options (`tls.caFile`,
`tls.certFile`, `tls.keyFile`) need neither.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
from typing import Any

from pyspark_rmqs.core.errors import ConfigurationError


@functools.lru_cache(maxsize=16)
def truststore_pem(path: str, password: str | None) -> str:
    """All certificates of a JKS or PKCS12 truststore, as PEM text."""
    if not os.path.exists(path):
        raise ConfigurationError(f"option 'tls.truststore': file '{path}' does not exist")
    keytool = shutil.which("keytool") or _java_home_keytool()
    if keytool is None:
        raise ConfigurationError(
            "option 'tls.truststore' needs Java's keytool to read a JKS file; install a JRE or give the "
            "CA certificate as PEM with 'tls.caFile'"
        )
    cmd = [keytool, "-list", "-rfc", "-keystore", path]
    env = dict(os.environ)
    if password:
        cmd += ["-storepass:env", "RMQS_STOREPASS"]
        env["RMQS_STOREPASS"] = password
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or "BEGIN CERTIFICATE" not in proc.stdout:
        reason = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no certificate found"]
        raise ConfigurationError(f"option 'tls.truststore': cannot read '{path}': {reason[0]}")
    blocks = []
    inside = False
    for line in proc.stdout.splitlines():
        if line.startswith("-----BEGIN CERTIFICATE"):
            inside = True
        if inside:
            blocks.append(line)
        if line.startswith("-----END CERTIFICATE"):
            inside = False
    return "\n".join(blocks) + "\n"


def _java_home_keytool() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "keytool")):
        return os.path.join(home, "bin", "keytool")
    return None


def load_keystore(ctx: ssl.SSLContext, path: str, password: str | None) -> None:
    """Load the client certificate and key of a PKCS12 keystore into `ctx`.

    Python's ssl reads a key only from a file, so one must be written; it is written encrypted
    with a one-time random passphrase (the plain key never touches the disk), alone in a private
    TemporaryDirectory (0700, file 0600) that is removed as soon as `load_cert_chain` returns or
    fails, on every path.
    """
    key, chain = _read_pkcs12(path, password)
    passphrase = secrets.token_bytes(32)
    with tempfile.TemporaryDirectory(prefix="rmqs-tls-") as folder:
        pem_file = os.path.join(folder, "client.pem")
        fd = os.open(pem_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_encrypted_pem(key, passphrase))
            f.write(chain)
        try:
            ctx.load_cert_chain(pem_file, password=passphrase)
        except ssl.SSLError as e:
            reason = getattr(e, "reason", None) or e
            raise ConfigurationError(
                f"option 'tls.keystore': the key and certificate in '{path}' cannot be used ({reason})"
            ) from None


def _read_pkcs12(path: str, password: str | None) -> tuple[Any, bytes]:
    """(private key, the certificate chain as PEM) of a PKCS12 keystore."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError as e:
        raise ConfigurationError(
            "option 'tls.keystore' needs the 'cryptography' package (pip install 'rmqs[pkcs12]'); "
            "or give 'tls.certFile' and 'tls.keyFile'"
        ) from e
    try:
        with open(path, "rb") as f:
            key, cert, extra = pkcs12.load_key_and_certificates(
                f.read(), password.encode() if password else None
            )
    except (OSError, ValueError) as e:
        raise ConfigurationError(
            f"option 'tls.keystore': cannot read '{path}' as PKCS12 ({type(e).__name__}); convert a JKS "
            "keystore with keytool -importkeystore -deststoretype PKCS12, or use tls.certFile/tls.keyFile"
        ) from None
    if key is None or cert is None:
        raise ConfigurationError(f"option 'tls.keystore': '{path}' holds no private key and certificate")
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *(extra or [])])
    return key, chain


def _encrypted_pem(key: Any, passphrase: bytes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase),
        )
    )
