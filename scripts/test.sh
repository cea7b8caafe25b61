#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what the tests need beyond Rust (a C compiler,
# pkg-config, readelf, the real NVIDIA runtime from PyPI into .venv), then run every test and
# print one closing line with the totals over all test binaries (and a note when the real traces
# were not found, so their tests skipped; under CI that is a failure instead).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -x scripts/setup-test-deps.sh ]]; then
    scripts/setup-test-deps.sh
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i + 1) ~ /^passed/) passed += $i
            if ($(i + 1) ~ /^failed/) failed += $i
        }
     }
     END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
traces="${CACHEALLOC_TRACES:-../shared/traces/real}"
if [[ ! -d "$traces" ]]; then
    echo "note: no real traces at $traces, so the tests that replay recorded PyTorch snapshots" \
         "(parity, real_snapshots, parts of cli) skipped; set CACHEALLOC_TRACES to their folder"
fi
exit "$status"
