#!/usr/bin/env bash
# Where the pool's time goes next to offset-allocator: `cargo bench --bench pool_speed` built
# four ways from the current commit, with benches/experiments/parity-duties.patch applied in a
# scratch worktree — as is; without the statistics updates; with frees that name the block
# instead of its address (no address lookup: offset-allocator's free gets its node the same
# way); and without both. The variants' passes alternate, so a machine that speeds up or slows down
# affects all alike. Each prints its table row for every workload, with the ratio columns.
# The patch makes the harness keep each allocation's block id beside its pointer in every
# variant, which costs the pool 1-3 ns per operation (the as-is build measured 1.73-1.76x on
# log-uniform, the unpatched bench 1.69-1.72x).
# Usage: scripts/bench-decomposition.sh [ROW-FILTER] [ROUNDS]   (about 3 minutes for all rows
# and two rounds)
# When a change to the lines it patches stops the patch applying (tests/bench_smoke.rs checks),
# regenerate it: `git apply --reject` it in a scratch worktree of the new commit, mend the
# rejected hunks by hand, and write that worktree's `git diff` over the patch.
set -euo pipefail
cd "$(dirname "$0")/.."
main=$PWD
filter=${1:-}
rounds=${2:-2}
work=$(mktemp -d)
tree="$work/tree"
cleanup() { git worktree remove --force "$tree" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
git worktree add --detach "$tree" HEAD >/dev/null 2>&1
if ! git -C "$tree" apply "$main/benches/experiments/parity-duties.patch" 2>"$work/apply.err"; then
  echo "benches/experiments/parity-duties.patch no longer applies to this commit:" >&2
  cat "$work/apply.err" >&2
  exit 2
fi
# Real traces, as the bench finds them from the main tree.
export CACHEALLOC_TRACES=${CACHEALLOC_TRACES:-$(cd .. && pwd)/shared/traces/real}

variants=("as-is" "no-stats" "no-address-lookup" "no-stats-no-address-lookup")
for v in "${variants[@]}"; do
  env_vars=()
  [[ $v == *no-stats* ]] && env_vars+=(CACHEALLOC_EXPERIMENT_NO_STATS=1)
  [[ $v == *no-address-lookup* ]] && env_vars+=(CACHEALLOC_EXPERIMENT_NO_ADDRESS_LOOKUP=1)
  exe=$(cd "$tree" && env "${env_vars[@]}" CARGO_TARGET_DIR="$work/target" "$main/scripts/pool-speed-exe.sh")
  cp "$exe" "$work/bench-$v"
done

args=(--reps 5 --no-replay)
[ -n "$filter" ] && args+=(--only "$filter")
for round in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    echo "## round $round: $v"
    "$work/bench-$v" "${args[@]}"
    echo
  done
done
