"""The error taxonomy (DESIGN §9): what rmqs raises and `classify`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.core.errors`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.core.errors import (
    COMMIT_ADVICE,
    AccessRefusedError,
    AuthenticationError,
    BrokerTimeoutError,
    BrokerUnavailableError,
    Classified,
    CommitState,
    ConfigurationError,
    ConsumerBusyError,
    DataError,
    DataLossError,
    LeaseLostError,
    OpenWindowError,
    ProducerBusyError,
    PublishError,
    RmqsError,
    RoutingChangedError,
    StreamNotFoundError,
    UnsupportedBrokerError,
    UnsupportedVersionError,
    WatermarkConflictError,
    classify,
    lost_message,
    mark_commit_state,
    report_data_loss,
)

__all__ = [
    "COMMIT_ADVICE",
    "AccessRefusedError",
    "AuthenticationError",
    "BrokerTimeoutError",
    "BrokerUnavailableError",
    "Classified",
    "CommitState",
    "ConfigurationError",
    "ConsumerBusyError",
    "DataError",
    "DataLossError",
    "LeaseLostError",
    "OpenWindowError",
    "ProducerBusyError",
    "PublishError",
    "RmqsError",
    "RoutingChangedError",
    "StreamNotFoundError",
    "UnsupportedBrokerError",
    "UnsupportedVersionError",
    "WatermarkConflictError",
    "classify",
    "lost_message",
    "mark_commit_state",
    "report_data_loss",
]
