"""The error taxonomy (DESIGN §9): one small hierarchy, so callers can tell what to retry.

Messages name the stream, partition, offset and option involved; they never contain a password.
"""

from __future__ import annotations


class RmqsError(Exception):
    """Base of every error raised by rmqs."""

    retryable: bool = False


class ConfigurationError(RmqsError, ValueError):
    """A bad option or column: never retry; the message names it and what would be valid."""


class AuthenticationError(RmqsError):
    """The broker refused the credentials or the virtual host."""


class StreamNotFoundError(RmqsError):
    """A stream, super stream or partition stream does not exist."""


class DataLossError(RmqsError):
    """Requested offsets are no longer in the stream (retention) or a partition vanished.

    Raised only when `failOnDataLoss` is true; otherwise the connector logs and moves on.
    """


class BrokerUnavailableError(RmqsError, ConnectionError):
    """A transient broker or network failure: safe to retry."""

    retryable = True


class BrokerTimeoutError(BrokerUnavailableError, TimeoutError):
    """The broker did not answer or deliver in time (`pollTimeoutMs`, `maxWaitMs`, confirms)."""


class UnsupportedBrokerError(RmqsError):
    """The broker is too old for a requested feature (super streams 3.11, filtering 3.13)."""


class DataError(RmqsError):
    """A message that cannot be decoded or a row that cannot be encoded; names stream and offset."""


class PublishError(RmqsError):
    """The broker rejected a published message (negative confirm) or confirms timed out."""

    retryable = True
