"""`make test-compat`: each product's declared range tested at both ends, each end in a venv of its own.

`make test` runs one version of everything (requirements/constraints.txt). A user's platform has
another: Spark 4.0 on a managed runtime, an Airflow 3.1 deployment, last month's Dagster. This tier
installs, for each of Spark, Airflow and Dagster, the lowest and the highest version of the range
`pyproject.toml` declares, each in its own venv (`.venv-compat/<name>`) from a lock of its own
(`requirements/compat/<name>.txt`, every other package resolved as `make lock` would), rmqs from
this checkout (editable), and runs the tests that exercise that product's integration against the
real broker (the suite's, `scripts/broker.sh`). Not the whole suite: the rest of rmqs does not
change with these versions, and `make test` runs it.

The subsets, and why (CONTRIBUTING.md has the last results):
- Spark: the Data Source's batch reads (with pushdown), writes, and Structured Streaming reads and
  writes (tests/integration/test_spark_{batch,sink,streaming}.py), and the PySpark internals rmqs
  relies on (tests/unit/test_spark_compat.py). On Spark < 4.2 the streaming tests that need
  admission control (`maxRecordsPerTrigger`, `maxBytesPerTrigger`) are skipped and
  test_read_limits_name_the_spark_they_need checks the error those options get instead.
- Airflow: the provider's registration, hook, triggers and sensors (deferred on a triggerer), the
  DAGs run with `dag.test()`, operator arguments, lineage and the Spark-free operators
  (tests/airflow/test_{provider,hook,triggers,sensors,dags,operator_args,lineage,without_spark}.py).
- Dagster: assets, the component (`dg`), sensors, resources and definitions, partitions
  (tests/dagster/test_{assets,component,sensors,resources_and_definitions,partitions}.py).
- Python 3.13 (`python-3.13`; the other ends and `make test` run 3.11, 3.12 is not tested): the
  PySpark, Airflow and Dagster of requirements/constraints.txt, so only Python changes, running
  tests/unit (whole) and the three subsets above: 1,590 tests, 171 s alone on 2 cores, 202-290 s
  shared with two other sessions (2026-12-06; building its venv: 29 s). Its interpreter is
  found on this machine (pyenv's versions, `python3.13` on PATH, `uv python find`), never
  downloaded: without one the row says `skipped: no Python 3.13 interpreter (looked in ...)` and
  the tier does not fail.
- Below each range (`spark-4.0`, `airflow-3.1`, `dagster-1.12.0`, each marked `refused`): a user
  whose platform has an older PySpark, Airflow or Dagster than rmqs supports must get an error on
  import naming the version needed and why (pyspark_rmqs.core.versions), and PySpark's other data
  sources must still load. Their venvs hold only that product, rmqs's own dependencies and pytest
  (an extra of rmqs's would refuse the version: that is the install-time error), and run
  tests/compat/test_refused.py without the suite's conftest.
- Java 21 (`java-21`; this machine's Java is 17, Debian 12 has no 21): the Spark subset run in a
  throwaway Debian 13 root (scripts/check_debian13.sh tests), whose `make setup` installs Debian 13's
  OpenJDK 21 and builds the venv with its Python 3.13, against this machine's broker. Needs root
  (chroot, mounts): otherwise the row says `skipped` and the tier does not fail.

Usage: `python scripts/compat.py [NAME...]` builds (when its lock changed) and tests the named
ends (all by default), one venv at a time (2 cores), prints a table of version x result and exits
non-zero when any end failed. `python scripts/compat.py lock [NAME...]` re-resolves the locks
(after a range in pyproject.toml changes). `--build-only` stops after the venvs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements" / "compat"
VENVS = ROOT / ".venv-compat"
EXTRAS = ["airflow", "dagster", "spark", "connect", "openlineage", "iceberg", "s3", "testing", "dev"]
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
XDIST = ["-n", "2", "--dist", "loadgroup"]  # the suite's workers, in a venv and in the Debian 13 root

SPARK_TESTS = [
    "tests/unit/test_spark_compat.py",
    "tests/integration/test_spark_batch.py",
    "tests/integration/test_spark_sink.py",
    "tests/integration/test_spark_streaming.py",
]
AIRFLOW_TESTS = [
    f"tests/airflow/test_{name}.py"
    for name in (
        "provider",
        "hook",
        "triggers",
        "sensors",
        "dags",
        "operator_args",
        "lineage",
        "without_spark",
    )
]
DAGSTER_TESTS = [
    f"tests/dagster/test_{name}.py"
    for name in ("assets", "component", "sensors", "resources_and_definitions", "partitions")
]


def _main_pins(*packages: str) -> tuple[str, ...]:
    """The versions `make test` runs (requirements/constraints.txt), so the Python end changes only Python."""
    lines = (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
    found = {line.split("==", 1)[0]: line.strip() for line in lines if "==" in line}
    return tuple(found[p] for p in packages)


@dataclass(frozen=True)
class End:
    """One end of a declared range: the venv's name, the product and the pins its lock is resolved with."""

    name: str
    product: str
    pins: tuple[str, ...]
    tests: tuple[str, ...]
    python: str = PYTHON_VERSION
    in_debian13: bool = False  # run by scripts/check_debian13.sh in a Debian 13 root, not in .venv-compat
    refused: bool = False  # below the declared range: the tests check that rmqs refuses it on import

    @property
    def lock(self) -> Path:
        return LOCKS / f"{self.name}.txt"

    @property
    def venv(self) -> Path:
        return VENVS / self.name

    @property
    def version(self) -> str:
        return self.python if self.product == "Python" else self.pins[0].split("==", 1)[1]


