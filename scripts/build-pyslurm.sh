#!/usr/bin/env bash
# pyslurm, Slurm's Python binding, built from its vendored sources for the Slurm it talks to
# (the optional in-process backend: slurm_gpu_eff/slurm/inproc.py).
#
#   build-pyslurm.sh host VENV            for the host's Slurm (22.05 on Debian 12), into VENV
#                                         (the project's .venv: `make venv` calls this)
#   build-pyslurm.sh root RELEASE VENV    inside RELEASE's Debian root (scripts/slurm-root.sh),
#                                         for its Slurm and Python, into VENV (a venv of the
#                                         root's Python at the same path in and out:
#                                         scripts/cluster.sh calls this when it makes one)
#
# pyslurm must be compiled against the Slurm major release it talks to, and PyPI has it only
# for Slurm 25.11, so its sources come from ../shared/vendor beside the checkout (or
# $PYSLURM_SRC): pyslurm-MAJOR.MINOR.*.tar.gz, checked against SHA256SUMS there. Where no
# source matches (no ../shared in a fresh clone; Slurm 26.05, which pyslurm has no branch
# for) this says so in one line and succeeds: gpueff then asks Slurm through its commands.
#
# A compile costs about 3 minutes on 2 cores, so each wheel is built once, in a throwaway
# build venv (22.5.3 wants setuptools 59.2.0 and wheel 0.37.0, which must not reach the
# project's venv), and kept in $GPUEFF_WHEELS (default /var/cache/gpueff/wheels) under the
# source's checksum, the Python version and the Slurm release; it is built again only when
# one of those changes. Installing a kept wheel takes a second; an installed one is left.
# Facts behind it: /work/shared/notes/slurm-newer.md ("pyslurm").
set -euo pipefail
export PATH=/usr/sbin:/sbin:$PATH

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
SRC=${PYSLURM_SRC:-$REPO/../shared/vendor}
WHEELS=${GPUEFF_WHEELS:-/var/cache/gpueff/wheels}
WORK=$REPO/build/pyslurm # unpacked sources and build venvs; removed after each build

say() { printf 'build-pyslurm: %s\n' "$*" >&2; }
die() { printf 'build-pyslurm: error: %s\n' "$*" >&2; exit 1; }

# The Slurm release (MAJOR.MINOR) of the slurm_version.h under $1 (a root, or "" for the host).
slurm_release() {
  local header=$1/usr/include/slurm/slurm_version.h number
  [ -r "$header" ] || return 1
  number=$(awk '$1 == "#define" && $2 == "SLURM_VERSION_NUMBER" { print $3 }' "$header")
  [ -n "$number" ] || return 1
  printf '%d.%02d\n' $((number >> 16 & 255)) $((number >> 8 & 255))
}

# The vendored source for a release (the newest of them), or nothing.
source_for() {
  local major=${1%.*} minor=${1#*.}
  [ -d "$SRC" ] || return 0
  find "$SRC" -maxdepth 1 -name "pyslurm-$major.$((10#$minor)).*.tar.gz" -printf '%f\n' | sort -V | tail -n 1
}

# The archive's line in SHA256SUMS must be there and hold.
check_sum() {
  local file=$1 line
  [ -r "$SRC/SHA256SUMS" ] || die "$SRC has no SHA256SUMS to check $file against"
  line=$(awk -v f="$file" '$2 == f || $2 == "*" f' "$SRC/SHA256SUMS")
  [ -n "$line" ] || die "$file is not listed in $SRC/SHA256SUMS"
  (cd "$SRC" && sha256sum --quiet -c - <<<"$line" >/dev/null 2>&1) ||
    die "$SRC/$file does not match its SHA256SUMS line: not building it"
  awk '{ print substr($1, 1, 12) }' <<<"$line"
}

# What building each pyslurm takes. 22.5.3: Cython < 3 and the old setuptools its
# pyproject pins. The 24.11 branch: Cython 3 (with Cython < 3 its C does not compile on
# Python 3.13: '_PyDict_SetItem_KnownHash').
build_requires() {
  case $1 in
  pyslurm-22.5.*) echo 'Cython>=0.29.30,<3.0 setuptools==59.2.0 wheel==0.37.0' ;;
  *) echo 'Cython>=3.0,<4 setuptools>=59.2.0 wheel>=0.37.0 packaging>=21.3' ;;
  esac
}

# The key of a wheel: the source (name, checksum), Python X.Y and Slurm MAJOR.MINOR.
wheel_dir() { echo "$WHEELS/${1%.tar.gz}-$2-py$3-slurm$4"; }

# Run a command on the host, or in the root $ROOT with the checkout bound at its own path,
# the host's CA bundle (pip reaches the package index through it) and /proc, in a mount
# namespace of its own (nothing stays mounted afterwards, whether or not
# scripts/cluster.sh has the root mounted now).
ROOT=""
here() {
  if [ -z "$ROOT" ]; then
    "$@"
  else
    unshare -m --propagation private sh -c '
      root=$1 repo=$2; shift 2
      mount -t proc proc "$root/proc" && mkdir -p "$root$repo" "$root/etc/ssl/certs" &&
        mount --bind "$repo" "$root$repo" && mount --bind /etc/ssl/certs "$root/etc/ssl/certs" &&
        exec chroot "$root" /usr/bin/env HOME=/tmp PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
          PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"' sh "$ROOT" "$REPO" "$@"
  fi
}

