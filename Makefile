# idemp developer entry points. A fresh machine needs only python3 (with venv), make and
# Java 17 (for PySpark); everything else is installed into .venv from PyPI.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := rocketmq,postgres,spark,test
JDBC_DIR   := .cache/jdbc
JDBC_STAMP := $(JDBC_DIR)/.stamp
JDBC_DEBS  := libpostgresql-jdbc-java libxerial-sqlite-jdbc-java libxerial-sqlite-jdbc-jni

# The one pytest invocation; add options with `make test PYTEST_ARGS='-k redis -x'`
# or replace it wholesale with `make test PYTEST='...'`.
PYTEST_ARGS ?=
PYTEST      ?= $(BIN)/pytest -q $(PYTEST_ARGS)
RUFF_PATHS  := idemp adapters tests conftest.py docs/build_api.py benchmarks fuzz examples chaos interop docker/check_compose.py setup.py

.PHONY: help venv v5-venv test lint api check-java demo bench clean fuzz chaos soak interop

help:
	@echo "make demo    run the main job on embedded defaults"
	@echo "make test    lint (ruff, mypy, hadolint) + the whole pytest suite"
	@echo "make lint    ruff (lint and format check), mypy and hadolint only"
	@echo "make api     the API reference page from the docstrings (.cache/api/idemp.html)"
	@echo "make bench   run the benchmarks"
	@echo "make fuzz    coverage-guided fuzzing (atheris) of the codec and the broker dispatch"
	@echo "make chaos   the full chaos run (faults while consuming; CHAOS_ARGS='--seed 8')"
	@echo "make interop the Java client and mqadmin of REALRMQ_HOME (RocketMQ 4.9.7) against idemp's broker,"
	@echo "            and the 5.x Java client of ROCKETMQ5_JAVA_CLIENT (interop/java5/build-client.sh) at its gRPC port"
	@echo "make soak    30 minutes steady: RSS, fds and p99 latency must stay flat"
	@echo "make venv    (re)build .venv if pyproject.toml/setup.py changed"
	@echo "make v5-venv the official RocketMQ 5 client's own venv (.cache/v5-venv) for tests/v5"
	@echo "make clean   remove .venv and every cache"

# The venv is rebuilt (incrementally) whenever the packaging files change.
# uv does the heavy install: it is several times faster than pip here, and its cache
# (~/.cache/uv) keeps the wheel it built from the pyspark sdist for later runs; it builds
# one again (0.5-1.4 GB each) whenever its cached revision of the sdist changes, so a
# long-lived machine's cache grows: `.venv/bin/uv cache prune` drops the stale builds.
# Bytecode is compiled at install (uv does not by default), idemp's own too: where
# PYTHONDONTWRITEBYTECODE is set (these machines) nothing else writes it, and every
# Python process (brokers, workers, children of the tests and the demo) compiled
# SQLAlchemy, redis, grpc… again: ~1 s of CPU per start (docs/performance.md).
COMPILE := --compile-bytecode
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install $(COMPILE) --python $(BIN)/python -e '.[$(EXTRAS)]'
	$(BIN)/python -m compileall -q idemp adapters
	touch $@

venv: $(STAMP)

# One page: idemp's public surface (idemp.__all__), by pdoc; make test builds it too
# (tests/structure/test_api_page.py) and fails on any warning.
api: $(STAMP)
	$(BIN)/python docs/build_api.py .cache/api

# PySpark 4 needs Java 17 or newer on PATH (the machine image ships OpenJDK 17).
check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: java not found on PATH; PySpark needs Java 17+" \
	       "(Debian: apt-get install -y openjdk-17-jre-headless)" >&2; exit 1; }
	@v="$$(java -version 2>&1 | awk -F'"' '/version/ {print $$2; exit}')"; \
	 major="$${v%%.*}"; \
	 if [[ ! "$$major" =~ ^[0-9]+$$ ]] || (( major < 17 )); then \
	   echo "error: java '$$v' found, PySpark needs Java 17+" >&2; exit 1; fi

# `docker-compose config` validates the compose files offline (no Docker engine here);
# docker-compose 1.29 lives in its own venv so its old pins never touch .venv.
COMPOSE_VENV  := .cache/compose-venv
COMPOSE_STAMP := $(COMPOSE_VENV)/.installed
COMPOSE_FILES := docker/compose.rocketmq.yml docker/compose.idemp.yml
$(COMPOSE_STAMP): docker/compose-tool-constraints.txt
	rm -rf $(COMPOSE_VENV)
	$(PYTHON) -m venv $(COMPOSE_VENV)
	PIP_CONSTRAINT=$(CURDIR)/docker/compose-tool-constraints.txt \
	  $(COMPOSE_VENV)/bin/python -m pip install -q --disable-pip-version-check docker-compose
	touch $@

