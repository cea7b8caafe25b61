#!/usr/bin/env bash
# Install libcachealloc into PREFIX (default /usr/local):
#   PREFIX/lib/libcachealloc.so, PREFIX/include/cachealloc.h, PREFIX/lib/pkgconfig/cachealloc.pc
# Builds the release library first. Set CACHEALLOC_LIBRARY=/path/to/libcachealloc.so to install
# an already-built library instead (the test suite does this with its own build).
#
# Then: cc prog.c $(pkg-config --cflags --libs cachealloc)   (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
# when PREFIX is not a default pkg-config location), or LD_PRELOAD=PREFIX/lib/libcachealloc.so.
set -euo pipefail

usage() {
    echo "usage: scripts/install.sh [PREFIX]   (default /usr/local; a relative PREFIX is taken from the current directory)" >&2
}

case "${1-}" in
    -h | --help)
        usage
        exit 0
        ;;
    -*)
        echo "install.sh: unknown option '$1'" >&2
        usage
        exit 2
        ;;
esac
if (($# > 1)); then
    echo "install.sh: one PREFIX at most, got $#: $*" >&2
    usage
    exit 2
fi
if (($# == 1)) && [ -z "$1" ]; then
    # An unset variable passed as "$PREFIX" must not install system-wide without a word.
    echo "install.sh: PREFIX is empty (omit it to install into /usr/local)" >&2
    exit 2
fi
prefix="${1:-/usr/local}"
# Paths given relative to where the script was run from, before it moves to the repository.
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac
# pkg-config's flags are split at whitespace and its files treat # and $ specially: a prefix
# holding any of them would give a cachealloc.pc whose flags name a path that does not exist.
case "$prefix" in
    *[[:space:]\#\$\"\'\\]*)
        echo "install.sh: PREFIX '$prefix' contains whitespace or one of # \$ \" ' \\, which pkg-config flags cannot carry; choose another prefix" >&2
        exit 2
        ;;
esac
library="${CACHEALLOC_LIBRARY:-}"
case "$library" in
    "" | /*) ;;
    *) library="$PWD/$library" ;;
esac
cd "$(dirname "$0")/.."

if [ -z "$library" ]; then
    cargo build --release --lib
    # Where cargo put the build: CARGO_TARGET_DIR, CARGO_BUILD_TARGET_DIR or cargo's
    # configuration may move it, and an old copy left in target/ must not be installed instead.
    target="$(cargo metadata --no-deps --format-version 1 \
        | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
    [ -n "$target" ] || { echo "install.sh: cargo metadata did not name the build's target directory" >&2; exit 1; }
    library="$target/release/libcachealloc.so"
fi
[ -f "$library" ] || { echo "install.sh: $library not found" >&2; exit 1; }

version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)"

install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 755 "$library" "$prefix/lib/libcachealloc.so"
# The release build keeps debugging information for profiling (17 MB); the installed copy
# does not need it.
if command -v strip >/dev/null 2>&1; then
    strip --strip-debug "$prefix/lib/libcachealloc.so"
else
    echo "install.sh: strip not found (binutils): the library is installed with its debugging information" >&2
fi
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
