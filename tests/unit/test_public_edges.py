"""The orchestrator packages use the connector through public names only (issue 15: a private name
used across packages can change under them without notice)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGES = [ROOT / "provider" / "airflow_rmqs", ROOT / "dagster_rmqs"]


def _private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()  # local names bound to pyspark_rmqs modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyspark_rmqs"):
            for alias in node.names:
                dunder = alias.name.startswith("__") and alias.name.endswith("__")  # __version__ is public
                if alias.name.startswith("_") and not dunder:
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)  # a module or a name: attributes of either count
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pyspark_rmqs"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_airflow_and_dagster_use_only_public_connector_names() -> None:
    found = [use for edge in EDGES for path in sorted(edge.rglob("*.py")) for use in _private_uses(path)]
    assert found == [], "private connector names used by an orchestrator package:\n" + "\n".join(found)
