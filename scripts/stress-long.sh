#!/usr/bin/env bash
# The long run of the multithreaded stress through the shim (tests/preload_stress.rs): 8 threads,
# every free_sync policy, many more operations per thread than the normal suite.
# Usage: scripts/stress-long.sh [OPS_PER_THREAD]   (default 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHEALLOC_STRESS_OPS="${1:-1000000}" cargo test --release --test preload_stress -- --nocapture --test-threads=1
