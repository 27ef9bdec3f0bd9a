"""The user docs stay short: docs/ has a line budget, and docs/operations.md one of its own.

Issue 46 cut docs/ from 4,386 lines (docs/operations.md 911, most of it a history of measurements,
now in bench/README.md) and set these ceilings. A page that grows past them fails here: say it
once and link (each fact has one page), move contributors' material to CONTRIBUTING.md or
bench/README.md, or raise the number below on purpose, with the reason in the commit message.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every page of docs/ (the files included from the root, CHANGELOG.md and CONTRIBUTING.md, count as
# their one include line). 2,905 after issue 46's docs work, plus 120 for docs/permissions.md
# (least privilege, written beside it), then 2,757 once each fact was said once and contributors'
# material moved to CONTRIBUTING.md; 2,595, the goal of at most 2,600 met, once docs/testing.md
# linked to examples/testing (the files the suite runs) instead of showing them whole, and repeated
# sentences of the semantics, operations and deployment pages were merged; 2,596 with
# core/versions.py in docs/architecture.md's module tree (one line a module, checked).
TOTAL = 2_596
PAGE = {"docs/operations.md": 250}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_docs_stay_within_their_line_budget() -> None:
    pages = {p.relative_to(ROOT).as_posix(): lines(p) for p in sorted((ROOT / "docs").rglob("*.md"))}
    total = sum(pages.values())
    largest = sorted(pages.items(), key=lambda kv: -kv[1])[:5]
    assert total <= TOTAL, (
        f"docs/ is {total} lines, over its budget of {TOTAL} (largest: {largest}): say it once and "
        "link, move contributors' material out of docs/, or raise TOTAL on purpose, saying why"
    )


def test_operations_stays_a_page_of_operations() -> None:
    for page, budget in PAGE.items():
        assert lines(ROOT / page) <= budget, (
            f"{page} is over {budget} lines: measurements go to bench/README.md"
        )
