# make demo  — set up .venv and run the demo on the embedded defaults
# make test  — set up .venv and run the whole test suite
# make ui    — the Dagster UI on 127.0.0.1 with the daemon, on the demo lake, with a
#              local Spark Connect server (all stopped together on Ctrl-C)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_LAKE ?= demo-lake
UI_PORT ?= 3000
# yente (the OpenSanctions API) in its own venv: its dependencies clash with ours;
# the delta-feed test runs yente's updater there (skips, saying why, without it)
YENTE_VENV ?= .venv-yente
YENTE_VERSION ?= 5.5.0
YENTE_STAMP := $(YENTE_VENV)/.installed
# the Delta Sharing connector (a recipient's client) in its own venv: delta-sharing 1.4
# caps pyarrow at 23 (we pin 26); the sharing tests drive it there (skip without it)
SHARING_VENV ?= .venv-sharing
SHARING_STAMP := $(SHARING_VENV)/.installed
# on the cluster (setup.cfg's markers): make test runs the cluster's own tests and,
# of the data-plane group, those of each module's Spark path (on_cluster); make
# test-cluster the whole group but the tests that start no Spark and those of the
# driver itself. In process (local[*]) the driver's tests and the flush's
# (local_mode): the cluster's driver is an in-process session too (pyspark's
# classic API, as local[*]), its executors elsewhere
INPROCESS_TESTS := spark_modes and not spark_free and (local_mode or driver)
CLUSTER_TESTS := cluster or (on_cluster and not driver)
CLUSTER_ALL_TESTS := (spark_modes and not spark_free and not driver) or cluster
# the persistent Dagster instance (runs, sensors' cursors, partitions)
export DAGSTER_HOME := $(CURDIR)/dagster_home

.PHONY: install demo ui test test-cluster test-thorough lint typecheck bench clean java yente sharing-client

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: install Python 3.11+"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	@echo "installing dependencies (first run builds the pyspark wheel: a few minutes)"
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(YENTE_STAMP):
	$(PYTHON) -m venv $(YENTE_VENV)
	$(YENTE_VENV)/bin/python -m pip install --quiet yente==$(YENTE_VERSION)
	touch $(YENTE_STAMP)

# not fatal: without yente the test that needs it skips with the reason
yente:
	@$(MAKE) --no-print-directory $(YENTE_STAMP) || echo "warning: yente could not be installed in $(YENTE_VENV): its delta-feed test will skip"

$(SHARING_STAMP): requirements-sharing.lock
	$(PYTHON) -m venv $(SHARING_VENV)
	$(SHARING_VENV)/bin/python -m pip install --quiet -r requirements-sharing.lock
	touch $(SHARING_STAMP)

# not fatal: without the connector the Delta Sharing tests skip with the reason
sharing-client:
	@$(MAKE) --no-print-directory $(SHARING_STAMP) || echo "warning: delta-sharing could not be installed in $(SHARING_VENV): its tests will skip"

# Java 17 present, then the JVM's class archive of Spark (once per install: about
# a minute; every later Spark start about 3 s faster; optional, so not fatal)
java: install
	@$(PY) -m lakehouse_assets.spark.java
	@$(VENV)/bin/lakehouse spark prepare || echo "warning: no class archive (Spark starts without it, about 3 s slower)"

demo: install java
	@LAKE=$(DEMO_LAKE) VENV=$(VENV) sh lakehouse_assets/sample/demo.sh

ui: install java
	@LAKE=$(DEMO_LAKE) VENV=$(VENV) UI_PORT=$(UI_PORT) sh lakehouse_assets/sample/ui.sh

# the suite with Spark Connect (a server per test worker), then with an
# in-process local[*] Spark (one process cannot mix the two) the flush's
# data-plane tests and those of the driver's own decisions, then on a local
# standalone cluster (a master and 2 workers the test workers share, the
# executors without this package; local lakes on SQLite journals, S3 lakes on
# PostgreSQL ones) the cluster tests and, of the data-plane group (flush,
# exports, compact, optimize, mappings, checks, snapshots: spark_modes), the
# tests of each module's Spark path (on_cluster; make test-cluster: all of it)
test: install java yente sharing-client
	VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH dg check defs
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)
	LAKEHOUSE_TEST_SPARK=inprocess $(PY) -m pytest -n 2 --dist loadfile -m "$(INPROCESS_TESTS)" $(PYTEST_ARGS)
	LAKEHOUSE_TEST_SPARK=cluster $(PY) -m pytest -n 2 --dist loadfile -m "$(CLUSTER_TESTS)" $(PYTEST_ARGS)

# the whole data-plane group and the cluster tests on the local standalone
# cluster (make test runs the cluster tests and the on_cluster part of the group)
test-cluster: install java
	LAKEHOUSE_TEST_SPARK=cluster $(PY) -m pytest -n 2 --dist loadfile -m "$(CLUSTER_ALL_TESTS)" $(PYTEST_ARGS)

# the property suite with every property at >= 100 examples locally, 20 on S3,
# the crash tests at every flush fault point, the HTTP API's fuzz run at 100
# examples an operation, and the JVM's class archive built anew (make test checks
# the one make java built) (long)
test-thorough: install java
	LAKEHOUSE_TEST_PROFILE=thorough $(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS) \
		lakehouse_assets_tests/test_properties_commits.py lakehouse_assets_tests/test_properties_dataset.py \
		lakehouse_assets_tests/test_properties_incremental.py lakehouse_assets_tests/test_properties_versions.py \
		lakehouse_assets_tests/test_crash.py lakehouse_assets_tests/test_server_fuzz.py \
		lakehouse_assets_tests/test_spark_class_archive.py

# ruff, then the import contract (the layers in setup.cfg's [importlinter])
lint: install
	$(VENV)/bin/ruff check lakehouse_assets lakehouse_assets_tests benchmarks
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

bench: install
	$(PY) -m benchmarks.journal_write --statements 1000000
	$(PY) -m benchmarks.dataplane --statements 1000000
	$(PY) -m benchmarks.mapping --rows 1000000

clean:
	rm -rf $(DEMO_LAKE) $(YENTE_VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
