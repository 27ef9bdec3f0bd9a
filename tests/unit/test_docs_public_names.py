"""The user docs name only public API: every rmqs module path or symbol they mention is in the API
reference (docs/api.md, rendered by mkdocstrings from the `:::` lines), by identity.

A guide that sends users to an internal name (`pyspark_rmqs.broker.client.BrokerClient`) fails
here: either the name joins the reference (exported where users import it, with a `:::` line), or
the page stops naming it. docs/architecture.md, the layout as built for contributors, and the
reference itself are not checked; runnable example modules are allowed by name below.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import docs

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pyspark_rmqs", "airflow_rmqs", "dagster_rmqs", "pytest_rmqs")
SHORT = {"jobs": "pyspark_rmqs.jobs", "errors": "pyspark_rmqs.errors"}  # `jobs.plan_read` in prose
NOT_API = {
    "dagster_rmqs.examples": "example code loaded with `dagster dev -m ...`, not an import path",
}
NAME = re.compile(r"(?<![\w./-])((?:" + "|".join((*PACKAGES, *SHORT)) + r")(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
SKIPPED_PAGES = {"docs/architecture.md", "docs/api.md"}


def resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def reference() -> list[tuple[str, list[str] | None]]:
    """docs/api.md's `::: path` lines with their `members` (None: the whole object)."""
    text = (ROOT / "docs" / "api.md").read_text()
    found = []
    for block in re.split(r"^::: ", text, flags=re.M)[1:]:
        path, _, rest = block.partition("\n")
        options = rest.split("\n\n", 1)[0]
        members: list[str] | None = None
        inline = re.search(r"members:\s*\[([^\]]*)\]", options)
        if inline:
            members = [m.strip() for m in inline[1].split(",") if m.strip()]
        elif re.search(r"^\s+members:\s*$", options, re.M):
            members = re.findall(r"^\s+- (\w+)\s*$", options.split("members:", 1)[1], re.M)
        found.append((path.strip(), members))
    return found


def documented() -> tuple[list[Any], list[ModuleType]]:
    """The objects the reference renders, and the modules it renders whole or in part."""
    objects: list[Any] = []
    modules: list[ModuleType] = []
    for path, members in reference():
        obj = resolve(path)
        if inspect.ismodule(obj):
            modules.append(obj)
            names = members if members is not None else list(getattr(obj, "__all__", []))
            objects += [getattr(obj, name) for name in names]
        else:
            objects.append(obj)
            modules.append(resolve(path.rsplit(".", 1)[0]))  # where users import it from
    return objects, modules


OBJECTS, MODULES = documented()


def is_public(path: str) -> bool:
    if path.endswith(".__version__") or any(path == p or path.startswith(p + ".") for p in NOT_API):
        return True
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = resolve(".".join(parts[:i]))
        except (ModuleNotFoundError, AttributeError):
            return False
        if i == len(parts) and (any(obj is m for m in MODULES) or any(obj is o for o in OBJECTS)):
            return True
        if i < len(parts) and inspect.isclass(obj) and any(obj is o for o in OBJECTS):
            return not any(p.startswith("_") for p in parts[i:])  # a documented class's member
        if i == len(parts) and path.split(".")[0] in PACKAGES and len(parts) == 1:
            return True  # the package itself
    return False


def named(page: str) -> set[str]:
    """Every rmqs dotted name the page mentions, and every name its Python blocks import."""
    text = (ROOT / page).read_text()
    names = set()
    for m in NAME.finditer(text):
        name = m[1]
        head, _, tail = name.partition(".")
        if tail.split(".")[-1] in ("py", "md", "toml", "yaml", "json"):
            continue
        names.add(f"{SHORT[head]}.{tail}" if head in SHORT else name)
    for block in docs.blocks(page):
        if block.lang != "python":
            continue
        try:
            tree = ast.parse(block.code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                names |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
    return names


PAGES = [p for p in docs.pages() if p.startswith("docs/") or p.startswith("README")]


@pytest.mark.parametrize("page", [p for p in PAGES if p not in SKIPPED_PAGES])
def test_a_page_names_only_what_the_api_reference_documents(page: str) -> None:
    private = sorted(name for name in named(page) if not is_public(name))
    assert private == [], (
        f"{page} names {private}, not in docs/api.md: add it to the reference (and export it where "
        "users import it) or stop naming it"
    )


def test_the_check_catches_an_internal_name() -> None:
    assert not is_public("pyspark_rmqs.broker.client.BrokerClient")
    assert not is_public("pyspark_rmqs.errors.NoSuchError")
    assert is_public("pyspark_rmqs.errors.DataLossError")
    assert is_public("airflow_rmqs.hooks.RabbitMQStreamHook.get_conn")
    assert is_public("dagster_rmqs.RabbitMQStreamsResource")  # a re-export of a documented class
