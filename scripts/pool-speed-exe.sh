#!/usr/bin/env bash
# Build the pool_speed benchmark of the crate in the current directory (honouring the caller's
# environment, e.g. CARGO_TARGET_DIR) without running it, and print its executable's path.
# Used by scripts/bench-instructions.sh and scripts/bench-decomposition.sh.
set -euo pipefail
cargo bench --bench pool_speed --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "pool_speed" and m.get("executable"):
        print(m["executable"])'
