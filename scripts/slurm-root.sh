#!/usr/bin/env bash
# A Debian root holding a newer Slurm for the development cluster (scripts/cluster.sh):
#
#   slurm-root.sh path RELEASE    print where RELEASE's root lives (built or not)
#   slurm-root.sh build RELEASE   make it if it is not there yet (idempotent), print its path
#
# RELEASE is 24.11 (Debian trixie) or 26.05 (Debian sid). 22.05 is the host's own Slurm
# (Debian 12) and needs no root. A root is built once, from the package mirror the host's
# apt already uses, and kept across `cluster.sh down` (GPUEFF_ROOTS, default
# /var/cache/gpueff/roots): about 500 MB and a minute each. It holds Slurm's daemons and
# commands, Python (for the project's hooks, in a venv of the release's own Python) and
# the Perl modules Slurm's seff needs; munge's daemon, MariaDB and PostgreSQL stay the
# host's (sockets and ports are shared with the root). Slurm's own seff from the release's
# source package goes to .peers/seff-RELEASE, run as it is (never copied in).
# Facts behind it: /work/shared/notes/slurm-newer.md.
set -euo pipefail
export PATH=/usr/sbin:/sbin:$PATH

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
ROOTS=${GPUEFF_ROOTS:-/var/cache/gpueff/roots}
# What a root needs inside: Slurm (daemons, commands), its Perl API for seff, Python.
PACKAGES=(slurm-wlm slurmd slurmctld slurmdbd slurm-client munge libslurm-perl libslurmdb-perl
  perl python3 python3-venv ca-certificates procps util-linux)

say() { printf 'slurm-root: %s\n' "$*" >&2; }
die() { printf 'slurm-root: error: %s\n' "$*" >&2; exit 1; }

suite_of() {
  case $1 in
  24.11) echo trixie ;;
  26.05) echo sid ;;
  *) die "no root for Slurm '$1': 24.11 (trixie) or 26.05 (sid); 22.05 is the host's" ;;
  esac
}

root_path() { echo "$ROOTS/slurm-$1"; }

# The Debian mirror the host's apt uses (deb822 or one-line form).
mirror() {
  local uri
  uri=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
    grep -v security | grep -m1 debian || true)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -m1 debian || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# Run CMD inside ROOT with /proc mounted, in a mount namespace of its own (nothing stays
# mounted on the host if it fails halfway).
in_root() {
  local root=$1
  shift
  unshare -m --propagation private sh -c 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"' \
    sh "$root" "$root" "$@"
}

apt_in_root() {
  local root=$1
  shift
  in_root "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 apt-get -q -o Dpkg::Use-Pty=0 "$@"
}

# Slurm's seff from the release's own source package (the peer the tests run beside ours).
# The mirror may not carry a suite's source (sid's 26.05.5 was seen missing): then the
# newest one it has (trixie's), said in .peers/seff-RELEASE.source.
fetch_seff() {
  local release=$1 root=$2 suite=$3 out=$REPO/.peers/seff-$1 tmp try
  [ -s "$out" ] && return 0
  tmp=$(mktemp -d "$root/tmp/seff.XXXXXX")
  for try in "$suite" trixie; do
    printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$(mirror)" "$try" >"$root/etc/apt/sources.list.d/gpueff-deb-src.sources"
    apt_in_root "$root" update >/dev/null 2>&1 || continue
    # The upstream tarball is all seff needs: the mirror may lack a security update's .dsc
    # (seen: trixie's 24.11.5-4+deb13u1), which fails apt-get source after the tarball came.
    in_root "$root" sh -c "cd ${tmp#"$root"} && apt-get source --download-only slurm-wlm/$try" >/dev/null 2>&1 || true
    compgen -G "$tmp/slurm-wlm_*.orig.tar.*" >/dev/null && break
  done
  rm -f "$root/etc/apt/sources.list.d/gpueff-deb-src.sources"
  apt_in_root "$root" update >/dev/null 2>&1 || true
  if ! (cd "$tmp" && tar xf slurm-wlm_*.orig.tar.* --wildcards '*/contribs/seff/seff' 2>/dev/null); then
    rm -rf "$tmp"
    die "could not fetch Debian's slurm-wlm source for $suite (nor trixie's)"
  fi
  mkdir -p "$REPO/.peers"
  install -m 0755 "$(find "$tmp" -path '*/contribs/seff/seff' -type f | head -n 1)" "$out"
  echo "contribs/seff/seff of $(basename "$tmp"/slurm-wlm_*.orig.tar.*) (Debian $try)" >"$out.source"
  rm -rf "$tmp"
  say "fetched Slurm's seff for $release into $out ($(cat "$out.source"))"
}

build() {
  local release=$1 suite root tmp start=$SECONDS log
  suite=$(suite_of "$release")
  root=$(root_path "$release")
  if [ -e "$root/.gpueff-root" ]; then
    fetch_seff "$release" "$root" "$suite"
    echo "$root"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "building a root needs root"
  command -v debootstrap >/dev/null || {
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; } ||
      die "could not install debootstrap"
  }
  mkdir -p "$ROOTS"
  tmp=$root.building
  rm -rf "$tmp"
  log=$ROOTS/slurm-$release.log
  say "building Slurm $release's root ($suite) in $root (log: $log)"
  debootstrap --variant=minbase "$suite" "$tmp" "$(mirror)" >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "debootstrap $suite failed"; }
  # Nothing starts by itself inside; sid's Release file may be past its Valid-Until.
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 0755 "$tmp/usr/sbin/policy-rc.d"
  echo 'Acquire::Check-Valid-Until "false";' >"$tmp/etc/apt/apt.conf.d/99gpueff"
  cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
  { apt_in_root "$tmp" update && apt_in_root "$tmp" install -y --no-install-recommends "${PACKAGES[@]}"; } >>"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; die "installing Slurm into the $suite root failed"; }
  apt_in_root "$tmp" clean >/dev/null 2>&1 || true
  in_root "$tmp" dpkg-query -W -f='slurm ${Version}\n' slurmd >"$tmp/.gpueff-root"
  mv "$tmp" "$root"
  fetch_seff "$release" "$root" "$suite"
  say "built $(cat "$root/.gpueff-root") in $((SECONDS - start)) s"
  echo "$root"
}

case ${1:-} in
path) [ $# -eq 2 ] && suite_of "$2" >/dev/null && root_path "$2" ;;
build) [ $# -eq 2 ] && build "$2" ;;
*) echo "usage: $0 path|build 24.11|26.05" >&2; exit 2 ;;
esac
