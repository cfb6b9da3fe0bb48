#!/usr/bin/env bash
# quickstart.sh - the main job: set up, build the default CPU and GPU cells of matrix.yaml,
# and train the sample model (examples/train.py) in the default image.
#
# Root is for the setup (Debian packages, the engine) and the engine's socket. The workload
# is not run as root: gpuenv runs a container as its caller's uid, with the working directory
# mounted read-write, so the run is made as the user sudo was called by, else the
# checkout's owner, else nobody, with the engine socket's group for that one process
# (setpriv) and no account changed.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
.venv/bin/gpuenv matrix
default_cpu=$(.venv/bin/gpuenv matrix --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["defaults"]["cpu"])')
default_gpu=$(.venv/bin/gpuenv matrix --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["defaults"]["gpu"])')
.venv/bin/gpuenv build "$default_cpu" "$default_gpu"

as_workload_user=()
if [[ ${EUID} -eq 0 ]]; then
    uid=${SUDO_UID:-$(stat -c %u .)} gid=${SUDO_GID:-$(stat -c %g .)}
    if [[ ${uid} -eq 0 ]]; then
        uid=$(id -u nobody) gid=$(id -g nobody)
    fi
    socket=${DOCKER_HOST:-unix:///var/run/docker.sock}
    socket_group=$(stat -c %g "${socket#unix://}")
    as_workload_user=(setpriv --reuid="${uid}" --regid="${gid}" --groups="${socket_group}"
        --inh-caps=-all --)
    if ! "${as_workload_user[@]}" .venv/bin/python -c '' 2>/dev/null; then
        echo "quickstart.sh: error: uid ${uid} cannot run .venv/bin/python (it links to" \
            "$(readlink -f .venv/bin/python)); run this script with sudo from your own account" >&2
        exit 1
    fi
fi
"${as_workload_user[@]}" .venv/bin/gpuenv run examples/train.py
