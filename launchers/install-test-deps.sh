#!/usr/bin/env bash
# Install the Debian packages the end-to-end tests start (root; idempotent; `make test-deps`):
# Slurm, munge, MariaDB, gcc + libc6-dev (tests/test_slurm.py, launchers/slurm-cluster.sh and
# its loopback preload), PostgreSQL (tests/test_tracking_server.py), Chromium and its driver
# (tests/test_mlflow_ui.py), curl (the launchers' /health checks).  Arguments: only these
# packages (launchers/slurm-cluster.sh start installs its own).
set -euo pipefail

APT_PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server gcc libc6-dev postgresql
  chromium chromium-driver curl)
(($#)) && APT_PACKAGES=("$@")
POLICY=/usr/sbin/policy-rc.d

log() { printf '[test-deps %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

created_policy=0
cleanup() {
  local rc=$?
  if ((created_policy)); then rm -f "$POLICY"; fi
  exit "$rc"
}
trap cleanup EXIT

retry() {  # retry CMD...: three tries, for the package mirror's bad moments
  local i
  for i in 1 2 3; do
    "$@" && return 0
    log "failed (try $i/3): $*"
    sleep $((10 * i))
  done
  return 1
}

# shellcheck disable=SC1091
log "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME")"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # keep the maintainer scripts from starting the system's own daemons (the tests run private ones)
  if [[ ! -e $POLICY ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$POLICY" && chmod 755 "$POLICY" && created_policy=1
  fi
  retry apt-get update -q
  retry apt-get install -y -q --no-install-recommends "${missing[@]}"
  if ((created_policy)); then rm -f "$POLICY" && created_policy=0; fi
fi
