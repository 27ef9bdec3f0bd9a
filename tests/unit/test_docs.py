"""The documentation builds strictly and covers every option the code accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_rmqs.options import (
    INTEGER_BOUNDS,
    KNOWN_SINK_OPTIONS,
    KNOWN_SOURCE_OPTIONS,
    REMOVED_OPTIONS,
    describe_range,
    reference,
)

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "option", sorted(set(KNOWN_SOURCE_OPTIONS) | set(KNOWN_SINK_OPTIONS) | set(REMOVED_OPTIONS))
)
def test_every_option_is_documented(option: str) -> None:
    text = (ROOT / "docs" / "options.md").read_text()
    assert f"`{option}`" in text, f"option {option} is missing from docs/options.md"


def test_option_tables_are_rendered_from_the_option_models() -> None:
    """docs/options.md's tables are the option models' (name, default, doc line, range, broker)."""
    path = ROOT / "docs" / "options.md"
    text = path.read_text()
    assert text.count("<!-- options:") == len(reference.TABLES)
    assert reference.rewrite(text) == text, (
        "docs/options.md is out of date with the option models: run "
        "`python -m pyspark_rmqs.options.reference docs/options.md`"
    )


@pytest.mark.parametrize("option", sorted(o for o, (_lo, hi) in INTEGER_BOUNDS.items() if hi < 2**63 - 1))
def test_every_bounded_integer_option_documents_its_range(option: str) -> None:
    """Offsets and timestamps (int64) say their lower bound in words; every other integer its range."""
    text = (ROOT / "docs" / "options.md").read_text()
    [row] = [r for r in text.splitlines() if r.startswith(f"| `{option}` |")]
    assert f"({describe_range(option)})" in row, (
        f"docs/options.md: {option} should say ({describe_range(option)})"
    )


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", text):
        assert (ROOT / target).exists(), target


def test_failure_semantics_names_tests_that_exist() -> None:
    """Each test the failure-semantics page cites exists: the page cannot outlive a renamed test."""
    text = (ROOT / "docs" / "failure-semantics.md").read_text()
    cited = 0
    last: Path | None = None
    for ref in re.findall(r"`([^`]*(?:\.py|::|tests/)[^`]*)`", text):
        path, _, name = ref.partition("::")
        if path:
            if path.startswith("tests/"):
                target = ROOT / path
            else:
                found = list((ROOT / "tests").rglob(path))
                assert len(found) == 1, f"{path!r} names {len(found)} files"
                target = found[0]
            assert target.exists(), ref
            last = target
        if name:
            assert last is not None and last.is_file(), ref
            assert re.search(rf"^def {re.escape(name)}\(", last.read_text(), re.M), f"no test {ref}"
            cited += 1
    assert cited >= 15
