"""The code blocks of README.md, README.pypi.md and docs/: which the snippet test runs, and why not.

A block runs in the suite (tests/integration/test_docs_snippets.py) when it is `python`, or
`console` made only of `rmqs` commands. Any other block says why it is not run, in an HTML comment
on the line before it (invisible on the site and on the package index):

    <!-- not run: needs a Spark cluster; tests/e2e/test_spark_connect.py covers the same calls -->

tests/unit/test_docs.py checks that every block either runs or says why not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason given, when the block is not run

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[str]:
    """Every page a user reads: the two READMEs, the project's root documents and docs/."""
    root = ("README.md", "README.pypi.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md")
    docs = sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
    return [p for p in root if (ROOT / p).exists()] + docs


def blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        line = text.count("\n", 0, m.start()) + 1
        found.append(
            Block(page, line, m.group("lang"), m.group("code"), reason["reason"] if reason else None)
        )
    return found


def rmqs_lines(code: str) -> list[str]:
    """The command of each line (comments dropped), blank lines left out."""
    return [cmd for line in code.splitlines() if (cmd := line.split("#")[0].strip())]


def runs(block: Block) -> bool:
    """Whether the snippet test runs this block (python, or console of `rmqs` commands only)."""
    if block.not_run is not None:
        return False
    if block.lang == "python":
        return True
    if block.lang == "console":
        lines = rmqs_lines(block.code)
        return bool(lines) and all(cmd.split()[0].endswith("rmqs") for cmd in lines)
    return False
