"""The lowest PySpark, Apache Airflow and Dagster rmqs runs on, checked when each integration is imported.

`pip install 'rmqs[airflow]'` refuses an Airflow older than the extras' ranges (pyproject.toml),
but a platform's own PySpark, Airflow or Dagster does not come through rmqs's extras: a managed
runtime ships its PySpark, an Airflow image its Airflow, and `pip install rmqs` beside them installs
nothing to check them against. Without a check, a too-old one fails later, on the first PySpark or
Airflow name it lacks (`cannot import name 'DataSourceStreamArrowWriter'`), or, for Dagster, only
when a definition is loaded. So each integration checks the version it finds when it is imported
and fails then, naming the version it needs and the API that needs it: `pyspark_rmqs.spark`
(the Data Source), `airflow_rmqs` (the provider) and `dagster_rmqs`.

docs/compatibility.md gives the same reasons; tests/unit/test_versions.py checks the minimums here
against pyproject.toml's extras and that page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

from pyspark_rmqs.core.errors import UnsupportedVersionError

__all__ = ["AIRFLOW", "DAGSTER", "PYSPARK", "Minimum", "UnsupportedVersionError", "require", "too_old"]


@dataclass(frozen=True)
class Minimum:
    """The lowest `product` rmqs supports, why, and the distributions its installed version is read
    from (the first one installed)."""

    product: str
    version: str
    why: str
    distributions: tuple[str, ...]


PYSPARK = Minimum(
    "PySpark",
    "4.1",
    "streaming writes (DataSourceStreamArrowWriter) and filter pushdown for Python data sources "
    "first appear in PySpark 4.1",
    ("pyspark", "pyspark-client", "pyspark-connect"),
)
AIRFLOW = Minimum(
    "Apache Airflow",
    "3.2",
    "the provider uses airflow.sdk.conf and airflow.sdk.exceptions, which first appear in Airflow 3.2",
    ("apache-airflow-core", "apache-airflow"),
)
DAGSTER = Minimum(
    "Dagster",
    "1.12.15",
    "an asset's pool is its consumer name (etl-orders), and Dagster accepts pool names with '-' from 1.12.15",
    ("dagster",),
)


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers a version starts with (`4.0.1` -> (4, 0, 1)); None when it starts with
    none (`1!0+dev`, a development build: not checked)."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return None if found is None else tuple(int(n) for n in found.groups() if n is not None)


def installed(minimum: Minimum) -> str | None:
    """The installed version of `minimum`'s product, from the first of its distributions found."""
    for name in minimum.distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def too_old(minimum: Minimum, found: str | None) -> str | None:
    """The error message when `found` is older than `minimum`, else None (also when unknown)."""
    have, want = release(found or ""), release(minimum.version)
    if have is None or want is None or have >= want:
        return None
    return (
        f"rmqs needs {minimum.product} {minimum.version} or later: {minimum.why}. This is "
        f"{minimum.product} {found}: upgrade to {minimum.product} {minimum.version} or later "
        f"(pip install '{minimum.distributions[0]}>={minimum.version}'); docs/compatibility.md lists "
        "what each version supports"
    )


def require(minimum: Minimum, found: str | None = None) -> None:
    """Raise UnsupportedVersionError when the installed product (or `found`) is older than `minimum`."""
    message = too_old(minimum, found if found is not None else installed(minimum))
    if message is not None:
        raise UnsupportedVersionError(message)
