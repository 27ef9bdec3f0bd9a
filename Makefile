# rmqs — the two commands a newcomer runs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.9
STAMP := $(VENV)/.rmqs-installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1
# No bytecode is compiled at install (all 16,000 modules: ~50 s of CPU, most never imported): each
# module's .pyc is written the first time a process imports it, also where PYTHONDONTWRITEBYTECODE
# is set (tests/conftest.py does the same for a pytest run by hand).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup prepare java warm test test-unit test-containers test-cluster test-spark-cluster test-compat cluster-up cluster-down cluster-status soak lint broker-up broker-down broker-status restartable-broker-up demo bench docs dist lock lock-compat clean

setup: java $(STAMP)

# Reinstall only when the dependency declarations change: seconds when nothing changed.
$(STAMP): pyproject.toml requirements/constraints.txt requirements/overrides.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/uv --version 2>/dev/null | grep -q "$(UV_VERSION)" || $(PY) -m pip install -q "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip install --python $(PY) -q -c requirements/constraints.txt --override requirements/overrides.txt -e '.[airflow,dagster,spark,connect,openlineage,iceberg,s3,testing,dev]'
	@# Spark's Python processes import this venv's compiled pyspark, not pyspark.zip's sources (tests/support/pyspark_zip.py).
	@$(PY) -m tests.support.pyspark_zip >/dev/null
	@touch $@

java:
	@bash scripts/ensure_java.sh

# Everything `make demo`, `make bench` and the other tiers need: Java, the venv and the broker's chroot install at the
# same time (each waits on the network or dpkg most of the time; apt-get calls take turns on a lock).
# The class-data archive of Spark's classes halves the CPU of each JVM the suite starts (tests/support/jvm.py).
prepare:
	@$(MAKE) --no-print-directory -j3 setup broker-up $(JVM_ARCHIVE)

JVM_ARCHIVE := $(VENV)/rmqs-spark-classes.jsa
$(JVM_ARCHIVE): $(STAMP) | java
	@$(PY) -m tests.support.jvm >/dev/null

broker-up:
	@bash scripts/broker.sh up

broker-down:
	@bash scripts/broker.sh down
	@test ! -x $(PY) || $(PY) -m tests.support.broker restartable down

# The suite's second broker (tests/support/broker.py): the tests that stop, restart or pause a broker
# use it, beside the others. A copy of the first broker's installation, its own ports and epmd. The
# suite starts it when its first test needs it (restartable_broker), off the set-up's critical path.
restartable-broker-up: broker-up $(STAMP)
	@$(PY) -m tests.support.broker restartable up

broker-status:
	@bash scripts/broker.sh status

# scripts/test.sh: every test on TEST_WORKERS pytest-xdist workers (the broker-fault tests on the
# second broker, one after the other), then any `serial` test alone; it ends with the slowest 15
# tests, the time per tier and the machine's CPU.
TEST_WORKERS ?= 3
# Java, the venv and the broker at the same time, and `warm` once the venv is there; pytest does not
# wait for the class-data archive (scripts/test.sh waits for it at the end).
test:
	@$(MAKE) --no-print-directory -j3 setup broker-up warm
	PY=$(PY) TEST_WORKERS=$(TEST_WORKERS) bash scripts/test.sh $(PYTEST_ARGS)

# While the broker's chroot is installed (dpkg and the network, a core to spare): start dumping Spark's
# class-data archive, and collect the suite once, which writes the .pyc of everything its processes
# import (Airflow, Dagster, pyspark...) before three xdist workers would each compile it at once.
warm: $(STAMP)
	@($(PY) -m tests.support.jvm >/dev/null 2>&1 &)
	@$(PY) -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true

test-unit: setup
	$(PY) -m pytest -n 2 tests/unit $(PYTEST_ARGS)

