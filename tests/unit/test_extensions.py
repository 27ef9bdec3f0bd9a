"""Extension points (`addressResolverClass`, `partitionerClass`, `filterPostFilterClass`) are checked
before anything they name is called: only a class implementing our Protocol is ever instantiated.

The targets live in this module, so their dotted paths are `tests.unit.test_extensions.<name>`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.extensions import AddressResolver, MessageView, Partitioner, PostFilter, load

HERE = __name__
CALLS: list[str] = []  # what the targets below did when called: nothing, unless they were loaded


class Region:
    def matches(self, message: MessageView) -> bool:
        return message.application_properties.get("region") == "eu"


class FirstPartition:
    def partition(self, routing_key: str, partitions: Sequence[str]) -> str:
        return partitions[0]


class Local:
    def resolve(self, host: str, port: int) -> tuple[str, int]:
        return "127.0.0.1", port


VALID = {PostFilter: Region, Partitioner: FirstPartition, AddressResolver: Local}
OPTIONS = {
    PostFilter: "filterPostFilterClass",
    Partitioner: "partitionerClass",
    AddressResolver: "addressResolverClass",
}
PROTOCOLS = list(VALID)


def run_anything() -> object:
    """A function: an option naming it must not be a way to run it."""
    CALLS.append("function")
    return Region()


class Incomplete:
    """A class without any of the Protocols' methods; its constructor must not run."""

    def __init__(self) -> None:
        CALLS.append("Incomplete()")


class NotCallable:
    matches = partition = resolve = 1


class NeedsArguments:
    def __init__(self, region: str) -> None:
        self.region = region

    def matches(self, message: MessageView) -> bool:
        return True

    def partition(self, routing_key: str, partitions: Sequence[str]) -> str:
        return partitions[0]

    def resolve(self, host: str, port: int) -> tuple[str, int]:
        return host, port


AN_INSTANCE = Region()


@pytest.fixture(autouse=True)
def no_calls() -> None:
    CALLS.clear()


def fails(path: str, protocol: type) -> str:
    option = OPTIONS[protocol]
    with pytest.raises(ConfigurationError) as e:
        load(path, option, protocol)
    text = str(e.value)
    assert f"option '{option}'" in text
    return text


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_a_valid_class_is_instantiated(protocol: type) -> None:
    cls = VALID[protocol]
    instance = load(f"{HERE}.{cls.__name__}", OPTIONS[protocol], protocol)
    assert type(instance) is cls
    assert isinstance(instance, protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_a_function_is_refused_without_being_called(protocol: type) -> None:
    text = fails(f"{HERE}.run_anything", protocol)
    assert "is a function, not a class" in text
    assert f"a class implementing {protocol.__name__}" in text
    assert CALLS == []


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_a_module_attribute_holding_an_instance_is_refused(protocol: type) -> None:
    text = fails(f"{HERE}.AN_INSTANCE", protocol)
    assert "is an instance of Region, not a class" in text


def test_a_module_is_refused() -> None:
    assert "is a module, not a class" in fails("tests.unit.test_extensions.pytest", PostFilter)


@pytest.mark.parametrize(
    ("protocol", "method"),
    [(PostFilter, "matches"), (Partitioner, "partition"), (AddressResolver, "resolve")],
    ids=["PostFilter", "Partitioner", "AddressResolver"],
)
@pytest.mark.parametrize("target", ["Incomplete", "NotCallable"])
def test_a_class_missing_the_method_is_refused_before_instantiating(
    protocol: type, method: str, target: str
) -> None:
    text = fails(f"{HERE}.{target}", protocol)
    assert f"class '{HERE}.{target}' does not implement {protocol.__name__}: it lacks {method}" in text
    assert CALLS == []  # Incomplete's constructor never ran


def test_a_class_of_another_protocol_is_refused() -> None:
    text = fails(f"{HERE}.Region", Partitioner)
    assert "does not implement Partitioner: it lacks partition" in text


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_a_nonexistent_module_is_refused(protocol: type) -> None:
    text = fails("no_such_package_rmqs.filters.Region", protocol)
    assert "cannot import module 'no_such_package_rmqs.filters'" in text
    assert "ModuleNotFoundError" in text


def test_a_missing_attribute_is_refused() -> None:
    assert f"module '{HERE}' has no attribute 'Nope'" in fails(f"{HERE}.Nope", PostFilter)


def test_a_path_without_a_module_is_refused() -> None:
    assert "dotted class path" in fails("Region", PostFilter)


def test_a_constructor_needing_arguments_is_refused() -> None:
    text = fails(f"{HERE}.NeedsArguments", AddressResolver)
    assert "no-argument constructor" in text
