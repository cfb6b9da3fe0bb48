#!/usr/bin/env bash
# What scripts/gpu-proof.sh needs carried to a bare, offline GPU host (Python 3.12 with
# PyTorch, JAX, nvidia-ml-py, PyYAML, Jinja2, requests, pytest; no gpuenv, no index): gpuenv's
# own wheel and the wheels its doctor, validate --host and monitor verbs import that such a
# host lacks or may hold too old, at the versions requirements-dev.txt locks. Run here, in the
# repository root, with the index reachable; writes .gpu-proof/wheels (.gitignore has it:
# the device tool carries only ignored paths).
#   usage: bash scripts/gpu-proof-wheels.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${1:-3.12}
dest=.gpu-proof/wheels
rm -rf "$dest" && mkdir -p "$dest"
# typer >= 0.29 (coercion through pydantic) and what it needs; the Docker SDK (doctor asks
# for an engine, and says there is none); pytest-testinfra (validate's suites).
names="typer pydantic pydantic-core annotated-types typing-inspection annotated-doc shellingham rich typing-extensions docker pytest-testinfra"
pins=()
for name in $names; do
  pin=$(grep -iE "^${name}==" requirements-dev.txt | head -1 | awk '{print $1}')
  [ -n "$pin" ] || { echo "error: $name is not pinned in requirements-dev.txt" >&2; exit 1; }
  pins+=("$pin")
done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --dest "$dest" \
  --python-version "$pyver" --implementation cp --abi "cp${pyver/./}" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any "${pins[@]}"
.venv/bin/uv build -q --wheel --out-dir "$dest" .
du -sh "$dest"
ls "$dest"
