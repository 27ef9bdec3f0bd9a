"""The documentation builds strictly and covers every option the code accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pyspark_rmqs.options import (
    INTEGER_BOUNDS,
    KNOWN_SINK_OPTIONS,
    KNOWN_SOURCE_OPTIONS,
    REMOVED_OPTIONS,
    describe_range,
    reference,
)
from tests.support import docs

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
    for target in re.findall(r"\]\(((?:docs/|[A-Z]+\.md)[^)#]*)", text):
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


def test_every_code_block_runs_or_says_why_not() -> None:
    """Each block of README.md, README.pypi.md, the root documents and docs/ is one the snippet test
    (tests/integration/test_docs_snippets.py) runs, or carries `<!-- not run: reason -->`."""
    silent = []
    for page in docs.pages():
        for block in docs.blocks(page):
            if block.not_run is not None:
                assert len(block.not_run) >= 15, f"{block.where}: say why the block is not run"
            elif not docs.runs(block):
                silent.append(f"{block.where} ({block.lang or 'no language'})")
    assert silent == [], "blocks neither run by the snippet test nor marked <!-- not run: reason -->"
    assert sum(docs.runs(b) for page in docs.pages() for b in docs.blocks(page)) >= 20


def test_the_package_index_description_has_no_links_into_the_repository() -> None:
    """README.pypi.md is the wheel's long description: relative links break on the package index."""
    text = (ROOT / "README.pypi.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", text) + re.findall(r'(?:href|src)="([^"]+)"', text)
    assert [link for link in links if not link.startswith("https://")] == []
    assert 'readme = "README.pypi.md"' in (ROOT / "pyproject.toml").read_text()


def test_the_version_named_in_the_docs_is_the_packages() -> None:
    """`rmqs-X.Y.Z` file names in the install instructions follow `pyspark_rmqs.__version__`."""
    from pyspark_rmqs import __version__

    for page in docs.pages():
        for named in re.findall(r"rmqs-(\d+\.\d+\.\d+)", (ROOT / page).read_text()):
            assert named == __version__, f"{page} names rmqs-{named}, the package is {__version__}"


def test_the_testing_guide_shows_the_example_project_the_suite_runs() -> None:
    """docs/testing.md names every file of examples/testing, and its excerpts are those files' lines,
    verbatim: tests/integration/test_pytest_plugin.py (and make test-containers) run the files, so
    the page cannot drift from what runs."""
    text = (ROOT / "docs" / "testing.md").read_text()
    project = ROOT / "examples" / "testing"
    files = sorted(
        p.relative_to(project).as_posix() for p in project.rglob("*") if p.suffix in (".py", ".yml")
    )
    assert len(files) == 6 and [f for f in files if f"`{f}`" not in text] == []
    workflow = yaml.safe_load((project / "ci.yml").read_text())  # not run here: valid, and installs rmqs
    assert "rmqs[testing" in str(workflow["jobs"]["test"]["steps"])
    shown = 0
    for block in docs.blocks("docs/testing.md"):
        m = re.match(r"an excerpt of (examples/testing/\S+);", block.not_run or "")
        if m:
            assert block.code in (ROOT / m[1]).read_text(), f"{block.where} is not an excerpt of {m[1]}"
            shown += 1
    assert shown == 4
