"""docs/architecture.md is drawn from the code: every module of pyspark_rmqs is in its tree, and its
layers are the layers contract's (issue #30)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "connector" / "pyspark_rmqs"
DOC = (ROOT / "docs" / "architecture.md").read_text()


def test_every_module_is_in_the_tree() -> None:
    tree = DOC[DOC.index("## The modules") : DOC.index("## Data flow")]
    missing = [
        str(p.relative_to(PKG))
        for p in sorted(PKG.rglob("*.py"))
        if p.name != "__init__.py" and not re.search(rf"(?<![\w/]){re.escape(p.name)}\b", tree)
    ]
    folders = {p.parent.relative_to(PKG).as_posix() for p in PKG.rglob("*.py") if p.parent != PKG}
    missing += [f"{f}/" for f in sorted(folders) if f"{f.rsplit('/', 1)[-1]}/" not in tree]
    assert not missing, f"docs/architecture.md does not list {missing}"


def test_the_layers_are_the_contracts_in_order() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c.get("containers") == ["pyspark_rmqs"]]
    assert layers["exhaustive"] is True
    folders = [layer for layer in layers["layers"] if "|" not in layer]
    drawn = DOC[DOC.index("## The layers") : DOC.index("## Where a change goes")]
    assert re.findall(r"^  (\w+)/", drawn, re.M) == folders