# The pytest plugin (pytest_rmqs) against RabbitMQ containers, with no RMQS_TEST_URI: dockerd started
# when installed but not running (and stopped again), the local image rmqs-rabbitmq:4.0 built once
# from the broker's trixie root (scripts/containers.sh), then tests/containers (the plugin's own
# tests, an example DAG and a Dagster asset, a fresh venv with the wheel's rmqs[testing]). Not part
# of `make test`: about 70 s on 2 cores (the first build of the image adds ~6 s; docs/testing.md).
test-containers: setup
	$(PY) -m pytest -p no:cacheprovider tests/containers $(PYTEST_ARGS)

# The cluster tier (tests/cluster, pytest marker `cluster`): a three-node cluster beside the suite's
# broker, in its own home and on its own ports (tests/cluster/support.py: stream 6552-6554, epmd
# 4370), its chroot copied from the suite broker's; topology-aware connections and the faults that
# kill a stream's leader or a replica. Not part of `make test` yet; docs/operations.md says how long it
# takes. The cluster is stopped afterwards unless KEEP_CLUSTER=1 (then `make cluster-down`).
CLUSTER_HOME ?= /var/cache/rmqs-cluster
CLUSTER_ENV := RMQS_TEST_CLUSTER=1 RMQS_TEST_CLUSTER_HOME=$(CLUSTER_HOME)
test-cluster: prepare
	@rc=0; $(CLUSTER_ENV) $(PY) -m pytest -p no:cacheprovider -m cluster tests/cluster $(PYTEST_ARGS) || rc=$$?; \
	if [ "$(KEEP_CLUSTER)" != 1 ]; then $(CLUSTER_ENV) $(PY) -m tests.cluster.support down; fi; exit $$rc

# The standalone Spark tier (tests/spark_cluster, pytest marker `spark_cluster`): a master and two
# one-core workers from the venv's pyspark (tests/spark_cluster/standalone.py: loopback, free ports,
# a work dir each under a temp dir, stopped with the session), executors running this venv's Python
# at the same path (docs/deployment.md). Reads, drains, writes, the Airflow and Dagster Spark paths
# with a spark:// master, a killed executor, a lost worker and speculation, and watermark runs as
# spark-submit jobs (SparkSubmitOperator, Dagster Pipes), every offset counted. Needs the suite's
# broker. Not part of `make test`; 19 tests, about 15 minutes on 2 cores.
test-spark-cluster: prepare
	RMQS_TEST_SPARK_CLUSTER=1 $(PY) -m pytest -p no:cacheprovider -m spark_cluster tests/spark_cluster $(PYTEST_ARGS)

# The compatibility tier (scripts/compat.py says which tests and why): the lowest and the highest
# version of each declared range (PySpark, Airflow, Dagster), a release below each (refused on
# import), and Python 3.13, each in its own venv under .venv-compat/ from its lock in
# requirements/compat/; Java 21 in a Debian 13 root (scripts/check_debian13.sh tests, needs root).
# One after the other, against the suite's broker; a table of version x result at the end. Not part
# of `make test`. COMPAT_ARGS: end names.
test-compat: setup broker-up
	$(PY) scripts/compat.py $(COMPAT_ARGS)

# Re-resolve the compatibility tier's locks (after `make lock`, or a range changed in pyproject.toml).
lock-compat: setup
	$(PY) scripts/compat.py lock

cluster-up cluster-down cluster-status: setup
	$(CLUSTER_ENV) $(PY) -m tests.cluster.support $(@:cluster-%=%)

# The soak (tests/e2e/soak; not in `make test`, CI runs it after): RMQS_SOAK_SECONDS, RMQS_SOAK_RATE.
SOAK_SECONDS ?= 600
soak: prepare
	RMQS_SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m pytest -s -p no:cacheprovider --timeout $$(( $(SOAK_SECONDS) + 900 )) tests/e2e/soak $(PYTEST_ARGS)

