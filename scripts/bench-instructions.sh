#!/usr/bin/env bash
# Deterministic companion to `cargo bench --bench pool_speed`: instructions (and simulated
# branch mispredictions) per operation for the pool and for offset-allocator on the same
# operation sequences, counted by valgrind's callgrind — unaffected by other load on the
# machine, unlike the timings. One pass per allocator and row; the log-uniform row uses the
# --quick size (100,000 operations).
# Usage: scripts/bench-instructions.sh [ROW-FILTER]   (needs valgrind: apt-get install valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 2; }

bench=$(scripts/pool-speed-exe.sh)
rows=("log-uniform" "transformer" "equal-size" "decomfl" "cs336-wedsonlin" "ftcourse" "sqattn" "cs336-magma27")
[ $# -gt 0 ] && rows=("$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

count() { # row side-function → "instructions mispredicts ops"
  local out="$work/cg.out"
  valgrind --tool=callgrind --branch-sim=yes --callgrind-out-file="$out" \
    --toggle-collect="*::$2" "$bench" --quick --reps 1 --no-replay --only "$1" >"$work/table" 2>/dev/null
  local ops
  ops=$(awk -F'|' 'NR > 2 { gsub(/ /, "", $3); print $3; exit }' "$work/table")
  [ -n "$ops" ] || { echo "- - 0"; return; }
  callgrind_annotate "$out" 2>/dev/null | awk -v ops="$ops" '/PROGRAM TOTALS/ {
    gsub(",", ""); print $1, $5, ops }'
}

printf '| workload | ops | cachealloc instr/op | offset-allocator instr/op | ratio | mispredicts/op (cachealloc / offset-allocator) |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
for row in "${rows[@]}"; do
  read -r pi pm ops < <(count "$row" pool_pass)
  read -r oi om _ < <(count "$row" offset_allocator_pass)
  if [ "$ops" = 0 ]; then echo "| $row | (not run: trace not found) | | | | |"; continue; fi
  awk -v r="$row" -v n="$ops" -v pi="$pi" -v pm="$pm" -v oi="$oi" -v om="$om" 'BEGIN {
    printf "| %s | %d | %.0f | %.0f | %.2fx | %.2f / %.2f |\n", r, n, pi/n, oi/n, pi/oi, pm/n, om/n }'
done
