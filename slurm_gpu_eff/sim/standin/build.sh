#!/usr/bin/env bash
# Builds the stand-in libnvidia-ml.so.1 against NVIDIA's nvml.h (PyPI: nvidia-nvml-dev),
# in two variants: OUTDIR/current (today's driver) and OUTDIR/old (-DSTANDIN_OLD_DRIVER:
# no _v2 memory, _v3 processes, TemperatureV, ClocksEventReasons or GPM).
#   build.sh PYTHON OUTDIR
# PYTHON is the interpreter whose site-packages hold nvidia-nvml-dev. A variant is rebuilt
# only when a source (or this script, or nvml.h) is newer than it.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 PYTHON OUTDIR" >&2
    exit 2
fi
python=$1
outdir=$2
here=${BASH_SOURCE[0]%/*}
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
here=$(cd "$here" && pwd)  # builtins only up to the compiler check

if ! command -v cc >/dev/null 2>&1; then
    echo "build.sh: no C compiler 'cc' on PATH (Debian: apt-get install gcc)" >&2
    exit 1
fi

# nvml.h: cu13/include/nvml.h under one of the `nvidia` namespace package's directories.
header_dir=""
if paths=$("$python" -c 'import nvidia; print(*nvidia.__path__, sep="\n")' 2>/dev/null); then
    while IFS= read -r dir; do
        if [ -f "$dir/cu13/include/nvml.h" ]; then
            header_dir="$dir/cu13/include"
            break
        fi
    done <<<"$paths"
fi
if [ -z "$header_dir" ]; then
    echo "build.sh: NVIDIA's nvml.h not found for $python: install it with" >&2
    echo "  $python -m pip install nvidia-nvml-dev==13.5.37" >&2
    exit 1
fi

cflags=(-O2 -fPIC -Wall -Wextra -Werror -std=gnu11 -fvisibility=hidden -ffp-contract=off -I "$header_dir")
ldflags=(-shared -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined)

# Stale when missing, or older than any source, nvml.h or this script.
stale() {
    local lib=$1 f
    [ -f "$lib" ] || return 0
    for f in "$here"/*.c "$here"/*.h "$here/build.sh" "$header_dir/nvml.h"; do
        [ "$f" -nt "$lib" ] && return 0
    done
    return 1
}

variants=()
for variant in current old; do
    stale "$outdir/$variant/libnvidia-ml.so.1" && variants+=("$variant")
done
[ ${#variants[@]} -eq 0 ] && exit 0

# Sources that test STANDIN_OLD_DRIVER are compiled once per variant, the rest once:
# all in parallel (parsing nvml.h is most of the time).
mkdir -p "$outdir"
work=$(mktemp -d "$outdir/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
pids=()
for src in "$here"/*.c; do
    name=${src##*/}
    name=${name%.c}
    if grep -q STANDIN_OLD_DRIVER "$src"; then
        for variant in "${variants[@]}"; do
            define=()
            [ "$variant" = old ] && define=(-DSTANDIN_OLD_DRIVER)
            mkdir -p "$work/$variant"
            cc "${cflags[@]}" "${define[@]}" -c "$src" -o "$work/$variant/$name.o" &
            pids+=($!)
        done
    else
        mkdir -p "$work/common"
        cc "${cflags[@]}" -c "$src" -o "$work/common/$name.o" &
        pids+=($!)
    fi
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
if [ $failed -ne 0 ]; then
    echo "build.sh: compiling the stand-in NVML library failed" >&2
    exit 1
fi

# Linked under a temporary name, then renamed: a process loading the library meanwhile
# sees the old one or the new one, never half of it.
for variant in "${variants[@]}"; do
    lib="$outdir/$variant/libnvidia-ml.so.1"
    mkdir -p "$outdir/$variant"
    cc "${ldflags[@]}" -o "$work/$variant.so" "$work"/common/*.o "$work/$variant"/*.o -lm -lpthread
    mv -f "$work/$variant.so" "$lib"
done
