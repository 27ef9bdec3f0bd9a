"""Extension points: small Protocols of ours (never rstream types), loaded by dotted class path.

A class named in `filterPostFilterClass`, `partitionerClass` or `addressResolverClass` must be
importable on the executors and have a no-argument constructor.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pyspark_rmqs.core.errors import ConfigurationError


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
    """Instantiate the class at dotted `path` after checking it is a class implementing `protocol`.

    Nothing named by an option is called before it is known to be such a class: an option value
    (an Airflow connection extra, say) must not be a way to run an arbitrary function.
    """
    cls = _checked_class(_resolve(path, option), path, option, protocol)
    try:
        return cls()
    except Exception as e:
        raise ConfigurationError(
            f"option '{option}': could not instantiate '{path}' ({type(e).__name__}: {e}); the class "
            "must have a no-argument constructor"
        ) from e


def _resolve(path: str, option: str) -> object:
    """The object at dotted `path` (module, then attribute); imported, never called."""
    module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise ConfigurationError(f"option '{option}' must be a dotted class path like 'mypkg.filters.Region'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raises while it is imported
        raise ConfigurationError(
            f"option '{option}': cannot import module '{module_name}' of '{path}' ({type(e).__name__}: {e}); "
            "the class must be importable on the driver and the executors"
        ) from e
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigurationError(
            f"option '{option}': module '{module_name}' has no attribute '{name}'"
        ) from None


def required_methods(protocol: type) -> list[str]:
    """The methods a class must define to implement one of our Protocols."""
    return sorted(n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v))


def _checked_class(obj: object, path: str, option: str, protocol: type) -> type:
    """`obj` when it is a class with every method of `protocol`; a ConfigurationError otherwise."""
    methods = required_methods(protocol)
    wanted = f"a class implementing {protocol.__name__} (methods: {', '.join(methods)})"
    if not inspect.isclass(obj):
        raise ConfigurationError(f"option '{option}': '{path}' is {_kind(obj)}, not a class; give {wanted}")
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing or not issubclass(obj, protocol):
        raise ConfigurationError(
            f"option '{option}': class '{path}' does not implement {protocol.__name__}: it lacks "
            f"{', '.join(missing) or 'the protocol'}; give {wanted}"
        )
    return obj


def _kind(obj: object) -> str:
    if inspect.isroutine(obj):
        return "a function"
    if inspect.ismodule(obj):
        return "a module"
    return f"an instance of {type(obj).__name__}"
