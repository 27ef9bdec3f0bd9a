"""scripts/compat.py's Python end (issue 45): it changes only Python, and a machine without that
Python skips it, saying where it looked, without failing the tier (CI stays green there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compat() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rmqs_compat_script", ROOT / "scripts" / "compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _pins(path: Path) -> set[str]:
    return {
        line.strip() for line in path.read_text().splitlines() if "==" in line and not line.startswith("#")
    }


def test_the_python_end_runs_what_make_test_runs_but_python() -> None:
    compat = _compat()
    end = next(e for e in compat.ENDS if e.product == "Python")
    assert end.python == "3.13"
    pins = set(end.pins)
    assert {p.split("==")[0] for p in pins} == {"pyspark", "apache-airflow", "dagster", "dagster-dg-cli"}
    assert pins <= _pins(ROOT / "requirements" / "constraints.txt")
    assert pins <= _pins(end.lock), f"{end.lock} is stale: python scripts/compat.py lock {end.name}"
    assert end.lock.read_text().count("--python-version 3.13") == 1
    for subset in (compat.SPARK_TESTS, compat.AIRFLOW_TESTS, compat.DAGSTER_TESTS):
        assert all(t in end.tests or t.startswith("tests/unit/") for t in subset)
    assert "tests/unit" in end.tests


def test_without_the_interpreter_the_end_is_skipped_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    compat = _compat()
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(compat, "uv", lambda: str(tmp_path / "no-uv"))
    python, looked = compat.find_python("3.13")
    assert python is None
    assert looked == [f"{tmp_path}/versions/3.13.*", "python3.13 on PATH", "uv python find 3.13"]

    def build(end: object, python: str) -> float:
        raise AssertionError("nothing is built without an interpreter")

    monkeypatch.setattr(compat, "build", build)
    monkeypatch.setattr(sys, "argv", ["compat.py", "python-3.13"])
    assert compat.main() == 0
    out = capsys.readouterr().out
    assert f"| Python | python-3.13 | 3.13 | skipped: no Python 3.13 interpreter (looked in {tmp_path}" in out


def test_the_java_21_end_runs_the_spark_tests_in_a_debian_13_root_and_needs_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    compat = _compat()
    end = next(e for e in compat.ENDS if e.name == "java-21")
    assert end.in_debian13 and end.tests == tuple(compat.SPARK_TESTS)
    monkeypatch.setattr(compat.os, "geteuid", lambda: 1000)

    def run(*args: object, **kwargs: object) -> None:
        raise AssertionError("no root is built without root")

    monkeypatch.setattr(compat.subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["compat.py", "java-21"])
    assert compat.main() == 0
    assert (
        "| Java | java-21 | ? | skipped: the Debian 13 root needs root (chroot, mounts) |"
        in capsys.readouterr().out
    )


def test_each_refused_end_is_one_release_below_its_range_with_no_extra_of_rmqs() -> None:
    compat = _compat()
    from pyspark_rmqs.core.versions import AIRFLOW, DAGSTER, PYSPARK, too_old

    floors = {"PySpark": PYSPARK, "Apache Airflow": AIRFLOW, "Dagster": DAGSTER}
    refused = [e for e in compat.ENDS if e.refused]
    assert {e.product for e in refused} == set(floors)
    for end in refused:
        assert too_old(floors[end.product], end.version) is not None, f"{end.name} is not below the range"
        pins = _pins(end.lock)
        assert set(end.pins) <= pins, f"{end.lock} is stale: python scripts/compat.py lock {end.name}"
        assert not any(p.startswith("rmqs") for p in pins)
        assert end.tests == ("tests/compat/test_refused.py",)


def _rows(page: str) -> dict[str, list[str]]:
    """docs/compatibility.md's first table: its first cell's first word(s) -> the row's cells."""
    rows: dict[str, list[str]] = {}
    for line in page.split("## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4:
            rows[cells[0]] = cells
    return rows


def test_the_compatibility_page_states_the_declared_ranges_and_every_version_the_tiers_run() -> None:
    """docs/compatibility.md is checked against what runs: each range as pyproject.toml declares it,
    and in its "tested" column each version `make test` (requirements/constraints.txt) and each end
    of `make test-compat` runs; the releases below the ranges on the page as refused."""
    import tomllib

    compat = _compat()
    page = (ROOT / "docs" / "compatibility.md").read_text()
    rows = _rows(page)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def row(product: str) -> list[str]:
        found = [cells for first, cells in rows.items() if first.split(" (")[0] == product]
        assert len(found) == 1, f"one row for {product} in docs/compatibility.md, found {len(found)}"
        return found[0]

    for product, extra, requirement in (
        ("PySpark", "spark", "pyspark"),
        ("Apache Airflow", "airflow", "apache-airflow"),
        ("Dagster", "dagster", "dagster"),
    ):
        spec = next(s for s in extras[extra] if s.startswith(requirement + ">="))
        low, _, high = spec.removeprefix(requirement + ">=").partition(",<")
        declared = f"{low} to < {high}" if high else f"{low}+"
        assert row(product)[1] == declared, f"{product}: pyproject.toml declares {spec}"
        main = _pins(ROOT / "requirements" / "constraints.txt")
        pinned = next(p.split("==")[1] for p in main if p.startswith(requirement + "=="))
        assert pinned in row(product)[2], f"{product} {pinned} (make test) is not in the tested column"
    for end in compat.ENDS:
        if end.refused:
            assert end.version in page, f"{end.name}: the refused {end.product} {end.version} is not named"
            continue
        version = "21." if end.product == "Java" else end.version  # 21.0.13: not `java-21`
        assert version in row(end.product)[2], f"{end.name}: {end.product} {version} not in the tested column"
