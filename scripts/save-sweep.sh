#!/usr/bin/env bash
# The long run of tests/cli_save.rs's random_saved_runs_replay_faithfully: synthetic runs drawn
# at random (workload, settings, capacity, memory held by a context, placement, seed) are saved
# with `synth --save` and replayed with `--faithful` from the file alone, which must reproduce
# each run's figures and land every allocation at its address (runs of expandable segments also
# with their range and device_memory lines taken out, their ranges inferred from the page maps
# and the device's memory given with --device-memory). The normal suite runs 12 cases.
# Usage: scripts/save-sweep.sh [CASES] [SEED]   (default 400 cases, seed 1)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHEALLOC_SAVE_CASES="${1:-400}" CACHEALLOC_SAVE_SEED="${2:-1}" \
  cargo test --release --test cli_save random_saved_runs_replay_faithfully -- --nocapture
