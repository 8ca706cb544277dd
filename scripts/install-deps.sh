#!/usr/bin/env bash
# Install what the development cluster (scripts/cluster.sh) needs on Debian 12:
# Slurm 22.05, slurmdbd, munge, MariaDB, python3-venv, gcc for the stand-in NVML library,
# Slurm's headers and Python's (libslurm-dev, python3-dev) for compiling pyslurm
# (scripts/build-pyslurm.sh; its Cython and setuptools go into a build venv, not apt),
# PostgreSQL's server and libpq for the store's second engine, Chromium (headless: the
# test that screenshots the usage report's HTML page), and Prometheus's node_exporter (the
# test that scrapes our textfile through the real collector; run on a port of its own). Our PostgreSQL servers
# are private ones under a directory of their own (scripts/pg.sh); the cluster Debian's
# package may create (15/main, port 5432) is never used, whether it runs or not.
# Idempotent and fast: when everything is already there it runs no apt at all,
# so `make` can call it every time.
set -euo pipefail

# The daemons live in sbin, which a non-login root shell may not have on PATH.
export PATH=/usr/sbin:/sbin:$PATH

PACKAGES=(slurm-wlm slurmdbd munge mariadb-server python3-venv gcc libc6-dev libslurm-perl libslurmdb-perl
  libslurm-dev python3-dev postgresql libpq5 chromium prometheus-node-exporter)
COMMANDS=(slurmctld slurmd slurmdbd sacct munged mysqld_safe gcc chromium prometheus-node-exporter)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# Slurm's own seff, the peer the tests compare with: from Debian's source package of the
# installed Slurm, run as it is (never copied into this repository).
SEFF=$REPO/.peers/seff

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
  perl -MSlurmdb -e1 >/dev/null 2>&1 || echo "libslurmdb-perl"
  [ -r /usr/include/slurm/slurm_version.h ] || echo "libslurm-dev"
  /usr/bin/python3 -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    2>/dev/null || echo "python3-dev"
  # PostgreSQL's server binaries are not on PATH (Debian: /usr/lib/postgresql/N/bin).
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || echo "postgresql"
  id postgres >/dev/null 2>&1 || echo "postgres-user"
  # psycopg (pure Python) loads the system's libpq.so.5.
  [[ $(dpkg-query -W -f='${Status}' libpq5 2>/dev/null) == *" ok installed" ]] || echo "libpq5"
}

# seff from `apt-get source slurm-wlm` (a deb-src line for this release is added if the
# machine has none), unpacked to .peers/seff. Skipped when it is there already.
fetch_seff() {
  [ -s "$SEFF" ] && return 0
  [ "$(id -u)" -eq 0 ] || { echo "install-deps: run as root to fetch seff" >&2; return 1; }
  local tmp list=/etc/apt/sources.list.d/gpueff-deb-src.sources codename
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$codename" "$codename" >"$list"
  fi
  tmp=$(mktemp -d)
  if ! (cd "$tmp" && apt-get update >/dev/null 2>&1 && apt-get source --download-only slurm-wlm >/dev/null 2>&1 &&
        tar xzf slurm-wlm_*.orig.tar.gz --wildcards '*/contribs/seff/seff'); then
    rm -rf "$tmp"
    echo "install-deps: could not fetch seff from Debian's slurm-wlm source package" >&2
    return 1
  fi
  mkdir -p "$(dirname "$SEFF")"
  install -m 0755 "$(find "$tmp" -path '*/contribs/seff/seff' -type f | head -n 1)" "$SEFF"
  rm -rf "$tmp"
  echo "install-deps: fetched Slurm's seff into $SEFF"
}

# apt is noisy; keep its output in a log and show it only when it fails. No service the
# packages bring is started (policy-rc.d says no): the cluster and the tests start their
# own daemons, and a node_exporter left listening on 9100 would serve this machine's data.
apt_install() {
  local log policy=/usr/sbin/policy-rc.d ours=""
  log=$(mktemp /tmp/gpueff-install-deps.XXXXXX.log)
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && ours=1
  fi
  if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${PACKAGES[@]}"; } >"$log" 2>&1; then
    [ -z "$ours" ] || rm -f "$policy"
    tail -n 30 "$log" >&2
    echo "install-deps: apt-get failed (full log: $log)" >&2
    exit 1
  fi
  [ -z "$ours" ] || rm -f "$policy"
  rm -f "$log"
}

main() {
  local gaps
  gaps=$(missing | tr '\n' ' ')
  if [ -z "$gaps" ]; then
    echo "install-deps: nothing to do (slurm, slurmdbd, munge, mariadb, postgresql, python3-venv, Slurm's and Python's headers, chromium, node_exporter present)"
    fetch_seff
    return
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${gaps% }; run as root to apt-get install ${PACKAGES[*]}" >&2
    exit 1
  fi
  apt_install
  echo "install-deps: installed ${PACKAGES[*]} (was missing: ${gaps% })"
  fetch_seff
}

main "$@"
