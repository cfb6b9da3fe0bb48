#!/usr/bin/env bash
# setup.sh - everything gpuenv needs on a fresh Debian machine: a running Docker Engine
# (scripts/engine.sh) and a virtualenv in .venv with gpuenv and its test tools, from the
# lock (requirements-dev.txt).
# Idempotent; safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/engine.sh
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
# The development environment is locked: requirements-dev.txt pins every package with its
# hashes, for each platform and Python gpuenv supports (regenerate it with the command in its
# header after changing pyproject.toml's dependencies; tests/unit/test_dev_lock.py checks the
# two agree). gpuenv itself goes on top, editable, with no dependencies of its own choosing.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes \
    -r requirements-dev.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
