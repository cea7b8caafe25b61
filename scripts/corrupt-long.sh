#!/usr/bin/env bash
# The long run of the damaged-trace tests: many more truncated, byte-changed and field-changed
# copies of real snapshots than the normal suite, each loaded and replayed every way; any panic
# (arithmetic overflow included: the `corrupt` profile checks it, as the debug build the suite
# runs does) fails with the change that caused it.
# Usage: scripts/corrupt-long.sh [ROUNDS]   (default 5000 copies of the small recording, 625 of
# the larger one and 200 of the expandable-segments one, per test)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHEALLOC_CORRUPT_ROUNDS="${1:-5000}" cargo test --profile corrupt --test corrupt_traces
