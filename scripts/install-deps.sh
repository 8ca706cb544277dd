#!/usr/bin/env bash
# Install what the development cluster (scripts/cluster.sh) needs on Debian 12:
# Slurm 22.05, slurmdbd, munge, MariaDB, python3-venv, and gcc for the stand-in NVML library.
# Idempotent and fast: when everything is already there it runs no apt at all,
# so `make` can call it every time.
set -euo pipefail

# The daemons live in sbin, which a non-login root shell may not have on PATH.
export PATH=/usr/sbin:/sbin:$PATH

PACKAGES=(slurm-wlm slurmdbd munge mariadb-server python3-venv gcc libc6-dev)
COMMANDS=(slurmctld slurmd slurmdbd sacct munged mysqld_safe gcc)

# Print what is missing, one word each; nothing when all is installed.
missing() {
  local cmd
  for cmd in "${COMMANDS[@]}"; do
    command -v "$cmd" >/dev/null || echo "$cmd"
  done
  # Debian splits ensurepip out of the standard library: without python3-venv,
  # `venv --help` may still work but creating a venv fails, so check both.
  /usr/bin/python3 -m venv --help >/dev/null 2>&1 || echo "python3-venv"
  /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || echo "ensurepip"
}

# apt is noisy; keep its output in a log and show it only when it fails.
apt_install() {
  local log
  log=$(mktemp /tmp/gpueff-install-deps.XXXXXX.log)
  if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${PACKAGES[@]}"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "install-deps: apt-get failed (full log: $log)" >&2
    exit 1
  fi
  rm -f "$log"
}

main() {
  local gaps
  gaps=$(missing | tr '\n' ' ')
  if [ -z "$gaps" ]; then
    echo "install-deps: nothing to do (slurm, slurmdbd, munge, mariadb, python3-venv present)"
    return
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${gaps% }; run as root to apt-get install ${PACKAGES[*]}" >&2
    exit 1
  fi
  apt_install
  echo "install-deps: installed ${PACKAGES[*]} (was missing: ${gaps% })"
}

main "$@"
