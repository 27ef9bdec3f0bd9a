"""The version floors rmqs checks on import (pyspark_rmqs.core.versions, issue 45): the same as the
extras' ranges in pyproject.toml and docs/compatibility.md's reasons, and a check that refuses only
what is below them. The real older releases are refused in `make test-compat`'s below-range ends
(tests/compat/test_refused.py); here, the versions `make test` runs are accepted."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from pyspark_rmqs.core.versions import (
    AIRFLOW,
    DAGSTER,
    PYSPARK,
    Minimum,
    UnsupportedVersionError,
    installed,
    release,
    require,
    too_old,
)

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize(
    ("minimum", "extra", "requirement"),
    [(PYSPARK, "spark", "pyspark"), (AIRFLOW, "airflow", "apache-airflow"), (DAGSTER, "dagster", "dagster")],
)
def test_each_floor_is_the_extras_range_and_the_documented_reason(
    minimum: Minimum, extra: str, requirement: str
) -> None:
    floors = {
        m.group(1)
        for spec in EXTRAS[extra]
        if (m := re.fullmatch(rf"{re.escape(requirement)}(?:\[\w+\])?>=([\d.]+)(?:,<[\d.]+)?", spec))
    }
    assert floors == {minimum.version}, f"pyproject.toml's [{extra}] starts at {floors}"
    page = (ROOT / "docs" / "compatibility.md").read_text()
    assert f"**{minimum.product.removeprefix('Apache ')} {minimum.version}**" in page


@pytest.mark.parametrize(
    ("version", "parsed"),
    [("4.0.1", (4, 0, 1)), ("3.2", (3, 2)), ("4.1.0.dev0", (4, 1, 0)), ("1!0+dev", None), ("", None)],
)
def test_release_numbers(version: str, parsed: tuple[int, ...] | None) -> None:
    assert release(version) == parsed


@pytest.mark.parametrize(
    ("minimum", "found"),
    [(PYSPARK, "4.0.1"), (PYSPARK, "3.5.6"), (AIRFLOW, "3.1.8"), (AIRFLOW, "2.11.0"), (DAGSTER, "1.12.14")],
)
def test_below_the_floor_the_message_names_both_versions_and_why(minimum: Minimum, found: str) -> None:
    with pytest.raises(UnsupportedVersionError) as raised:
        require(minimum, found)
    assert isinstance(raised.value, ImportError)
    message = str(raised.value)
    assert message.startswith(f"rmqs needs {minimum.product} {minimum.version} or later: {minimum.why}.")
    assert f"This is {minimum.product} {found}:" in message
    assert f"pip install '{minimum.distributions[0]}>={minimum.version}'" in message


@pytest.mark.parametrize(
    ("minimum", "found"),
    [(PYSPARK, "4.1.0"), (PYSPARK, "5.0.0"), (AIRFLOW, "3.2.0"), (DAGSTER, "1.12.15"), (DAGSTER, "1!0+dev")],
)
def test_at_or_above_the_floor_nothing_is_refused(minimum: Minimum, found: str) -> None:
    assert too_old(minimum, found) is None
    require(minimum, found)


def test_the_versions_make_test_runs_are_accepted_and_the_data_source_is_the_real_one() -> None:
    for minimum in (PYSPARK, AIRFLOW, DAGSTER):
        assert installed(minimum) is not None
        require(minimum)
    import pyspark_rmqs
    from pyspark_rmqs.spark.source import RabbitMQStreamsDataSource

    assert pyspark_rmqs.DefaultSource is RabbitMQStreamsDataSource


def test_the_spark_packages_check_reads_metadata_and_imports_no_pyspark() -> None:
    """`pyspark_rmqs.spark.jvm` (`rmqs spark-archive`, the suite's start) and `pythonpath` import no
    pyspark: the package's version check must not either."""
    import subprocess
    import sys

    code = (
        "import sys, pyspark_rmqs.spark.jvm, pyspark_rmqs.spark.pythonpath; print('pyspark' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr
