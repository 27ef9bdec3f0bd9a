"""Sensors on a consumer's watermark, in poke mode or deferred to the triggerer.

A deferrable sensor checks once before deferring: when the condition already holds it finishes
without a trigger round trip, and configuration, authentication or missing-stream errors fail the
task (`AirflowFailException`) on the worker rather than inside the triggerer.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs.failures import airflow_failures
from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.triggers import RabbitMQStreamLagTrigger, RabbitMQStreamNewDataTrigger, watermark_payload
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.watermarks import Watermarks


def _default_deferrable() -> bool:
    return conf.getboolean("operators", "default_deferrable", fallback=False)


class _WatermarkSensor(BaseSensorOperator):
    # The connection id is templated, as on the operators (`operator_base.CONNECTION_FIELDS`).
    template_fields: Sequence[str] = ("stream", "superstream", "consumer_name", "rabbitmq_stream_conn_id")

    def __init__(
        self,
        *,
        consumer_name: str,
        stream: str | None = None,
        superstream: str | None = None,
        rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        Target.of(stream, superstream)  # fails at DAG parse time unless exactly one is given
        self.consumer_name = consumer_name
        self.stream = stream
        self.superstream = superstream
        self.rabbitmq_stream_conn_id = rabbitmq_stream_conn_id
        self.deferrable = _default_deferrable() if deferrable is None else deferrable

    def _check(self) -> Watermarks:
        hook = RabbitMQStreamHook(self.rabbitmq_stream_conn_id)
        with airflow_failures():
            return hook.watermarks(
                self.consumer_name, stream=self.stream, superstream=self.superstream, polling=True
            )

    def _done(self, w: Watermarks) -> bool:
        raise NotImplementedError

    def _trigger(self) -> Any:
        raise NotImplementedError

    def poke(self, context: Any) -> PokeReturnValue:
        w = self._check()
        done = self._done(w)
        self.log.info("rmqs: %s has lag %d on '%s'", self.consumer_name, w.total_lag, w.target)
        return PokeReturnValue(is_done=done, xcom_value=watermark_payload(w) if done else None)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if first.is_done:
            return first.xcom_value
        self.defer(
            trigger=self._trigger(),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume from the trigger: its payload is this sensor's XCom value."""
        if not event or event.get("status") != "success":
            raise AirflowFailException(f"rmqs trigger ended without success: {event!r}")
        return {k: v for k, v in event.items() if k != "status"}


class RabbitMQStreamNewDataSensor(_WatermarkSensor):
    """Waits until at least `min_messages` were published after `consumer_name`'s watermark.

    Returns (XCom) the check: per-partition tail and watermark, `total_lag` and the pending ranges
    `{stream: [start, end)}` a read would cover now.
    """

    template_fields: Sequence[str] = (*_WatermarkSensor.template_fields, "min_messages")

    def __init__(self, *, min_messages: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_messages = min_messages

    def _done(self, w: Watermarks) -> bool:
        return w.total_lag >= max(1, int(self.min_messages))

    def _trigger(self) -> RabbitMQStreamNewDataTrigger:
        return RabbitMQStreamNewDataTrigger(
            consumer_name=self.consumer_name,
            stream=self.stream,
            superstream=self.superstream,
            min_messages=int(self.min_messages),
            poll_interval=self.poke_interval,
            rabbitmq_stream_conn_id=self.rabbitmq_stream_conn_id,
        )


class RabbitMQStreamLagSensor(_WatermarkSensor):
    """Waits until `consumer_name`'s total lag is at most `max_lag` (a gate for downstream tasks)."""

    template_fields: Sequence[str] = (*_WatermarkSensor.template_fields, "max_lag")

    def __init__(self, *, max_lag: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_lag = max_lag

    def _done(self, w: Watermarks) -> bool:
        return w.total_lag <= int(self.max_lag)

    def _trigger(self) -> RabbitMQStreamLagTrigger:
        return RabbitMQStreamLagTrigger(
            consumer_name=self.consumer_name,
            stream=self.stream,
            superstream=self.superstream,
            max_lag=int(self.max_lag),
            poll_interval=self.poke_interval,
            rabbitmq_stream_conn_id=self.rabbitmq_stream_conn_id,
        )
