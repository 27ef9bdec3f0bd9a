"""Java key stores for TLS: Python's ssl module takes PEM, Java users have JKS / PKCS12 files.

The truststore is converted with `keytool` (shipped with the Java that Spark needs anyway); a
client keystore is read as PKCS12 with `cryptography` when installed. PEM options (`tls.caFile`,
`tls.certFile`, `tls.keyFile`) need neither.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

from pyspark_rmqs.errors import ConfigurationError


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


def keystore_pem_files(path: str, password: str | None) -> tuple[str, str]:
    """(certificate file, key file) from a PKCS12 keystore, written to a private temp directory."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError as e:
        raise ConfigurationError(
            "option 'tls.keystore' needs the 'cryptography' package; or give 'tls.certFile' and 'tls.keyFile'"
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
    folder = tempfile.mkdtemp(prefix="rmqs-tls-")
    cert_file, key_file = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    with open(cert_file, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
        for c in extra or []:
            f.write(c.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return cert_file, key_file
