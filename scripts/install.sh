#!/usr/bin/env bash
# Install libcachealloc into PREFIX (default /usr/local):
#   PREFIX/lib/libcachealloc.so, PREFIX/include/cachealloc.h, PREFIX/lib/pkgconfig/cachealloc.pc
# Builds the release library first. Set CACHEALLOC_LIBRARY=/path/to/libcachealloc.so to install
# an already-built library instead (the test suite does this with its own build).
#
# Then: cc prog.c $(pkg-config --cflags --libs cachealloc)   (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
# when PREFIX is not a default pkg-config location), or LD_PRELOAD=PREFIX/lib/libcachealloc.so.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/usr/local}"
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac

library="${CACHEALLOC_LIBRARY:-}"
if [ -z "$library" ]; then
    cargo build --release --lib
    library="${CARGO_TARGET_DIR:-target}/release/libcachealloc.so"
fi
[ -f "$library" ] || { echo "install.sh: $library not found" >&2; exit 1; }

version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)"

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 755 "$library" "$prefix/lib/libcachealloc.so"
install -m 644 include/cachealloc.h "$prefix/include/cachealloc.h"
cat > "$prefix/lib/pkgconfig/cachealloc.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: cachealloc
Description: Caching CUDA device-memory allocator with PyTorch's policy (C API and LD_PRELOAD shim)
Version: $version
Libs: -L\${libdir} -lcachealloc
Cflags: -I\${includedir}
PC
echo "installed cachealloc $version into $prefix"
