"""A RabbitMQ container for tests, started through testcontainers, with the stream port advertised right.

The stream protocol does not let a client keep the address it dialled: after connecting, clients
ask the broker for a stream's leader and replicas and connect to the host and port the broker
*advertises* (`stream.advertised_host` / `stream.advertised_port`, by default the container's own
hostname and 5552). Behind a published port those are unreachable from the test, and the first
publish or read fails although the handshake worked: the classic first failure with containers.
So the host port is chosen first (a free port on 127.0.0.1), published to the container's 5552
on 127.0.0.1 only, and advertised as `127.0.0.1:<that port>` through the broker's Erlang arguments.

Everything is configured with environment variables, so the official `rabbitmq` images (3.13 and
later) work as they are, as does the image rmqs's own tests build (scripts/containers.sh):
`RABBITMQ_ENABLED_PLUGINS` turns the stream plugin on, `RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS` sets
the advertised address. The image must let `guest` connect from outside the container, as the
official one does (`loopback_users.guest = false`).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_rmqs.broker import RabbitMQTestBroker

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

DEFAULT_IMAGE = "rabbitmq:4.0"
"""The official image; `RMQS_TEST_IMAGE` or the `rmqs_test_image` ini option name another."""
STREAM_PORT = 5552
LOOPBACK = "127.0.0.1"
LABEL = "org.rmqs.pytest"  # on every container the plugin starts: `docker ps --filter label=...`


class DockerUnavailable(RuntimeError):
    """No Docker daemon answers (or the docker / testcontainers packages are not installed)."""


def container_environment(host_port: int, advertised_host: str = LOOPBACK) -> dict[str, str]:
    """The variables that make any RabbitMQ image serve streams at `advertised_host:host_port`.

    Erlang reads each `-rabbitmq_stream KEY VALUE` as a term: the host is a quoted string (an IP
    address is not a valid atom), the port an integer.
    """
    return {
        "RABBITMQ_ENABLED_PLUGINS": "rabbitmq_stream",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
            f'-rabbitmq_stream advertised_host "{advertised_host}" '
            f"-rabbitmq_stream advertised_port {host_port}"
        ),
    }


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` now (the kernel's choice; Docker binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def docker_answers(timeout_s: float = 5.0) -> str | None:
    """None when a Docker daemon answers a ping; otherwise why not (for the skip message)."""
    try:
        import docker
    except ImportError:
        return "the docker package is not installed (pip install 'rmqs[testing]')"
    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)))
        try:
            client.ping()
        finally:
            client.close()
    except Exception as e:  # docker raises DockerException, requests' errors, FileNotFoundError...
        return f"no Docker daemon answers ({type(e).__name__}: {str(e)[:200]})"
    return None


@dataclass
class RunningBroker:
    """A started container and the broker it serves; `stop()` removes the container."""

    container: DockerContainer
    broker: RabbitMQTestBroker
    started_in_s: float

    def logs(self, tail: int = 40) -> str:
        """The container's last log lines (the broker logs to the console)."""
        try:
            out, err = self.container.get_logs()
        except Exception as e:  # the container may be gone already
            return f"(no logs: {type(e).__name__})"
        text = (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")
        return "\n".join(text.splitlines()[-tail:])

    def stop(self) -> None:
        self.container.stop()


def start_broker(image: str = DEFAULT_IMAGE, *, startup_timeout_s: float = 120.0) -> RunningBroker:
    """Start `image`, publish its stream port on 127.0.0.1 (advertised as such), and return once
    a stream-protocol client is served. Raises `DockerUnavailable` when no daemon answers and
    `RuntimeError` (with the container's last log lines) when the broker does not come up."""
    why = docker_answers()
    if why is not None:
        raise DockerUnavailable(why)
    from testcontainers.core.container import DockerContainer

    started = time.monotonic()
    last: Exception | None = None
    for _attempt in range(3):  # the free port may be taken between choosing and binding it
        port = free_port()
        container = (
            DockerContainer(image).with_envs(**container_environment(port)).with_kwargs(labels={LABEL: "1"})
        )
        # Published on loopback only (with_bind_ports takes no address; docker-py's run() does).
        container.ports[f"{STREAM_PORT}/tcp"] = (LOOPBACK, port)  # type: ignore[assignment]
        try:
            container.start()
        except Exception as e:
            last = e
            _stop_quietly(container)
            if "already allocated" in str(e) or "address already in use" in str(e).lower():
                continue
            raise RuntimeError(f"starting a RabbitMQ container from image {image!r} failed: {e}") from e
        broker = RabbitMQTestBroker(
            host=LOOPBACK, port=port, origin=f"container {container.get_container_id()[:12]} ({image})"
        )
        running = RunningBroker(container, broker, 0.0)
        try:
            _wait_until_served(running, deadline=started + startup_timeout_s)
        except BaseException:
            _stop_quietly(container)
            raise
        running.started_in_s = time.monotonic() - started
        return running
    raise RuntimeError(f"no free port could be published for the RabbitMQ container: {last}")


def _wait_until_served(running: RunningBroker, deadline: float) -> None:
    """Poll with a real stream-protocol handshake (a listening port alone is not a booted broker)."""
    from pyspark_rmqs.broker.client import BrokerClient

    conn = running.broker.connection()
    last = "not tried yet"
    while time.monotonic() < deadline:
        if _exited(running.container):
            raise RuntimeError(f"the RabbitMQ container exited during boot; its log:\n{running.logs()}")
        try:
            BrokerClient(conn).broker_version()
            return
        except Exception as e:  # refused, reset, handshake not served yet
            last = f"{type(e).__name__}: {str(e)[:200]}"
        time.sleep(0.5)
    raise RuntimeError(
        f"the RabbitMQ container ({running.broker.origin}) served no stream client before the "
        f"startup timeout (last attempt: {last}); its log:\n{running.logs()}"
    )


def _exited(container: Any) -> bool:
    try:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        return bool(wrapped.status in ("exited", "dead"))
    except Exception:
        return False


def _stop_quietly(container: Any) -> None:
    try:
        container.stop()
    except Exception:  # never started, or already removed
        pass
