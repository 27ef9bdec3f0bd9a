"""The documentation builds strictly and covers every option the code accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_rmqs.options import KNOWN_SINK_OPTIONS, KNOWN_SOURCE_OPTIONS, REMOVED_OPTIONS

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
