"""Least privilege (issue 46): what each operation needs, measured with limited users on the real broker.

Every test makes its own user (management API) allowed only its team's streams (`^team...-.*`) and,
where it says so, `rmqs.runs`; the user is deleted afterwards. A refusal must be an
`AccessRefusedError` that is never retried and names the stream, the permission and the fix.
The Airflow and Dagster edges are tested in tests/airflow/ and tests/dagster/ (test_permissions.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.consume import run_consume
from pyspark_rmqs.errors import AccessRefusedError, classify
from pyspark_rmqs.jobs import plan_read
from pyspark_rmqs.runs import record
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings, management
from tests.support.data import client, conn_of, publish
from tests.support.permissions import RUNS, fresh_vhost, grant, limited_user, team_prefix

pytestmark = pytest.mark.timeout(300)
RMQS = Path(sys.executable).parent / "rmqs"


def assert_refused(e: BaseException, stream: str, permission: str) -> None:
    """The one shape of a refusal: typed, not retried, naming the stream, the permission and the fix."""
    assert isinstance(e, AccessRefusedError), repr(e)
    assert (e.resource, e.permission) == (stream, permission)
    verdict = classify(e)
    assert verdict.retryable is False and verdict.error == "AccessRefusedError"
    text = str(e)
    assert f"'{stream}'" in text and f"needs the {permission} permission" in text, text
    assert "rabbitmqctl set_permissions" in text, text


def rmqs(*args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RMQS_")}
    return subprocess.run(
        [str(RMQS), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, env=base, timeout=180
    )


def conn_args(b: BrokerSettings) -> list[str]:
    return [
        "--endpoints",
        f"{b.host}:{b.port}",
        "--username",
        b.username,
        "--password",
        b.password,
        "--vhost",
        b.vhost,
    ]


def test_each_stream_operation_needs_the_permission_measured(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    """Stats and stored offsets need read; storing an offset (a tracking entry) needs read, not
    write: the broker drops a store without read silently, and the read-back says so."""
    team = team_prefix()
    s = streams.stream(team)
    publish(broker, s, [b"m"] * 10)
    own = f"^{team}-.*"
    with limited_user(broker, configure="^$", write=own, read="^$") as writer:
        c = BrokerClient(conn_of(writer))
        with pytest.raises(AccessRefusedError) as stats:
            c.tail(s)
        assert_refused(stats.value, s, "read")
        with pytest.raises(AccessRefusedError) as store:
            c.store_offsets("team-consumer", {s: 4})
        assert_refused(store.value, s, "read")
        assert "store an offset on" in str(store.value)
        with pytest.raises(AccessRefusedError) as create:
            c.create_stream(f"{team}-new")
        assert_refused(create.value, f"{team}-new", "configure")
    assert client(broker).stored_offset("team-consumer", s) is None  # the refused store left nothing
    with limited_user(broker, configure="^$", write="^$", read=own) as reader:
        c = BrokerClient(conn_of(reader))
        assert c.tail(s) == 10
        c.store_offsets("team-consumer", {s: 4})  # read alone stores an offset
        assert c.stored_offset("team-consumer", s) == 4


def test_rmqs_runs_is_never_declared_when_it_exists(broker: BrokerSettings) -> None:
    """RabbitMQ checks configure before it looks for the stream: declaring the existing `rmqs.runs`
    without configure is refused (measured). rmqs asks first, so read and write on it suffice."""
    record.ensure_stream(conn_of(broker))  # exists (guest may configure anything)
    with limited_user(broker, configure="^$", write=RUNS, read=RUNS) as team:
        with pytest.raises(AccessRefusedError):  # what every run did before: declare it again
            BrokerClient(conn_of(team)).create_stream(record.RUNS_STREAM, record.RUNS_STREAM_ARGUMENTS)
        record.ensure_stream(conn_of(team))  # asks, finds it, declares nothing


def test_missing_rmqs_runs_without_configure_says_who_may_create_it(broker: BrokerSettings) -> None:
    with (
        fresh_vhost(broker) as vhost,
        limited_user(broker, configure="^x-.*", write=".*", read=".*", vhost=vhost) as t,
    ):
        with pytest.raises(AccessRefusedError) as e:
            record.ensure_stream(conn_of(t))
        assert_refused(e.value, "rmqs.runs", "configure")
        assert "does not exist yet" in str(e.value) and "rmqs create --stream rmqs.runs" in str(e.value)
        # The fix it names: an administrator creates it once, with the retention a run would give it.
        admin = BrokerSettings(host=broker.host, port=broker.port, vhost=vhost)
        done = rmqs("create", "--stream", "rmqs.runs", *conn_args(admin))
        assert done.returncode == 0, done.stderr
        q = management("GET", f"queues/{vhost.replace('/', '%2F')}/rmqs.runs")
        assert q["arguments"]["x-max-length-bytes"] == record.RUNS_STREAM_ARGUMENTS["max-length-bytes"]
        record.ensure_stream(conn_of(t))  # now it exists: nothing is declared, nothing refused


def test_reading_a_watermark_creates_no_rmqs_runs(broker: BrokerSettings) -> None:
    """`rmqs watermark show` only looks: in a virtual host without `rmqs.runs` it shows the
    watermark to a user who may only read, and creates nothing."""
    with fresh_vhost(broker) as vhost:
        admin = BrokerSettings(host=broker.host, port=broker.port, vhost=vhost)
        BrokerClient(conn_of(admin)).create_stream("teamx-orders")
        with limited_user(broker, configure="^$", write="^$", read="^teamx-.*", vhost=vhost) as t:
            show = rmqs(
                "watermark", "show", "--stream", "teamx-orders", "--consumer", "c", "--json", *conn_args(t)
            )
            assert show.returncode == 0, show.stderr
            assert json.loads(show.stdout)["partitions"][0]["stream"] == "teamx-orders"
        assert not BrokerClient(conn_of(admin)).stream_exists(record.RUNS_STREAM)


def test_cli_watermark_set_and_lag_refused_exit_with_the_fix(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    team = team_prefix()
    s = streams.stream(team)
    publish(broker, s, [b"m"] * 20)
    own = f"^{team}-.*"
    record.ensure_stream(conn_of(broker))
    with limited_user(broker, configure=own, write=own, read=own) as t:
        r = rmqs(
            "watermark", "set", "--stream", s, "--consumer", "ops", "--to", "latest", "--yes", *conn_args(t)
        )
        assert r.returncode == 1, (r.stdout, r.stderr)
        err = " ".join(r.stderr.split())  # rich wraps the red line
        assert "unexpected error" not in err and "Traceback" not in err
        assert "access refused" in err and "'rmqs.runs'" in err and "rabbitmqctl set_permissions" in err
        assert t.password not in r.stdout + r.stderr
        show = rmqs("watermark", "show", "--stream", s, "--consumer", "ops", *conn_args(t))
        assert show.returncode == 1 and "read a stored offset on stream 'rmqs.runs'" in " ".join(
            show.stderr.split()
        )
    with limited_user(broker, configure="^$", write="^$", read="^$") as nobody:
        r = rmqs("lag", "--stream", s, "--consumer", "ops", "--json", *conn_args(nobody))
        assert r.returncode == 1, (r.stdout, r.stderr)
        err = " ".join(r.stderr.split())
        assert "unexpected error" not in err and f"stream '{s}'" in err and "needs the read permission" in err
    with limited_user(broker, configure="^$", write=f"{own}|{RUNS}", read=f"{own}|{RUNS}") as t:
        r = rmqs(
            "watermark", "set", "--stream", s, "--consumer", "ops", "--to", "latest", "--yes", *conn_args(t)
        )
        assert r.returncode == 0, (r.stdout, r.stderr)
        lag = rmqs("lag", "--stream", s, "--consumer", "ops", "--json", *conn_args(t))
        assert lag.returncode == 0, lag.stderr
        assert client(broker).stored_offset("ops", s) == 19 and json.loads(lag.stdout)


def test_a_super_stream_run_needs_read_on_each_partition_and_names_the_one_refused(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    """A super stream `<team>-...` is read under `^<team>-.*` plus `rmqs.runs`; a partition bound
    later whose name the pattern misses refuses the whole run at planning, naming that partition:
    nothing read, stored or recorded, and the lease freed. Granted, the next run reads every offset
    the refused one would have, once."""
    team = team_prefix()
    ss, parts = streams.super_stream(2, prefix=team)
    publish(broker, parts[0], [b"a"] * 100)
    publish(broker, parts[1], [b"b"] * 60)
    record.ensure_stream(conn_of(broker))
    own = f"^{team}-.*"
    got: list[pa.RecordBatch] = []

    def run(b: BrokerSettings) -> None:
        conn = conn_of(b)
        run_consume(conn, plan_read(conn, superstream=ss, consumer="etl", lease_wait_s=5), got.append)

    def offsets() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for batch in got:
            for s, o in zip(batch["stream"].to_pylist(), batch["offset"].to_pylist(), strict=True):
                out.setdefault(s, []).append(o)
        return {s: sorted(v) for s, v in out.items()}

    team_perms = {"configure": own, "write": f"{own}|{RUNS}", "read": f"{own}|{RUNS}"}
    with limited_user(broker, **team_perms) as t:
        run(t)
    assert offsets() == {parts[0]: list(range(100)), parts[1]: list(range(60))}
    first = record.latest(conn_of(broker), "etl", ss)
    assert first is not None and first.done

    other = streams.add_partition(ss, 2, name=f"other{team}-{ss}-2")  # outside `^<team>-.*`
    publish(broker, other, [b"c"] * 40)
    publish(broker, parts[0], [b"a"] * 10)
    tail0 = client(broker).tail(parts[0])
    with limited_user(broker, **team_perms) as t:
        with pytest.raises(AccessRefusedError) as e:
            run(t)
        assert_refused(e.value, other, "read")
        assert len([o for v in offsets().values() for o in v]) == 160  # nothing read by the refused run
        stored = client(broker).stored_offsets("etl", [*parts, other])
        assert stored == {parts[0]: 99, parts[1]: 59, other: None}
        latest = record.latest(conn_of(broker), "etl", ss)
        assert latest is not None and latest.run_id == first.run_id  # nothing planned or recorded
        # Granted in place, the same user and process run again at once: the lease was freed.
        grant(broker, t, **{**team_perms, "read": f"{own}|^other{team}-.*|{RUNS}"})
        run(t)
    assert offsets() == {
        parts[0]: [*range(100), *range(tail0 - 10, tail0)],
        parts[1]: list(range(60)),
        other: list(range(40)),
    }
    assert client(broker).stored_offsets("etl", [*parts, other]) == {
        parts[0]: tail0 - 1,
        parts[1]: 59,
        other: 39,
    }
