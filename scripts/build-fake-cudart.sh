#!/usr/bin/env bash
# Builds the project's fake CUDA runtime (tests/fake-cudart: a host-memory libcudart.so.12 for
# machines without a GPU) and its fake driver libcuda.so.1 into DIR when a source is newer than
# the last build, with the same flags as tests/support/fake_cudart.rs, and prints the path of
# libcudart.so.12. DIR also gets a libcudart.so link for -lcudart. The runtime loads the driver
# from its own folder (RUNPATH $ORIGIN), never a real libcuda.so.1 of the machine.
# Usage: scripts/build-fake-cudart.sh DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/tests/fake-cudart"
dir="${1:?usage: build-fake-cudart.sh DIR}"
so="$dir/libcudart.so.12"
driver="$dir/libcuda.so.1"
if [[ ! -f "$so" || ! -f "$driver" ]] || [[ -n "$(find "$src" -newer "$so" -type f | head -n 1)" ]]; then
    mkdir -p "$dir"
    "${CC:-gcc}" -shared -fPIC -O2 -std=c11 -D_GNU_SOURCE -pthread \
        -Wl,-soname,libcudart.so.12 -Wl,-Bsymbolic -Wl,--enable-new-dtags '-Wl,-rpath,$ORIGIN' \
        -Wl,--version-script="$src/libcudart.map" -I "$src/include" \
        -o "$so.tmp" "$src"/src/*.c -ldl
    mv "$so.tmp" "$so"
    "${CC:-gcc}" -shared -fPIC -O2 -std=c11 -D_GNU_SOURCE \
        -Wl,-soname,libcuda.so.1 -Wl,--enable-new-dtags '-Wl,-rpath,$ORIGIN' \
        -Wl,--version-script="$src/driver/libcuda.map" -I "$src/include" -I "$src/src" \
        -o "$driver.tmp" "$src"/driver/*.c "$so"
    mv "$driver.tmp" "$driver"
fi
ln -sf libcudart.so.12 "$dir/libcudart.so"
printf '%s\n' "$so"
