"""Spark's Python processes in the suite's venv import pyspark's compiled modules, not `pyspark.zip`.

Spark starts every Python process of a session (the data-source lookup, create, plan, write and
commit runners, the task workers, the streaming source runner) with `$SPARK_HOME/python/lib/pyspark.zip`
first on PYTHONPATH. That zip holds pyspark's sources and no bytecode, and zipimport never caches
what it compiles: each such process compiles the ~100 pyspark modules it imports again, 0.8-0.9 s
of CPU (`import pyspark.worker, pyspark.sql.worker.plan_data_source_read` from the zip: 1.24-1.38 s;
from the venv's compiled copy: 0.42-0.47 s). The suite's ~45 sessions start some 350 of them.

With pyspark installed in the venv, that zip is the very pyspark beside it
(`<site-packages>/pyspark/python/lib/pyspark.zip`): the same sources. `make setup` copies this file
into the venv's site-packages with a `.pth` that imports it at every interpreter start; it moves
those zip entries (and py4j's) behind the rest of `sys.path`, so the compiled modules win. A zip
from another Spark installation is left where it is. This changes where the same code is loaded
from, never what runs; a venv without the `.pth` (a fresh clone's pytest run by hand) is slower
and otherwise the same. rmqs itself never installs it into a user's environment.

`python -m tests.support.pyspark_zip` installs it into the running interpreter's site-packages.
"""

from __future__ import annotations

import os
import sys

MODULE = "_rmqs_suite_pyspark_zip"


def demote(path: list[str], site_packages: str) -> None:
    """Move the zips of the pyspark installed in `site_packages` to the end of `path`, in place."""
    lib = os.path.join(site_packages, "pyspark", "python", "lib")
    zips = [p for p in path if p.endswith(".zip") and os.path.dirname(p) == lib]
    for p in zips:
        path.remove(p)
    path.extend(zips)


def install() -> str:
    """Copy this module into the running interpreter's site-packages, with the `.pth` that imports it."""
    import py_compile
    import sysconfig
    from pathlib import Path

    site = Path(sysconfig.get_paths()["purelib"])
    target = site / f"{MODULE}.py"
    target.write_text(Path(__file__).read_text())
    # Compiled here: the suite may run with PYTHONDONTWRITEBYTECODE, and every interpreter imports it.
    py_compile.compile(str(target), doraise=True)
    (site / f"{MODULE}.pth").write_text(f"import {MODULE}\n")
    return str(target)


if __name__ == MODULE:  # the copy in site-packages, imported by its .pth at interpreter start
    demote(sys.path, os.path.dirname(os.path.abspath(__file__)))
elif __name__ == "__main__":
    print(install())
