#!/usr/bin/env bash
# The project's whole check: lint, types, then every test (unit, contract, integration, e2e).
# Test services (Kafka-protocol broker, S3 server) are started by pytest fixtures. The tests run on
# ORL_TEST_WORKERS pytest-xdist workers (default 2; each pinned to its share of the cores by
# tests/conftest.py), a test file at a time per worker so a file's module fixtures run once, the
# slow folders' files first (tests/conftest.py; --no-loadscope-reorder keeps that order).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh
.venv/bin/python -m pytest -q -n "${ORL_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
