#!/usr/bin/env bash
# The long run of the pool's property tests: many more random sequences than the normal suite.
# tests/pool_properties.rs checks the invariants, a shadow of the live allocations and the
# statistics rules; tests/policy_oracle.rs compares every step with a plain implementation of
# PyTorch's policy (tests/support/reference_pool/).
# Usage: scripts/proptest-long.sh [CASES]   (default 5000 cases of each)
set -euo pipefail
cd "$(dirname "$0")/.."
PROPTEST_CASES="${1:-5000}" cargo test --release --test pool_properties --test policy_oracle -- --nocapture
