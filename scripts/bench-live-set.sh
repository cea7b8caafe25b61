#!/usr/bin/env bash
# The log-uniform row of `cargo bench --bench pool_speed` at several live-set sizes: the same
# workload (1,000,000 operations, sizes log-uniform 512 B–256 MiB) with the live requested bytes
# kept under BUDGETS GiB (the benchmark's row uses 40), printed as one table. It shows how the
# pool's cost relative to offset-allocator's grows once the pool's blocks and free index no longer
# fit in the core's caches.
# Usage: scripts/bench-live-set.sh [BUDGETS...]   (default: 40 20 10 4 1; --quick for 100,000 ops)
set -euo pipefail
cd "$(dirname "$0")/.."
extra=()
if [ "${1:-}" = --quick ]; then extra=(--quick); shift; fi
budgets=("$@")
[ ${#budgets[@]} -gt 0 ] || budgets=(40 20 10 4 1)
bench=$(scripts/pool-speed-exe.sh)
header=1
for b in "${budgets[@]}"; do
  "$bench" "${extra[@]}" --no-replay --only log-uniform --loguniform "budget_gib=$b" \
    | if [ $header = 1 ]; then grep '^|'; else grep '^|' | tail -n +3; fi
  header=0
done
