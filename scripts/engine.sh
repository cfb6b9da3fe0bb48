#!/usr/bin/env bash
# engine.sh - make sure a Docker engine answers on this (Debian) machine.
#
# What it does, in order, and only when needed:
#   1. installs the Debian packages gpuenv itself relies on: docker.io for dockerd,
#      debootstrap and mmdebstrap for local base images; with --labs (scripts/test.sh
#      only) also those of the test labs, each of which the tests start and stop
#      themselves: docker-registry for the push tests' loopback registry; iproute2,
#      e2fsprogs and openssl for the fault and remote-engine tests (a namespace and veth,
#      a loop-mounted data root, throwaway TLS certificates); rootlesskit, slirp4netns,
#      uidmap, podman and catatonit for the engine labs of
#      tests/integration/test_engine_anywhere.py (a rootless dockerd and podman's API
#      service); slurmctld, slurmd, slurm-client, munge, charliecloud-runtime and
#      squashfs-tools-ng for the Slurm cluster of tests/integration/test_engine_slurm.py;
#      qemu-user-static, binfmt-support and arch-test for the arm64 tests; openssh-server
#      for tests/integration/support/another_host.py (an sshd in the lab's namespaces);
#      chromium for the browser of tests/integration/test_engine_notebook.py; libfaketime
#      for tests/integration/test_engine_golden.py (a base whose build steps see another
#      date; it is copied into a test image, never preloaded on this machine).
#      No package's own service starts (a policy-rc.d answering 101 while installing), and
#      --labs disables the lab packages' services for boot (Debian enables them on
#      install): a machine that ran the tests starts no registry on :5000, munge, slurmd
#      or podman socket when it reboots. `apt-get update` runs only when something is
#      missing;
#   2. if `docker info` does not answer, starts
#        dockerd --bridge=none --iptables=false --ip-masq=false
#      in the background with nohup, logging to $GPUENV_DOCKERD_LOG and
#      recording its PID in $GPUENV_DOCKERD_PIDFILE; where the machine has no
#      /etc/docker/daemon.json, with a config file of ours that turns on the
#      builder's garbage collection (BuildKit keeps every build's layers and
#      contexts in its cache, images removed or not; a test run builds tens of
#      GB of them), keeping $GPUENV_BUILD_CACHE (20GB);
#   3. waits up to $GPUENV_DOCKERD_TIMEOUT seconds for `docker info` to answer,
#      and fails with a one-line message plus the tail of the log otherwise.
#
# Usage: engine.sh [--labs]. It is idempotent: when everything is installed
# and the engine answers it does nothing and exits 0 at once.
#
# The engine gets no bridge network on purpose: on these machines containers
# run with `--network none` (or `host` when they must reach a package index),
# and no Docker network may be created.
#
# Environment (all optional):
#   GPUENV_DOCKERD_LOG      dockerd's log file  (/var/log/gpuenv-dockerd.log)
#   GPUENV_DOCKERD_PIDFILE  dockerd's pid file  (/run/gpuenv-dockerd.pid)
#   GPUENV_DOCKERD_TIMEOUT  seconds to wait for the engine (60)
#   GPUENV_BUILD_CACHE      the build cache the builder keeps (20GB)
#   GPUENV_SKIP_APT=1       never touch apt (just start/check the engine)
#   GPUENV_SYSTEMD_ROOT     with --labs: the root whose units are disabled (/; for a test)
set -euo pipefail

readonly LOG="${GPUENV_DOCKERD_LOG:-/var/log/gpuenv-dockerd.log}"
readonly PIDFILE="${GPUENV_DOCKERD_PIDFILE:-/run/gpuenv-dockerd.pid}"
readonly TIMEOUT="${GPUENV_DOCKERD_TIMEOUT:-60}"
readonly BUILD_CACHE="${GPUENV_BUILD_CACHE:-20GB}"
readonly CONFIG=/etc/gpuenv/dockerd.json
# Debian packages we need; each is checked on its own.
readonly PACKAGES=(docker.io debootstrap mmdebstrap)
readonly LAB_PACKAGES=(docker-registry iproute2 e2fsprogs openssl
    rootlesskit slirp4netns uidmap podman catatonit
    slurmctld slurmd slurm-client munge charliecloud-runtime squashfs-tools-ng
    qemu-user-static binfmt-support arch-test openssh-server chromium libfaketime)
# The lab packages' own services, never wanted at boot (the tests run private instances).
readonly LAB_UNITS=(docker-registry.service munge.service slurmctld.service slurmd.service
    podman.socket podman.service podman-restart.service podman-auto-update.service
    podman-auto-update.timer)
# openssh-server's are disabled only when --labs installed it (a machine's own sshd stays):
# it is then recorded here, so that every later --labs disables them again.
readonly LAB_STATE=/var/lib/gpuenv/lab-units
readonly SSH_UNITS=(ssh.service ssh.socket)

