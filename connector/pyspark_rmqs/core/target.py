"""What a job reads or writes: one stream, or one super stream and its partition streams.

Every public entry point takes `stream=` / `superstream=` as a pair of keyword arguments (that is
what users type, in Spark options, operators, assets and CLI flags). `Target.of` turns the pair
into one value right at that edge, with the one "exactly one of" check, so the layers below carry
a single value instead of two optional strings; `streams()` / `astreams()` are the one partition
lookup (the super stream's partitions in the broker's order, or the stream after an existence
check).

The lookup takes any client with `partitions` and `stream_exists` (the broker layer's
`BrokerClient` / `AsyncBrokerClient`), so this core module never imports the broker.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol, TypedDict

from pyspark_rmqs.core.errors import ConfigurationError, StreamNotFoundError

DEFAULT_LABELS = ("'stream'", "'superstream'")


class TargetKw(TypedDict, total=False):
    """The keyword form of a target (exactly one key), typed so `**t.kw()` checks against signatures."""

    stream: str
    superstream: str


class PartitionLookup(Protocol):
    def partitions(self, superstream: str) -> list[str]: ...

    def stream_exists(self, stream: str) -> bool: ...


class AsyncPartitionLookup(Protocol):
    def partitions(self, superstream: str) -> Awaitable[list[str]]: ...

    def stream_exists(self, stream: str) -> Awaitable[bool]: ...


@dataclass(frozen=True)
class Target:
    """A stream (`is_super=False`) or a super stream (`is_super=True`), by name."""

    name: str
    is_super: bool = False

    @classmethod
    def of(
        cls,
        stream: str | None = None,
        superstream: str | None = None,
        *,
        labels: tuple[str, str] = DEFAULT_LABELS,
    ) -> Target:
        """The target named by exactly one of `stream` / `superstream`.

        `labels` names the two inputs as the caller's user typed them (`'stream'`, `--stream`, an
        option alias), so the error points at what to change.
        """
        if (stream is None) == (superstream is None):
            raise ConfigurationError(f"give exactly one of {labels[0]} or {labels[1]}")
        if superstream is not None:
            return cls(str(superstream), True)
        return cls(str(stream), False)

    @property
    def stream(self) -> str | None:
        return None if self.is_super else self.name

    @property
    def superstream(self) -> str | None:
        return self.name if self.is_super else None

    @property
    def kind(self) -> str:
        """The keyword users type for it: `stream` or `superstream`."""
        return "superstream" if self.is_super else "stream"

    def kw(self) -> TargetKw:
        """`{"stream": name}` or `{"superstream": name}`: the keyword form, for public calls."""
        return TargetKw(superstream=self.name) if self.is_super else TargetKw(stream=self.name)

    def describe(self) -> str:
        """`stream 'x'` or `super stream 'x'`, for messages."""
        return f"{'super stream' if self.is_super else 'stream'} '{self.name}'"

    def streams(self, client: PartitionLookup, *, hint: str = "") -> list[str]:
        """The partition streams of a super stream (broker order), or the stream if it exists.

        `hint` ends the "does not exist" message, to say where the name came from (an option).
        """
        if self.is_super:
            return list(client.partitions(self.name))
        if not client.stream_exists(self.name):
            raise self._missing(hint)
        return [self.name]

    async def astreams(self, client: AsyncPartitionLookup, *, hint: str = "") -> list[str]:
        """`streams()` with an asyncio client."""
        if self.is_super:
            return list(await client.partitions(self.name))
        if not await client.stream_exists(self.name):
            raise self._missing(hint)
        return [self.name]

    def _missing(self, hint: str) -> StreamNotFoundError:
        return StreamNotFoundError(f"stream '{self.name}' does not exist{hint}")