lint: $(STAMP) $(COMPOSE_STAMP)
	$(BIN)/ruff check $(RUFF_PATHS)
	$(BIN)/ruff format --check $(RUFF_PATHS)
	$(BIN)/mypy $(RUFF_PATHS)
	$(BIN)/hadolint --no-color docker/Dockerfile
	for f in $(COMPOSE_FILES); do $(COMPOSE_VENV)/bin/docker-compose -f $$f config -q; done
	$(BIN)/python docker/check_compose.py $(COMPOSE_FILES)

# RocketMQ 5's official Python client, in a venv of its own (tests/v5 drive it in child
# processes): it and the 4.x wheel both install a top-level module `rocketmq`.
V5_VENV  := .cache/v5-venv
V5_STAMP := $(V5_VENV)/.installed
# idemp itself goes in too (editable, the `rocketmq5` extra: the adapter's tests).
$(V5_STAMP): pyproject.toml setup.py $(STAMP)
	rm -rf $(V5_VENV)
	$(PYTHON) -m venv $(V5_VENV)
	$(BIN)/uv pip install $(COMPILE) --python $(V5_VENV)/bin/python -e '.[rocketmq5,postgres]'
	touch $@

v5-venv: $(V5_STAMP)

test: $(STAMP) check-java lint $(JDBC_STAMP) $(V5_STAMP)
	$(PYTEST)

# JDBC drivers for `idemp reconcile --records jdbc:…` and its test: Debian's PostgreSQL
# and SQLite jars (+ the SQLite driver's JNI library), unpacked here, not installed
# (no Maven Central on these machines). Fails loudly when apt cannot fetch them.
$(JDBC_STAMP):
	rm -rf $(JDBC_DIR) $(JDBC_DIR).tmp && mkdir -p $(JDBC_DIR).tmp/deb
	cd $(JDBC_DIR).tmp/deb && { apt-get download $(JDBC_DEBS) || \
	  { apt-get update -qq && apt-get download $(JDBC_DEBS); }; } || { \
	  echo "error: apt-get download $(JDBC_DEBS) failed (package lists: apt-get update)" >&2; \
	  exit 1; }
	for deb in $(JDBC_DIR).tmp/deb/*.deb; do dpkg-deb -x "$$deb" $(JDBC_DIR).tmp/root; done
	mkdir -p $(JDBC_DIR)
	cp -L $(JDBC_DIR).tmp/root/usr/share/java/postgresql.jar \
	  $(JDBC_DIR).tmp/root/usr/share/java/xerial-sqlite-jdbc.jar \
	  "$$(find $(JDBC_DIR).tmp/root -name libsqlitejdbc.so | head -n 1)" $(JDBC_DIR)/
	rm -rf $(JDBC_DIR).tmp
	touch $@

demo: $(STAMP)
	$(BIN)/python -m idemp demo

# grpc5 compares with RocketMQ 5.3.3 when REALRMQ5_ENDPOINTS=<proxy grpc>,<broker> is set
bench: $(STAMP) $(V5_STAMP)
	$(BIN)/python -m benchmarks

# FUZZ_SECONDS per target (4 targets: 20 minutes by default). The corpus grows in
# .cache/fuzz (seeded from fuzz/corpus); a crash is written to .cache/fuzz/crash-*
# and fails the run: add it to fuzz/regressions/<target>/ with the fix.
FUZZ_SECONDS ?= 300
fuzz: $(STAMP)
	$(BIN)/python -m fuzz.make_corpus
	for t in codec dispatch grpc5 http2; do \
	  mkdir -p .cache/fuzz/$$t; cp fuzz/corpus/$$t/* .cache/fuzz/$$t/; \
	  $(BIN)/python -m fuzz.run --replay $$t fuzz/regressions/$$t; \
	  $(BIN)/python -m fuzz.run $$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	    -artifact_prefix=.cache/fuzz/ -print_final_stats=1 .cache/fuzz/$$t; \
	done

# The full chaos run (docs/reliability.md): 100,000 messages, 12 consumer SIGKILLs, 3 broker
# SIGKILLs, Redis and PostgreSQL restarts. A failing seed replays with CHAOS_ARGS='--seed N'.
CHAOS_ARGS ?=
chaos: $(STAMP) $(V5_STAMP)
	$(BIN)/python -m chaos $(CHAOS_ARGS)

# 30 minutes of steady produce/consume with the decorators on (SOAK_ARGS='--minutes 60').
soak: $(STAMP)
	$(BIN)/python -m chaos.soak --out soak-windows.jsonl $(SOAK_ARGS)

# RocketMQ 4.9.7's Java client against idemp's broker (needs REALRMQ_HOME; not in make test).
interop: $(STAMP)
	interop/run.sh

clean:
	rm -rf $(VENV) .cache build dist *.egg-info .eggs .pytest_cache .mypy_cache \
	  .ruff_cache .hypothesis spark-warehouse metastore_db derby.log
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
