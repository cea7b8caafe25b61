#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what the tests need beyond Rust (a C compiler,
# pkg-config, readelf, the real NVIDIA runtime from PyPI into .venv), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -x scripts/setup-test-deps.sh ]]; then
    scripts/setup-test-deps.sh
fi
cargo test --workspace "$@"
