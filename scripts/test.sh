#!/usr/bin/env bash
# test.sh - the test suite: lint, unit tests (no engine), integration tests (real engine).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
.venv/bin/ruff check gpuenv tests benchmarks
.venv/bin/ruff format --check gpuenv tests benchmarks
.venv/bin/pytest tests "$@"
