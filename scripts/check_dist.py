"""`make dist`'s content check of the built wheel and sdist (twine checks the metadata).

The wheel holds the four packages (DESIGN §3's three and the pytest plugin `pytest_rmqs`), each
with `py.typed`, the connector's layer folders, and the license; its metadata names the license
file, the version of `pyspark_rmqs.__version__`, and a long description without links into the
repository (they break on the package index). The sdist holds the docs, the example DAGs, the
example test project (docs/testing.md names it), the license and the changelog. Exit 1 with one
line per problem.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

PACKAGES = ("pyspark_rmqs", "airflow_rmqs", "dagster_rmqs", "pytest_rmqs")
# The connector's layer folders (docs/architecture.md): a wheel without one fails on import.
LAYERS = ("core", "options", "broker", "spark", "runs", "runs/outputs", "cli")
SDIST_FILES = (
    "LICENSE",
    "CHANGELOG.md",
    "README.md",
    "README.pypi.md",
    "docs/index.md",
    "dags/rmqs_ingest.py",
    "examples/testing/test_streams.py",
)


def problems(dist: Path) -> list[str]:
    found: list[str] = []
    [wheel] = dist.glob("rmqs-*.whl")
    [sdist] = dist.glob("rmqs-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    for pkg in PACKAGES:
        if f"{pkg}/py.typed" not in names:
            found.append(f"{wheel.name}: no {pkg}/py.typed")
    for layer in LAYERS:
        if f"pyspark_rmqs/{layer}/__init__.py" not in names:
            found.append(f"{wheel.name}: no pyspark_rmqs/{layer}/")
    [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(meta_name).decode())
    if meta.get("License-Expression") != "Apache-2.0" or meta.get("License-File") != "LICENSE":
        found.append(f"{wheel.name}: License-Expression/License-File missing")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        found.append(f"{wheel.name}: the LICENSE file is not in the wheel")
    init = zipfile.ZipFile(wheel).read("pyspark_rmqs/__init__.py").decode()
    version = re.search(r'__version__ = "([^"]+)"', init)
    if not version or meta["Version"] != version.group(1):
        found.append(f"{wheel.name}: Version {meta['Version']} is not pyspark_rmqs.__version__")
    description = meta.get_payload()
    for link in re.findall(r"\]\(([^)]+)\)", description):
        if not link.startswith("https://"):
            found.append(f"{wheel.name}: the long description links to {link!r} (breaks off the repository)")
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    for path in SDIST_FILES:
        if path not in members:
            found.append(f"{sdist.name}: no {path}")
    return found


def main() -> int:
    found = problems(Path(sys.argv[1] if len(sys.argv) > 1 else "dist"))
    for line in found:
        print(f"check_dist: {line}", file=sys.stderr)
    if not found:
        print("check_dist: wheel and sdist complete")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