# What compiling needs inside a root, installed there when absent (the host's come from
# scripts/install-deps.sh).
root_build_deps() {
  local missing=()
  [ -r "$ROOT/usr/include/slurm/slurm_version.h" ] || missing+=(libslurm-dev)
  compgen -G "$ROOT/usr/include/python3*/Python.h" >/dev/null || missing+=(python3-dev)
  [ -x "$ROOT/usr/bin/gcc" ] || missing+=(gcc libc6-dev)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]} in $ROOT"
  { here env DEBIAN_FRONTEND=noninteractive apt-get -q -o Dpkg::Use-Pty=0 update &&
    here env DEBIAN_FRONTEND=noninteractive apt-get -q -o Dpkg::Use-Pty=0 install -y --no-install-recommends "${missing[@]}"; } \
    >"$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log" >&2; die "could not install ${missing[*]} in $ROOT"; }
}

# Build the wheel of $file for Python $python (a path inside $ROOT, or on the host) into
# $out, unless it is there; niced, one compile job: the machine may be running tests.
build_wheel() {
  local file=$1 python=$2 out=$3 tmp start=$SECONDS log
  compgen -G "$out/pyslurm-*.whl" >/dev/null && return 0
  mkdir -p "$WORK" "$WHEELS"
  tmp=$(mktemp -d "$WORK/build.XXXXXX")
  log=$WORK/${file%.tar.gz}.log
  say "compiling ${file%.tar.gz} for Slurm $release, Python $pyver${ROOT:+ in $ROOT} (about 3 minutes; log: $log)"
  tar -xzf "$SRC/$file" -C "$tmp"
  # shellcheck disable=SC2046 # the requirements are words
  if ! { here "$python" -m venv "$tmp/venv" &&
         here "$tmp/venv/bin/pip" install -q $(build_requires "$file") &&
         (cd "$tmp" && here env SLURM_LIB_DIR=/usr/lib/x86_64-linux-gnu SLURM_INCLUDE_DIR=/usr/include \
            PYSLURM_BUILD_JOBS=1 nice -n 19 "$tmp/venv/bin/pip" wheel -q --no-deps --no-build-isolation \
            -w "$tmp/wheel" "$tmp/${file%.tar.gz}"); } >"$log" 2>&1; then
    tail -n 25 "$log" >&2
    rm -rf "$tmp"
    die "could not build ${file%.tar.gz} (log: $log)"
  fi
  mkdir -p "$out.tmp" && mv "$tmp"/wheel/pyslurm-*.whl "$out.tmp/" && rm -rf "$out" && mv "$out.tmp" "$out"
  rm -rf "$tmp"
  say "built $(basename "$out"/pyslurm-*.whl) in $((SECONDS - start)) s, kept in $out"
}

# Build (or take from the cache) and install into $venv, for Slurm $release; $ROOT "" for
# the host.
install() {
  local venv=$1 where=${ROOT:-this host} file sum wheel out python tmp
  file=$(source_for "$release")
  if [ -z "$file" ]; then
    say "no pyslurm source for Slurm $release in $SRC (set PYSLURM_SRC): not built; gpueff asks Slurm through its commands there"
    return 0
  fi
  sum=$(check_sum "$file")
  python=$venv/bin/python
  [ -x "$python" ] || die "$python is missing: make the venv first"
  pyver=$(here "$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  out=$(wheel_dir "$file" "$sum" "$pyver" "$release")
  if [ "$(cat "$venv/.pyslurm" 2>/dev/null)" = "$out" ] && compgen -G "$venv/lib/python*/site-packages/pyslurm" >/dev/null; then
    say "${file%.tar.gz} for Slurm $release is installed in $venv"
    return 0
  fi
  [ -z "$ROOT" ] || root_build_deps
  # the build venv is made by the venv's own base interpreter (the root's, in a root)
  build_wheel "$file" "$(here "$python" -c 'import sys; print(sys._base_executable)')" "$out"
  wheel=$(compgen -G "$out/pyslurm-*.whl" | head -n 1)
  # through the checkout, which a root sees at the same path (the cache it does not)
  mkdir -p "$WORK"
  tmp=$(mktemp -d "$WORK/install.XXXXXX")
  cp "$wheel" "$tmp/"
  here "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-index --force-reinstall \
    "$tmp/$(basename "$wheel")" || { rm -rf "$tmp"; die "could not install $wheel into $venv"; }
  rm -rf "$tmp"
  echo "$out" >"$venv/.pyslurm"
  say "installed $(basename "$wheel") into $venv ($where, Slurm $release)"
}

release="" pyver=""
case ${1:-} in
host) [ $# -eq 2 ] || { echo "usage: $0 host VENV" >&2; exit 2; }
  release=$(slurm_release "") || {
    say "no Slurm headers in /usr/include (libslurm-dev: scripts/install-deps.sh): pyslurm not built, gpueff asks Slurm through its commands"
    exit 0
  }
  install "$(realpath -m "$2")" ;;
root) [ $# -eq 3 ] || { echo "usage: $0 root RELEASE VENV" >&2; exit 2; }
  release=$2
  ROOT=$(bash "$REPO/scripts/slurm-root.sh" path "$release")
  [ -e "$ROOT/.gpueff-root" ] || die "Slurm $release's root is not built ($ROOT): scripts/slurm-root.sh build $release"
  install "$(realpath -m "$3")" ;;
*) echo "usage: $0 host VENV | root RELEASE VENV" >&2; exit 2 ;;
esac