say() { printf 'engine.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Run a command as root, through sudo when we are not root.
as_root() {
    if [[ ${EUID} -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "must run as root (or have sudo) to run: $*"
    fi
}

# True when the engine answers (quietly, with a bound on how long we wait).
engine_answers() {
    command -v docker >/dev/null 2>&1 || return 1
    timeout 10 docker info >/dev/null 2>&1
}

# True when the Debian package "$1" is installed.
is_installed() {
    dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null | grep -qx installed
}

# Step 1: install whatever is missing of "$@"; `apt-get update` only if something is.
install_packages() {
    [[ ${GPUENV_SKIP_APT:-0} == 1 ]] && return 0
    command -v dpkg-query >/dev/null 2>&1 || die "not a Debian system (no dpkg-query)"
    local missing=() pkg
    for pkg in "$@"; do
        is_installed "${pkg}" || missing+=("${pkg}")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    say "installing: ${missing[*]}"
    # No package's own service may start (munge, slurmd, the registry...): the tests start
    # what they need themselves, privately. A policy-rc.d answering 101 tells invoke-rc.d
    # so; one the machine already has is left as it is.
    local policy=/usr/sbin/policy-rc.d ours=0
    if [[ ! -e ${policy} ]]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee "${policy}" >/dev/null
        as_root chmod 0755 "${policy}"
        ours=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [[ ${ours} == 1 ]] && as_root rm -f "${policy}"
    return 0
}

# Step 2: start dockerd in the background unless one we started still runs.
start_dockerd() {
    local pid
    if [[ -s ${PIDFILE} ]]; then
        pid="$(<"${PIDFILE}")"
        if [[ ${pid} =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null; then
            say "dockerd (pid ${pid}) is running but not answering yet; waiting"
            return 0
        fi
    fi
    # Debian puts dockerd in /usr/sbin, which may be missing from PATH.
    local dockerd
    dockerd="$(PATH="${PATH}:/usr/sbin:/sbin" command -v dockerd)" \
        || die "dockerd not found (is docker.io installed?)"
    as_root mkdir -p "$(dirname "${LOG}")" "$(dirname "${PIDFILE}")"
    local config=()
    if [[ ! -e /etc/docker/daemon.json ]]; then
        as_root mkdir -p "$(dirname "${CONFIG}")"
        printf '{"builder": {"gc": {"enabled": true, "defaultKeepStorage": "%s"}}}\n' \
            "${BUILD_CACHE}" | as_root tee "${CONFIG}" >/dev/null
        config=(--config-file "${CONFIG}")
    fi
    say "starting ${dockerd} (log: ${LOG})"
    # setsid: dockerd must outlive the shell (and process group) that started it.
    # The subshell runs as root so that the log redirection and the pid file
    # are written with root's rights; $! is the pid of dockerd itself.
    # shellcheck disable=SC2016  # expanded by the inner shell, on purpose
    as_root bash -c '
        setsid nohup "$1" --bridge=none --iptables=false --ip-masq=false "${@:4}" \
            >>"$2" 2>&1 </dev/null &
        echo "$!" >"$3"
    ' _ "${dockerd}" "${LOG}" "${PIDFILE}" "${config[@]}"
}

# Step 3: wait until the engine answers, or fail with the log's tail.
wait_for_engine() {
    local deadline=$((SECONDS + TIMEOUT)) pid
    until engine_answers; do
        pid="$(cat "${PIDFILE}" 2>/dev/null || true)"
        if [[ -n ${pid} ]] && ! kill -0 "${pid}" 2>/dev/null; then
            say "error: dockerd (pid ${pid}) exited; last lines of ${LOG}:"
            tail -n 20 "${LOG}" >&2 || true
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            say "error: docker engine did not answer within ${TIMEOUT}s; last lines of ${LOG}:"
            tail -n 20 "${LOG}" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
}

# The lab packages' services, disabled for boot (and stopped where systemd runs them).
quiet_lab_units() {
    command -v systemctl >/dev/null 2>&1 || return 0
    local unit units=("${LAB_UNITS[@]}") recorded=()
    if [[ -r ${LAB_STATE} ]]; then
        mapfile -t recorded <"${LAB_STATE}"
        units+=("${recorded[@]}")
    fi
    for unit in "${units[@]}"; do
        systemctl ${GPUENV_SYSTEMD_ROOT:+--root="${GPUENV_SYSTEMD_ROOT}"} --quiet is-enabled \
            "${unit}" 2>/dev/null || continue
        say "disabling ${unit} for boot (a test lab's package; the tests run their own)"
        as_root systemctl ${GPUENV_SYSTEMD_ROOT:+--root="${GPUENV_SYSTEMD_ROOT}"} --quiet \
            disable "${unit}"
    done
    if [[ -z ${GPUENV_SYSTEMD_ROOT:-} && -d /run/systemd/system ]]; then
        as_root systemctl --quiet stop "${units[@]}" 2>/dev/null || true
    fi
}

main() {
    install_packages "${PACKAGES[@]}"
    if [[ ${1:-} == --labs ]]; then
        local had_sshd=1
        is_installed openssh-server || had_sshd=0
        install_packages "${LAB_PACKAGES[@]}"
        if [[ ${had_sshd} == 0 ]] && is_installed openssh-server; then
            as_root mkdir -p "$(dirname "${LAB_STATE}")"
            printf '%s\n' "${SSH_UNITS[@]}" | as_root tee -a "${LAB_STATE}" >/dev/null
        fi
        quiet_lab_units
    fi
    engine_answers && return 0
    command -v docker >/dev/null 2>&1 || die "no docker client on PATH"
    start_dockerd
    wait_for_engine
    local version
    version="$(docker version --format '{{.Server.Version}}' 2>/dev/null)" || version='?'
    say "docker engine is up: ${version}"
}

main "$@"
