"""Spark's Python processes import the environment's compiled pyspark instead of `pyspark.zip`'s sources.

Spark starts every Python process of a session (the data source lookup, create, plan, write and
commit runners, the task workers, a streaming query's source runner) with
`$SPARK_HOME/python/lib/pyspark.zip` first on its PYTHONPATH. The zip holds pyspark's sources and
no bytecode, and zipimport keeps none: each such process compiles the ~100 pyspark modules it
imports anew, 0.8-0.9 s of CPU (`import pyspark.worker, pyspark.sql.worker.plan_data_source_read`
from the zip: 1.24-1.38 s; from a pip-installed pyspark's compiled modules: 0.42-0.47 s). A cold
read starts four of them one after the other before its first row.

Where pyspark is pip-installed, that zip is the very pyspark beside it
(`<site-packages>/pyspark/python/lib/pyspark.zip`): the same sources. `install()` (what
`rmqs spark-archive --compiled-pyspark` runs, once, where the tasks run) copies this module into
that site-packages with a `.pth` that imports it at every interpreter start of the environment; it
takes those zip entries (and py4j's, when py4j is installed there too) off `sys.path`, so the
compiled modules are the ones imported. Off, not moved to its end: on Python 3.13.5 (Debian 13's),
PySpark's worker calls `importlib.invalidate_caches()`, which drops a zip's directory from
zipimport's cache until something is imported from that zip again; a zip at the end of the path
never is, and `pkgutil.iter_modules()` (PySpark's lookup of `pyspark_*` data sources) then fails
with a KeyError on it. A zip of another Spark installation (a `SPARK_HOME` of its own), or py4j's
zip without py4j installed beside, is left where it is. It changes where the same code is loaded
from, never what runs, for every Spark session of that environment, which is
why rmqs never installs it unasked; `remove()` takes it out again, and `RMQS_COMPILED_PYSPARK=off`
in a process's environment turns it off for that process and the Spark processes it starts.

This module imports only `os` and `sys` at module level: its copy runs at every interpreter start.
"""

from __future__ import annotations

import os
import sys

MODULE = "_rmqs_compiled_pyspark"
"""The name of the copy in site-packages and of its `.pth`."""
OFF_ENV = "RMQS_COMPILED_PYSPARK"
"""`off` in a process's environment (inherited by the Spark processes it starts) turns the move off."""


def drop_zips(path: list[str], site_packages: str) -> None:
    """Take off `path`, in place, the zips of the pyspark installed in `site_packages` whose package
    is installed there too (pyspark's always, py4j's when py4j is)."""
    lib = os.path.join(site_packages, "pyspark", "python", "lib")

    def installed_beside(zip_path: str) -> bool:
        package = "py4j" if os.path.basename(zip_path).startswith("py4j") else "pyspark"
        return os.path.exists(os.path.join(site_packages, package, "__init__.py"))

    path[:] = [
        p for p in path if not (p.endswith(".zip") and os.path.dirname(p) == lib and installed_beside(p))
    ]


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def install(site_packages: str | None = None) -> str:
    """Copy this module and its `.pth` into `site_packages` (default: the running interpreter's);
    return the copy's path. Raises OSError when pyspark is not installed there."""
    import py_compile
    from pathlib import Path

    site = Path(site_packages or _site_packages())
    if not (site / "pyspark" / "__init__.py").exists():
        raise OSError(f"pyspark is not installed in {site}: its Python processes load it from elsewhere")
    target = site / f"{MODULE}.py"
    target.write_text(Path(__file__).read_text())
    # Compiled here: the environment may run with PYTHONDONTWRITEBYTECODE, and every interpreter imports it.
    py_compile.compile(str(target), doraise=True)
    (site / f"{MODULE}.pth").write_text(f"import {MODULE}\n")
    return str(target)


def installed(site_packages: str | None = None) -> bool:
    """Whether the `.pth` is in `site_packages` (default: the running interpreter's)."""
    return os.path.exists(os.path.join(site_packages or _site_packages(), f"{MODULE}.pth"))


def remove(site_packages: str | None = None) -> None:
    """Take the `.pth` and the copy out of `site_packages` again (nothing when absent)."""
    site = site_packages or _site_packages()
    for name in (f"{MODULE}.pth", f"{MODULE}.py"):
        try:
            os.remove(os.path.join(site, name))
        except FileNotFoundError:
            pass


if __name__ == MODULE and os.environ.get(OFF_ENV) != "off":  # the copy, imported by its .pth
    drop_zips(sys.path, os.path.dirname(os.path.abspath(__file__)))
