#!/usr/bin/env bash
# quickstart.sh - the main job: set up, build the default CPU and GPU cells of matrix.yaml,
# and train the sample model (examples/train.py) in the default image.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
.venv/bin/gpuenv matrix
default_cpu=$(.venv/bin/gpuenv matrix --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["defaults"]["cpu"])')
default_gpu=$(.venv/bin/gpuenv matrix --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["defaults"]["gpu"])')
.venv/bin/gpuenv build "$default_cpu" "$default_gpu"
.venv/bin/gpuenv run examples/train.py
