#!/usr/bin/env bash
# The GPU proof (benchmarks/gpu_proof.py): doctor, validate --host local:// --gpus all,
# monitor during GPU work and seed 000's PyTorch table, on this machine, offline, as one
# report plus raw outputs under OUT_DIR. Without a GPU every GPU step is skipped with the
# reason and it exits 0. How the lead runs it on a lent GPU host: scripts/gpu-proof.README.
#
#   usage: bash scripts/gpu-proof.sh [OUT_DIR [--budget SECONDS]]
#          (OUT_DIR default: $OUT, else ./gpu-proof; budget default 480 s, the whole proof)
#
# Which gpuenv runs it:
# - wheels in .gpu-proof/wheels (scripts/gpu-proof-wheels.sh; or $GPUENV_PROOF_WHEELS): a new
#   virtualenv, with the host Python's own packages (PyTorch, JAX, nvidia-ml-py) visible,
#   gets them installed offline (--no-index --no-deps);
# - else the Python that already has gpuenv ($GPUENV_PROOF_PYTHON, say a checkout's
#   .venv/bin/python): as it is (this is how the tests and CI run it).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-$PWD/gpu-proof}}
wheels=${GPUENV_PROOF_WHEELS:-$repo/.gpu-proof/wheels}
py=${GPUENV_PROOF_PYTHON:-python3}
[[ $py == */* ]] && py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # absolute: cd / below
scratch=""
if compgen -G "$wheels/gpuenv-*.whl" >/dev/null; then
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpuenv-proof.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  venv=$scratch/venv
  "$py" -m venv --system-site-packages "$venv"
  # The host's python3 may itself be a virtualenv (/opt/torch/.venv on the lent hosts), whose
  # packages --system-site-packages does not reach: add its site directories after the new
  # venv's own, so the carried wheels win and PyTorch, JAX and NVML stay importable.
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$py" -c 'import site; print("\n".join("import site; site.addsitedir(%r)" % d for d in site.getsitepackages()))' > "$site/zz-gpuenv-proof-host.pth"
  "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile \
    --disable-pip-version-check "$wheels"/*.whl
  py=$venv/bin/python
elif ! (cd / && "$py" -c 'import gpuenv') 2>/dev/null; then  # not the checkout's gpuenv/ by the cwd
  echo "error: no gpuenv wheels in $wheels and $py has no gpuenv: run scripts/gpu-proof-wheels.sh here and carry .gpu-proof, or set GPUENV_PROOF_PYTHON to a Python with gpuenv" >&2
  exit 2
fi
bin=$(dirname "$py")
export PATH="$bin:$PATH"  # validate's checks run `python`: this one, with the host's frameworks
gpuenv=("$py" -m gpuenv)
[ -x "$bin/gpuenv" ] && gpuenv=("$bin/gpuenv")
"$py" "$repo/benchmarks/gpu_proof.py" --out "$out" --python "$py" --gpuenv "${gpuenv[*]}" "${@:2}"