# Lowest and highest of each range in pyproject.toml (the highest: the newest release on PyPI when
# the locks were made, 2026-12-06). dagster-dg-cli (a dev tool the tests use) pins dagster to its
# own version and has no release past 1.13.27, so the Dagster end is 1.13.27 (1.13.29 is out).
# docs/compatibility.md says why each lowest end is where it is.
ENDS = [
    End("spark-lowest", "PySpark", ("pyspark==4.1.0",), tuple(SPARK_TESTS)),
    End("spark-highest", "PySpark", ("pyspark==4.3.0",), tuple(SPARK_TESTS)),
    End("airflow-lowest", "Apache Airflow", ("apache-airflow==3.2.0",), tuple(AIRFLOW_TESTS)),
    End("airflow-highest", "Apache Airflow", ("apache-airflow==3.3.2",), tuple(AIRFLOW_TESTS)),
    End("dagster-lowest", "Dagster", ("dagster==1.12.15", "dagster-dg-cli==1.12.15"), tuple(DAGSTER_TESTS)),
    End("dagster-highest", "Dagster", ("dagster==1.13.27", "dagster-dg-cli==1.13.27"), tuple(DAGSTER_TESTS)),
    End(
        "python-3.13",
        "Python",
        _main_pins("pyspark", "apache-airflow", "dagster", "dagster-dg-cli"),
        (
            "tests/unit",
            *[t for t in SPARK_TESTS if not t.startswith("tests/unit/")],
            *AIRFLOW_TESTS,
            *DAGSTER_TESTS,
        ),
        python="3.13",
    ),
    *(
        End(name, product, (pin,), ("tests/compat/test_refused.py",), refused=True)
        for name, product, pin in (
            ("spark-4.0", "PySpark", "pyspark==4.0.0"),
            ("airflow-3.1", "Apache Airflow", "apache-airflow==3.1.0"),
            ("dagster-1.12.0", "Dagster", "dagster==1.12.0"),
        )
    ),
    End(
        "java-21",
        "Java",
        _main_pins("pyspark"),
        tuple(SPARK_TESTS),
        python="3.13",
        in_debian13=True,
    ),
]


def uv() -> str:
    found = ROOT / ".venv" / "bin" / "uv"
    if found.exists():
        return str(found)
    which = shutil.which("uv")
    if which is None:
        sys.exit("compat: uv not found: run `make setup` first")
    return which