# The protocol campaign (tests/campaign/README.md): generated sequences of runs, faults, stream
# re-creations and partition bindings against the broker, a random seed for CAMPAIGN_SECONDS; prints
# the seeds, steps, rules covered and any violation's shrunk sequence. `make test` runs a fixed-seed
# budget of it. CAMPAIGN_AVOID / CAMPAIGN_DISABLE step around known bugs / switch operations off.
CAMPAIGN_SECONDS ?= 600
.PHONY: campaign
campaign: setup broker-up
	CAMPAIGN_SECONDS=$(CAMPAIGN_SECONDS) $(PY) -m tests.campaign $(CAMPAIGN_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# The demo's local Spark sessions map the class-data archive `make prepare` dumped (rmqs spark-archive).
demo: prepare
	RMQS_SPARK_CLASS_ARCHIVE=$(abspath $(JVM_ARCHIVE)) $(PY) -m pyspark_rmqs.cli.demo

docs: setup
	$(VENV)/bin/mkdocs build --strict

bench: prepare
	$(PY) -m bench.reader
	$(PY) -m bench.writer
	$(PY) -m bench.consume
	$(PY) -m bench.spark_read --memory
	$(PY) -m bench.read_cpu
	RMQS_SPARK_CLASS_ARCHIVE=$(abspath $(JVM_ARCHIVE)) $(PY) -m bench.airflow_read
	RMQS_SPARK_CLASS_ARCHIVE=$(abspath $(JVM_ARCHIVE)) $(PY) -m bench.airflow_read --messages 1000000 --rounds 2
	$(PY) -m bench.airflow_read --no-archive --rounds 1
	$(PY) -m bench.warm_spark --warmup 12 --kinds connect,consume,spark-floor,dagster-connect,dagster-arrow
	$(PY) -m bench.warm_spark --messages 1000000 --warmup 6 --kinds connect,consume,spark-floor
	$(PY) -m bench.warm_spark --warmup 12 --rounds 1 --breakdown --kinds connect,spark-floor,dagster-connect
	$(PY) -m bench.spark_write
	$(PY) -m bench.exactly_once
	$(PY) -m bench.history
	$(PY) -m bench.runs_stream
	$(PY) -m bench.available_now
	$(PY) -m bench.available_now --messages 5000000
	$(PY) -m bench.orchestration --partitions 50
	$(PY) -m bench.orchestration --partitions 500 --checks 10
	$(PY) -m bench.orchestration --watchers 100 --partitions 50 --polls 20
	$(PY) -m bench.triggerer --watchers 100 --partitions 50 --seconds 150
	$(PY) -m bench.triggerer --watchers 100 --partitions 50 --seconds 150 --no-baseline --freeze
	@# On the cluster tier's three nodes (started, then stopped): replica vs leader reads, non-leader vs leader writes.
	$(CLUSTER_ENV) $(PY) -m bench.cluster; rc=$$?; $(CLUSTER_ENV) $(PY) -m tests.cluster.support down; exit $$rc

# The wheel and the sdist in dist/, checked: twine (metadata, the long description renders on the
# package index) and the wheel's contents (the three packages with py.typed, the license).
# Installing the wheel into fresh venvs is tests/e2e/test_wheel_install.py.
dist: setup
	rm -rf dist
	$(VENV)/bin/uv build --out-dir dist .
	$(VENV)/bin/twine check --strict dist/*
	$(PY) scripts/check_dist.py dist

# Re-resolve the locked versions after changing dependencies in pyproject.toml. The dagster-ui
# extra (dagster-webserver) is not locked: its gql pin conflicts with dagster-dg-cli's (dev).
# requirements/overrides.txt drops what must never be installed (it says why), in the lock and in setup.
lock:
	$(VENV)/bin/uv pip compile pyproject.toml --extra airflow --extra dagster --extra spark --extra connect --extra openlineage --extra iceberg --extra pkcs12 --extra s3 --extra testing --extra dev \
		--override requirements/overrides.txt --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o requirements/constraints.txt

clean:
	rm -rf $(VENV) .venv-compat .pytest_cache .mypy_cache .ruff_cache

# The Debian 13 path of scripts/broker.sh (host mode), in a throwaway Debian trixie root built with
# debootstrap (cached in /var/cache/rmqs-check-debian13); needs root. Not part of `make test`.
.PHONY: check-debian13
check-debian13:
	@bash scripts/check_debian13.sh
