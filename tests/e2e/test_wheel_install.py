"""The package as a user installs it: the built wheel in fresh virtual environments, outside the checkout.

The wheel is built once per session (`uv build --wheel`). For no extra and for each extra, a new
virtual environment under pytest's temporary folder gets `uv pip install "rmqs[EXTRA] @ file://..."`
with the lock (`requirements/constraints.txt`), from uv's cache first (`--offline`: hardlinks,
well under a second after `make setup` filled the cache) and from PyPI when the cache lacks a
package. Every command runs from a folder outside the checkout, with an environment a user would
have: no PYTHONPATH, no PYSPARK_* / SPARK_* / AIRFLOW_* / RMQS_* variables, and the venv not
activated (its bin/ is not on PATH, so `python3` is the system's).

What breaks here and nowhere else: a runtime import the wheel does not declare (click, issue 29),
a file the wheel does not ship (py.typed, LICENSE), a command offered by `rmqs --help` that needs
the checkout, a Spark session whose Python workers start an interpreter without rmqs
(`DATA_SOURCE_NOT_FOUND`), the Airflow provider not registered from the wheel's entry point.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.broker import BrokerSettings
from tests.support.data import publish
from tests.support.plugin_runs import USER_PROJECT

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
CONSTRAINTS = REPO / "requirements" / "constraints.txt"
PACKAGES = ("pyspark_rmqs", "airflow_rmqs", "dagster_rmqs", "pytest_rmqs")

# What each extra adds that a module of rmqs may import: without the extra, importing that module
# may fail on exactly these names (and on nothing else: anything else is an undeclared dependency).
OPTIONAL = {
    "spark": ("pyspark", "py4j"),
    "connect": ("pyspark", "py4j"),
    "airflow": ("airflow", "attr"),  # attrs: the lineage module's, installed with apache-airflow
    "dagster": ("dagster",),
    "openlineage": ("airflow", "attr", "openlineage"),
    "iceberg": ("pyiceberg",),
    "pkcs12": ("cryptography",),
    "testing": ("pytest", "testcontainers", "docker"),  # pytest_rmqs
    "s3": ("s3fs",),
}
ALL_OPTIONAL = sorted({name for names in OPTIONAL.values() for name in names})
EXTRAS = ["", "spark", "airflow", "dagster", "connect", "openlineage", "iceberg", "pkcs12", "testing", "s3"]


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """The caller's environment less what the checkout's tooling sets (the Makefile, the suite)."""
    drop = ("PYTHON", "PYSPARK", "SPARK", "AIRFLOW", "RMQS_", "VIRTUAL_ENV", "DAGSTER")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["HOME"] = str(home)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not UV.exists():
        pytest.skip(f"uv not found at {UV} (make setup installs it)")
    out = tmp_path_factory.mktemp("dist")
    for offline in (["--offline"], []):  # the build backend (hatchling) from uv's cache, else PyPI
        done = subprocess.run(
            [str(UV), "build", "-q", *offline, "--wheel", "--out-dir", str(out), str(REPO)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode == 0:
            break
    assert done.returncode == 0, f"uv build failed:\n{done.stderr}"
    [built] = out.glob("rmqs-*.whl")
    return built


class Venvs:
    """One fresh virtual environment per extra, made on first use and kept for the session."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root, self.wheel, self.made = root, wheel, dict[str, Path]()

    def __call__(self, extra: str) -> Path:
        if extra in self.made:
            return self.made[extra]
        venv = self.root / f"venv-{extra or 'bare'}"
        make = [str(UV), "venv", "-q", "--python", sys.executable, str(venv)]
        subprocess.run(make, check=True, timeout=120)
        spec = f"rmqs[{extra}] @ {self.wheel.as_uri()}" if extra else str(self.wheel)
        install = [str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
        started = time.monotonic()
        for offline in (["--offline"], []):  # uv's cache first (hardlinks), else PyPI
            command = [*install, *offline, "-c", str(CONSTRAINTS), spec]
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            if done.returncode == 0:
                break
        assert done.returncode == 0, f"installing {spec} failed:\n{done.stderr}"
        source = "uv's cache" if offline else "PyPI"
        print(f"{time.monotonic() - started:6.1f} s  install rmqs[{extra}] from {source}")
        self.made[extra] = venv
        return venv


@pytest.fixture(scope="session")
def venvs(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venvs:
    root = tmp_path_factory.mktemp("venvs")
    assert REPO not in root.parents
    return Venvs(root, wheel)


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`cmd` in `cwd`; prints how long it took (pytest -s shows where the test's time goes)."""
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    shown = " ".join(Path(c).name if "/" in c else c for c in cmd[:4])
    print(f"{time.monotonic() - started:6.1f} s  {shown}")
    return done


IMPORT_ALL = """
import importlib, importlib.util, json, pkgutil, sys
missing, failed, typed, versions = {}, {}, {}, {}
for top in sys.argv[1:]:
    spec = importlib.util.find_spec(top)
    typed[top] = (__import__("pathlib").Path(spec.origin).parent / "py.typed").is_file()
    try:
        versions[top] = importlib.import_module(top).__version__
    except ModuleNotFoundError as e:
        missing[top] = e.name
        continue
    for info in pkgutil.walk_packages(spec.submodule_search_locations, top + "."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            missing[info.name] = e.name
        except Exception as e:  # noqa: BLE001 - reported, not raised: one line per module
            failed[info.name] = f"{type(e).__name__}: {e}"
import importlib.metadata as md
dist = md.distribution("rmqs")
print(json.dumps({"missing": missing, "failed": failed, "typed": typed, "versions": versions,
                  "dist_version": dist.version,
                  "license_files": [str(f) for f in dist.files if "licenses" in str(f)],
                  "license": dist.metadata.get("License-Expression")}))
"""


@pytest.mark.parametrize("extra", EXTRAS, ids=lambda e: e or "no-extra")
def test_the_wheel_installs_and_every_module_imports(venvs: Venvs, extra: str, tmp_path: Path) -> None:
    venv = venvs(extra)
    env = user_env(tmp_path)
    version = run([str(venv / "bin" / "rmqs"), "--version"], tmp_path, env)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().startswith("rmqs ")

    helped = run([str(venv / "bin" / "rmqs"), "--help"], tmp_path, env)
    assert helped.returncode == 0, helped.stderr
    commands = helped.stdout.split("Commands", 1)[1]
    for needs_checkout in ("demo", "broker"):  # they run the checkout's scripts: not offered here
        assert f" {needs_checkout} " not in commands, helped.stdout
    assert "lag" in commands and "docs/" not in helped.stdout
    demo = run([str(venv / "bin" / "rmqs"), "broker", "status"], tmp_path, env)
    assert demo.returncode == 1 and "needs a checkout" in demo.stderr, demo.stderr
    assert "rmqs: rmqs" not in demo.stderr and "Traceback" not in demo.stderr, demo.stderr

    script = tmp_path / "import_all.py"
    script.write_text(IMPORT_ALL)
    done = run([str(venv / "bin" / "python"), str(script), *PACKAGES], tmp_path, env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    provided = set(OPTIONAL.get(extra, ()))
    allowed = tuple(name for name in ALL_OPTIONAL if name not in provided)
    if "airflow" in provided and extra != "openlineage":
        allowed += ("airflow.providers.openlineage",)
    undeclared = {m: name for m, name in found["missing"].items() if not str(name).startswith(allowed)}
    assert undeclared == {}, f"modules of rmqs[{extra}] import what the extra does not declare: {undeclared}"
    assert found["failed"] == {}
    assert found["typed"] == dict.fromkeys(PACKAGES, True)
    assert set(found["versions"].values()) <= {found["dist_version"]} and found["versions"]
    assert version.stdout.strip() == f"rmqs {found['dist_version']}"
    assert found["license"] == "Apache-2.0" and found["license_files"], found


SPARK_READ = """
import json, sys
from pyspark_rmqs import jobs

spark = jobs.spark_session()  # rmqs's helper: the Python workers run this interpreter
rows = (
    spark.read.format("rabbitmq_streams")
    .options(**json.loads(sys.argv[1]))
    .load()
    .groupBy("stream")
    .count()
    .collect()
)
print("ROWS " + json.dumps({r["stream"]: r["count"] for r in rows}))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.broker
def test_spark_reads_from_the_wheel_outside_the_checkout(
    venvs: Venvs, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """`format("rabbitmq_streams")` resolves in a fresh `rmqs[spark]` venv run as `venv/bin/python x.py`.

    PYSPARK_PYTHON is unset and the venv's bin/ is not on PATH: without rmqs setting the workers'
    Python, they would start the system `python3` and fail with DATA_SOURCE_NOT_FOUND.
    """
    venv = venvs("spark")
    stream = streams.stream()
    publish(broker, stream, [b"m"] * 120)
    (tmp_path / "read.py").write_text(textwrap.dedent(SPARK_READ))
    options = {**broker.spark_options, "stream": stream}
    done = run(
        [str(venv / "bin" / "python"), "read.py", json.dumps(options)],
        tmp_path,
        user_env(tmp_path, SPARK_LOCAL_IP="127.0.0.1"),
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
    assert lines, f"the Spark read failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert json.loads(lines[0][5:]) == {stream: 120}


@pytest.mark.broker
def test_a_users_tests_run_with_rmqs_testing_against_rmqs_test_uri(
    venvs: Venvs, broker: BrokerSettings, tmp_path: Path
) -> None:
    """`pip install rmqs[testing]`, a test file, RMQS_TEST_URI: the plugin loads from its entry point
    (nothing names it), its fixtures reach the broker and clean up. The same file against a container
    with no RMQS_TEST_URI: tests/containers (make test-containers)."""
    venv = venvs("testing")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(USER_PROJECT / "test_streams.py", project)
    env = user_env(tmp_path, RMQS_TEST_URI=broker.uri, RMQS_TEST_WHEN_NO_BROKER="fail")
    done = run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], project, env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]


@pytest.mark.airflow
def test_airflow_lists_the_provider_from_the_wheel(venvs: Venvs, tmp_path: Path) -> None:
    venv = venvs("airflow")
    env = user_env(
        tmp_path,
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path}/airflow.db",
    )
    done = run([str(venv / "bin" / "airflow"), "providers", "list", "-o", "json"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    providers = {p["package_name"]: p for p in json.loads(done.stdout[done.stdout.index("[") :])}
    assert "rmqs" in providers, sorted(providers)
    shutil.rmtree(tmp_path / "airflow", ignore_errors=True)


@pytest.mark.dagster
def test_dagster_imports_from_the_wheel(venvs: Venvs, tmp_path: Path) -> None:
    venv = venvs("dagster")
    code = (
        "import dagster_rmqs, dagster; from dagster_rmqs.examples import definitions; "
        "keys = definitions.defs.resolve_asset_graph().get_all_asset_keys(); "
        "print(dagster_rmqs.__version__, len(list(keys)))"
    )
    done = run([str(venv / "bin" / "python"), "-c", code], tmp_path, user_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    version, assets = done.stdout.split()
    assert version and int(assets) >= 1


def test_make_dist_builds_a_complete_wheel_and_sdist(tmp_path: Path) -> None:
    """What `make dist` checks: scripts/check_dist.py on both files, and `twine check` when installed."""
    if not UV.exists():
        pytest.skip(f"uv not found at {UV} (make setup installs it)")
    out = tmp_path / "dist"
    for offline in (["--offline"], []):
        done = run(
            [str(UV), "build", "-q", *offline, "--out-dir", str(out), str(REPO)], tmp_path, dict(os.environ)
        )
        if done.returncode == 0:
            break
    assert done.returncode == 0, done.stderr
    checked = run(
        [sys.executable, str(REPO / "scripts" / "check_dist.py"), str(out)], tmp_path, dict(os.environ)
    )
    assert checked.returncode == 0, checked.stderr
    twine = Path(sys.executable).parent / "twine"
    if twine.exists():  # the dev extra has it (make setup)
        files = [str(f) for f in sorted(out.glob("rmqs-*"))]
        rendered = run([str(twine), "check", "--strict", *files], tmp_path, dict(os.environ))
        assert rendered.returncode == 0, rendered.stdout + rendered.stderr
