#!/usr/bin/env bash
# Regenerate include/cachealloc.h from the C API in src/ffi (cbindgen, configured by
# cbindgen.toml). The check in tests/c_header.rs fails until the result is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHEALLOC_UPDATE_HEADER=1 cargo test --test c_header committed_header_matches_the_c_api
echo "wrote include/cachealloc.h"
