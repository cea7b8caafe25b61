#!/usr/bin/env bash
# The long run of the damaged-trace tests: many more truncated, byte-changed and field-changed
# copies of real snapshots than the normal suite, each loaded and replayed every way; any panic
# (arithmetic overflow included: checked here as in the debug build the suite runs) fails with
# the change that caused it.
# Usage: scripts/corrupt-long.sh [ROUNDS]   (default 5000 copies per test)
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CACHEALLOC_CORRUPT_ROUNDS="${1:-5000}" \
  cargo test --release --test corrupt_traces
