#!/usr/bin/env bash
# The project's whole check: lint, types, then every test (unit, contract, integration, e2e).
# Test services (Kafka-protocol broker, S3 server) are started by pytest fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy schemas connectors serving pipeline trainer orl
.venv/bin/python -m pytest -q "$@"