def _python_version(python: str) -> tuple[int, int] | None:
    """(major, minor) of the interpreter at `python`, or None when it does not run (a pyenv shim
    whose version is not selected exits non-zero)."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def find_python(version: str) -> tuple[str | None, list[str]]:
    """An interpreter of `version` (`3.13`) on this machine, and where it looked. For the ends of
    PYTHON_VERSION, the one running this script (`make setup`'s venv), as before the Python end;
    else pyenv's versions, `pythonX.Y` on PATH, then `uv python find` (installed interpreters only:
    no download, PyPI is all CI reaches)."""
    if version == PYTHON_VERSION:
        return sys.executable, []
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    looked = [f"{pyenv}/{version}.*", f"python{version} on PATH", f"uv python find {version}"]
    candidates = sorted(
        pyenv.glob(f"{version}.*/bin/python{version}"),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.parts[-3].split(".")],
        reverse=True,
    )
    found: list[str] = [str(p) for p in candidates]
    on_path = shutil.which(f"python{version}")
    if on_path:
        found.append(on_path)
    try:
        out = subprocess.run(
            [uv(), "python", "find", "--no-python-downloads", version],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode == 0 and out.stdout.strip():
            found.append(out.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    want = tuple(int(x) for x in version.split("."))
    for python in found:
        if _python_version(python) == want:
            return python, looked
    return None, looked


def lock(end: End) -> None:
    """Resolve `end`'s lock: the dev install's extras with the product pinned (a constraint, so the
    declared range must admit it), and requirements/overrides.txt as `make lock` uses it. It starts
    from the suite's lock (requirements/constraints.txt), whose pins uv keeps where the product's
    version allows: an end differs from what `make test` runs only by what its product needs."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "requirements" / "constraints.txt", end.lock)
    pins = LOCKS / f"{end.name}.pins"
    wanted = list(end.pins)
    if end.refused:  # no extra of rmqs's (each would refuse this version): its own dependencies, pytest
        wanted += [
            *tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"],
            "pytest>=8",
        ]
    pins.write_text("".join(f"{p}\n" for p in wanted))
    if end.refused:
        cmd = [uv(), "pip", "compile", str(pins.relative_to(ROOT))]
    else:
        cmd = [uv(), "pip", "compile", "pyproject.toml", *[a for e in EXTRAS for a in ("--extra", e)]]
        cmd += ["-c", str(pins.relative_to(ROOT))]
    cmd += ["--override", "requirements/overrides.txt"]
    cmd += ["--python-version", end.python, "--python-platform", PLATFORM, "-q", "-o"]
    cmd += [str(end.lock.relative_to(ROOT))]
    subprocess.run(cmd, cwd=ROOT, check=True)


def _digest(end: End, python: str) -> str:
    return hashlib.sha256(
        end.lock.read_bytes()
        + (ROOT / "requirements/overrides.txt").read_bytes()
        + os.path.realpath(python).encode()
    ).hexdigest()


def build(end: End, python: str) -> float:
    """The venv from the lock with `python`, rmqs editable from this checkout; nothing done when the
    lock and the interpreter are unchanged."""
    stamp = end.venv / ".rmqs-compat"
    if stamp.exists() and stamp.read_text() == _digest(end, python):
        return 0.0
    t0 = time.monotonic()
    if end.venv.exists():
        shutil.rmtree(end.venv)
    subprocess.run([uv(), "venv", "-q", "--python", python, str(end.venv)], check=True)
    py = str(end.venv / "bin" / "python")
    subprocess.run([uv(), "pip", "sync", "-q", "--python", py, str(end.lock)], cwd=ROOT, check=True)
    subprocess.run(
        [uv(), "pip", "install", "-q", "--python", py, "--no-deps", "-e", "."], cwd=ROOT, check=True
    )
    if not end.refused and any(line.startswith("pyspark==") for line in end.lock.read_text().splitlines()):
        # Spark's Python workers import the venv's compiled pyspark (tests/support/pyspark_zip.py).
        subprocess.run([py, "-m", "tests.support.pyspark_zip"], cwd=ROOT, check=True, capture_output=True)
    stamp.write_text(_digest(end, python))
    return time.monotonic() - t0


