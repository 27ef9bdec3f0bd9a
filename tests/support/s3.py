"""A real S3 HTTP endpoint on loopback for the object-store tests: moto's standalone server.

One server per test session (per xdist worker), started like the broker is: a process of its own,
on a free port of 127.0.0.1, stopped by its PID at the end. It enforces IAM: every request after
the first three (which create the admin user these tests sign with) is checked against the
signer's policies, so a user whose policy refuses `s3:PutObject` is refused as on AWS, and wrong
credentials fail. Buckets are per test (`new_bucket`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

REGION = "us-east-1"
_PORT = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")


@dataclass
class S3Server:
    """The endpoint and the admin user's credentials (secrets: tests check they never leak)."""

    endpoint: str
    key: str
    secret: str
    process: subprocess.Popen[str] | None = field(default=None, repr=False)
    region: str = REGION

    def storage_options(self, key: str | None = None, secret: str | None = None) -> dict[str, Any]:
        """fsspec (s3fs) options for this endpoint, signed as the admin unless told otherwise."""
        return {
            "key": key or self.key,
            "secret": secret or self.secret,
            "endpoint_url": self.endpoint,
            "client_kwargs": {"region_name": self.region},
        }

    def pyarrow_fs(self, key: str | None = None, secret: str | None = None) -> Any:
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=key or self.key,
            secret_key=secret or self.secret,
            endpoint_override=self.endpoint,
            region=self.region,
        )

    def env(self) -> dict[str, str]:
        """The AWS environment a process (pyarrow's own `s3://`, botocore, s3fs) signs with."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self, service: str = "s3", key: str | None = None, secret: str | None = None) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=key or self.key,
            aws_secret_access_key=secret or self.secret,
        )

    def new_bucket(self, prefix: str = "rmqs") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def user(self, actions: list[str], deny: list[str] | None = None) -> tuple[str, str]:
        """A new IAM user allowed `actions` (and denied `deny`) on every resource: (key, secret)."""
        iam = self.client("iam")
        name = f"u{uuid.uuid4().hex[:10]}"
        iam.create_user(UserName=name)
        statements = [{"Effect": "Allow", "Action": actions, "Resource": "*"}]
        if deny:
            statements.append({"Effect": "Deny", "Action": deny, "Resource": "*"})
        iam.put_user_policy(
            UserName=name,
            PolicyName="p",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}),
        )
        k = iam.create_access_key(UserName=name)["AccessKey"]
        return k["AccessKeyId"], k["SecretAccessKey"]

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under `prefix` of `bucket` (as the admin)."""
        out: list[str] = []
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)


def start(timeout_s: float = 60.0) -> S3Server:
    """Start moto's server on a free loopback port with IAM enforced; create the admin user."""
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    port = None
    seen = []
    while time.monotonic() < deadline and port is None:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if m := _PORT.search(line):
            port = int(m.group(1))
    if port is None:
        stop(proc)
        raise RuntimeError(f"moto's server did not start: {''.join(seen)[-2000:]}")
    # Keep reading its log so the pipe never fills and blocks the server.
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    endpoint = f"http://127.0.0.1:{port}"
    iam = S3Server(endpoint, "bootstrap", "bootstrap").client("iam")
    iam.create_user(UserName="admin")
    iam.put_user_policy(
        UserName="admin",
        PolicyName="all",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )
    k = iam.create_access_key(UserName="admin")["AccessKey"]
    return S3Server(endpoint, k["AccessKeyId"], k["SecretAccessKey"], proc)


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop the server this session started, by its PID (SIGTERM, then SIGKILL after 5 s)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
