"""Extension points: small Protocols of ours (never rstream types), loaded by dotted class path.

A class named in `filterPostFilterClass`, `partitionerClass` or `addressResolverClass` must be
importable on the executors and have a no-argument constructor.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pyspark_rmqs.errors import ConfigurationError


@dataclass(frozen=True)
class MessageView:
    """What a post-filter sees of a message: body and decoded sections (strings as str)."""

    body: bytes
    properties: Mapping[str, Any]
    application_properties: Mapping[str, Any]
    message_annotations: Mapping[str, Any]


@runtime_checkable
class PostFilter(Protocol):
    """Client-side filter after broker-side filtering (Bloom filters allow false positives)."""

    def matches(self, message: MessageView) -> bool: ...


@runtime_checkable
class Partitioner(Protocol):
    """Custom super stream routing: the partition stream(s) a routing key goes to."""

    def partition(self, routing_key: str, partitions: Sequence[str]) -> str | Sequence[str]: ...


@runtime_checkable
class AddressResolver(Protocol):
    """Maps a broker's advertised address to the one to connect to (load balancers, NAT)."""

    def resolve(self, host: str, port: int) -> tuple[str, int]: ...


def load(path: str, option: str, protocol: type) -> Any:
    """Instantiate the class at dotted `path` and check it implements `protocol`."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ConfigurationError(f"option '{option}' must be a dotted class path like 'mypkg.filters.Region'")
    try:
        instance = getattr(importlib.import_module(module), name)()
    except Exception as e:
        raise ConfigurationError(
            f"option '{option}': could not load '{path}' ({type(e).__name__}: {e}); the class must be "
            "importable on the driver and the executors and have a no-argument constructor"
        ) from e
    if not isinstance(instance, protocol):
        methods = ", ".join(m for m in dir(protocol) if not m.startswith("_"))
        raise ConfigurationError(
            f"option '{option}': '{path}' does not implement {protocol.__name__} ({methods})"
        )
    return instance