def installed(end: End, package: str) -> str:
    """`package`'s version in the end's venv; for the Python end, the interpreter's."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    if end.product == "Python":
        code = "import platform; print(platform.python_version())"
    out = subprocess.run(
        [str(end.venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "?"


def run_tests(end: End, extra: list[str]) -> tuple[int, float]:
    py = end.venv / "bin" / "python"
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=str(py), PYSPARK_DRIVER_PYTHON=str(py), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [str(py), "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    if end.refused:  # no xdist, and none of the suite's fixtures or plugins (not installed there)
        cmd += ["--noconftest", "-p", "no:rmqs", "-o", "addopts=", "-W", "ignore::pytest.PytestConfigWarning"]
    else:
        cmd += XDIST
    cmd += [*end.tests, *extra]
    print(f"compat: {end.name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    return rc, time.monotonic() - t0


def run_in_debian13(end: End, extra: list[str]) -> tuple[str, str, bool]:
    """`end`'s tests in a Debian 13 root (scripts/check_debian13.sh tests): its version (the root's
    Java and Python), the row's result, and whether it failed. Skipped, not failed, without root."""
    if os.geteuid() != 0:
        return "?", "skipped: the Debian 13 root needs root (chroot, mounts)", False
    cmd = ["bash", "scripts/check_debian13.sh", "tests", *XDIST, *end.tests, *extra]
    print(f"compat: {end.name}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    took = time.monotonic() - t0
    sys.stderr.write(out.stderr)
    versions = [ln.split("versions: ", 1)[1] for ln in out.stderr.splitlines() if "versions: " in ln]
    result = "passed" if out.returncode == 0 else f"failed (exit {out.returncode})"
    return (versions[0] if versions else "?"), f"{result} in {took:.0f} s", out.returncode != 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="ends to run (default: all); `lock` first to re-resolve")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments")
    args = parser.parse_args()
    names = list(args.names)
    relock = bool(names) and names[0] == "lock"
    if relock:
        names = names[1:]
    chosen = [e for e in ENDS if not names or e.name in names]
    unknown = set(names) - {e.name for e in ENDS}
    if unknown:
        sys.exit(f"compat: unknown end(s) {sorted(unknown)}; known: {[e.name for e in ENDS]}")
    if relock:
        for end in (e for e in chosen if not e.in_debian13):  # that end installs `make setup`'s lock
            lock(end)
            print(f"compat: locked {end.lock.relative_to(ROOT)}")
        return 0
    start = time.monotonic()
    rows: list[tuple[str, str, str, str]] = []
    failed = False
    for end in chosen:
        package = end.pins[0].split("==", 1)[0]
        if end.in_debian13:
            if args.build_only:
                continue
            version, result, end_failed = run_in_debian13(end, args.pytest_args.split())
            rows.append((end.product, end.name, version, result))
            failed = failed or end_failed
            continue
        python, looked = find_python(end.python)
        if python is None:
            # Not a failure: CI machines without this interpreter stay green, and the row says so.
            result = f"skipped: no Python {end.python} interpreter (looked in {', '.join(looked)})"
            rows.append((end.product, end.name, end.version, result))
            print(f"compat: {end.name}: {result}", flush=True)
            continue
        try:
            took = build(end, python)
        except subprocess.CalledProcessError as exc:
            rows.append((end.product, end.name, end.version, f"failed: venv not built ({exc})"))
            failed = True
            continue
        version = installed(end, package)
        label = "Python" if end.product == "Python" else package
        print(f"compat: {end.name}: {label} {version} (venv built in {took:.0f} s)", flush=True)
        if args.build_only:
            continue
        rc, took = run_tests(end, args.pytest_args.split())
        result = "passed (refused on import)" if end.refused else "passed"
        result = result if rc == 0 else f"failed (pytest exit {rc})"
        failed = failed or rc != 0
        rows.append((end.product, end.name, version, f"{result} in {took:.0f} s"))
    print(f"\ncompat: {len(rows)} ends in {time.monotonic() - start:.0f} s")
    print("| product | end | version | result |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
