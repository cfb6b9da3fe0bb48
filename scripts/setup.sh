#!/usr/bin/env bash
# setup.sh - everything gpuenv needs on a fresh Debian machine: a running Docker Engine
# (scripts/engine.sh) and a virtualenv in .venv with gpuenv and its test tools.
# Idempotent; safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/engine.sh
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
