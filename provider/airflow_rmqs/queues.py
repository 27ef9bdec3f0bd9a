"""`MessageQueueTrigger(scheme="rabbitmq-stream", ...)` -> `RabbitMQStreamNewDataTrigger`.

Registered under `queues` in the provider info; loaded only when
apache-airflow-providers-common-messaging is installed (Airflow then skips it quietly otherwise).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider

from airflow_rmqs.assets import SCHEME
from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger


class RabbitMQStreamMessageQueueProvider(BaseMessageQueueProvider):
    """Scheme `rabbitmq-stream`; kwargs go to the trigger (`superstream`/`stream`, `consumer_name`, ...).

    The deprecated queue-URI form `rabbitmq-stream://host:port/vhost/stream` is accepted too: its
    last path segment becomes `stream` unless `stream` or `superstream` is given.
    """

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        return queue.lower().startswith(f"{SCHEME}://")

    def trigger_class(self) -> type[RabbitMQStreamNewDataTrigger]:
        return RabbitMQStreamNewDataTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        if "stream" in kwargs or "superstream" in kwargs:
            return {}
        name = unquote(urlsplit(queue).path.rstrip("/").rsplit("/", 1)[-1])
        if not name:
            raise ValueError(f"queue {queue!r} names no stream: use {SCHEME}://host:port/vhost/stream")
        return {"stream": name}
