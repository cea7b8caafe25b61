#!/usr/bin/env bash
# The long run of the pool's property test: many more random sequences than the normal suite.
# Usage: scripts/proptest-long.sh [CASES]   (default 5000 cases of 2,000 operations each)
set -euo pipefail
cd "$(dirname "$0")/.."
PROPTEST_CASES="${1:-5000}" cargo test --release --test pool_properties -- --nocapture
