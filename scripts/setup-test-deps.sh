#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain, and does nothing when it is all
# there already (no network then):
#   - Debian packages: gcc (the fake CUDA runtime and the C test programs), g++ (the header is
#     compiled as C++ too), pkg-config,
#     binutils (readelf and nm for the symbol-binding tests), python3 and its venv module;
#   - NVIDIA's real CUDA runtime, libcudart.so.12 from PyPI (nvidia-cuda-runtime-cu12), into the
#     project-local virtual environment .venv/, where tests/support/real_cudart.rs looks for it.
# Prints the path of libcudart.so.12 at the end. Runs as root (as on CI) or with sudo.
set -euo pipefail

# The runtime version the tests were written against (its answers on a machine without a driver
# are recorded in the tests): change it here only.
readonly CUDART_PACKAGE=nvidia-cuda-runtime-cu12
readonly CUDART_VERSION=12.9.79

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"

log() { printf 'setup-test-deps: %s\n' "$*" >&2; }

# --- Debian packages --------------------------------------------------------------------------

missing=()
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
{ command -v readelf >/dev/null 2>&1 && command -v nm >/dev/null 2>&1; } || missing+=(binutils)
if ! command -v python3 >/dev/null 2>&1; then
    missing+=(python3 python3-venv)
elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    # Debian's python3 ships venv's pip bootstrap in a separate package.
    missing+=(python3-venv)
fi

if ((${#missing[@]} > 0)); then
    log "installing Debian packages: ${missing[*]}"
    sudo=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null 2>&1 || {
            log "not root and no sudo: install ${missing[*]} by hand"
            exit 1
        }
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

# --- The real CUDA runtime in .venv -----------------------------------------------------------

# The installed copy, if the pinned version is there (checked from the files alone: fast).
find_cudart() {
    local dist lib
    for dist in "$venv"/lib/python3*/site-packages/nvidia_cuda_runtime_cu12-"$CUDART_VERSION".dist-info; do
        lib="$(dirname "$dist")/nvidia/cuda_runtime/lib/libcudart.so.12"
        if [[ -d "$dist" && -f "$lib" ]]; then
            printf '%s\n' "$lib"
            return 0
        fi
    done
    return 1
}

if ! lib="$(find_cudart)"; then
    if [[ ! -x "$venv/bin/python" ]]; then
        log "creating $venv"
        python3 -m venv "$venv"
    fi
    log "installing $CUDART_PACKAGE==$CUDART_VERSION into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$CUDART_PACKAGE==$CUDART_VERSION"
    lib="$(find_cudart)" || {
        log "$CUDART_PACKAGE installed, but libcudart.so.12 is not where expected under $venv"
        exit 1
    }
fi

printf 'libcudart.so.12: %s\n' "$lib"
