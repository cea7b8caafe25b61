#!/usr/bin/env bash
# cachealloc in two minutes, on any machine (no GPU needed):
#  1. a CUDA program that allocates in a loop, run against a stand-in CUDA runtime, without and
#     then with LD_PRELOAD=libcachealloc.so (calls served from the pool vs calls reaching the
#     runtime, and the allocator's statistics printed at exit), and with expandable segments;
#  2. an offline replay of a synthetic transformer training run on a 7 GiB device, with
#     PyTorch's default settings, then the same run under other settings side by side;
#  3. the same run on a smaller device: the out-of-memory report and the settings that fit.
# The stand-in runtime is the project's test double (tests/fake-cudart), not a GPU: the figures
# show what reaches the runtime, not GPU timings.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building (cargo build --release)"
cargo build --release --quiet
# Where cargo put the build (CARGO_TARGET_DIR or cargo's configuration may move it).
target="$(cargo metadata --no-deps --format-version 1 \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
lib="$target/release/libcachealloc.so"
cachealloc="$target/release/cachealloc"
for built in "$lib" "$cachealloc"; do
    [[ -f "$built" ]] || { echo "demo: the build left no $built" >&2; exit 1; }
done
work="$target/demo"
cudart="$(scripts/build-fake-cudart.sh "$work/fake-cudart")"
libdir="$(dirname "$cudart")"
"${CC:-gcc}" -O2 -std=gnu11 -I tests/fake-cudart/include scripts/demo/solver.c \
    -L "$libdir" -lcudart -Wl,-rpath,"$libdir" -o "$work/solver"

echo
echo "== 1a. an iterative solver calling cudaMalloc/cudaFree every step, as it is"
"$work/solver"

echo
echo "== 1b. the same binary under LD_PRELOAD=$lib"
echo "       (CACHEALLOC_CONF=stats:text prints the allocator's statistics at exit)"
CACHEALLOC_CONF=stats:text LD_PRELOAD="$lib" "$work/solver"
echo "       (Active but not Allocated at exit: blocks the program freed whose reuse waits, under"
echo "       the default free_sync:device, for the next device synchronization; not a leak.)"
echo
echo "== 1c. the same with CACHEALLOC_CONF=expandable_segments:True: pages mapped with the"
echo "       driver's virtual-memory calls (the stand-in's libcuda.so.1) instead of cudaMalloc"
CACHEALLOC_CONF=expandable_segments:True LD_PRELOAD="$lib" "$work/solver"

echo
echo "== 2. offline: replay a synthetic transformer training run on a 7 GiB device"
echo "       $cachealloc synth transformer --capacity 7GiB"
"$cachealloc" synth transformer --capacity 7GiB | sed -n '1,6p'
echo "       ... and the same run under other settings (--conf), to compare before a GPU run:"
for conf in max_split_size_mb:256 roundup_power2_divisions:4 expandable_segments:True; do
    printf '  %-28s' "$conf"
    "$cachealloc" synth transformer --capacity 7GiB --conf "$conf" \
        | sed -n 's/^  peak allocated.*| \(peak reserved [^|]*\)|.*/\1|/p; s/^  device calls: //p' \
        | paste -sd' '
done
echo
echo "== 3. the same run on a 5800 MiB (5.66 GiB) device: the out-of-memory report, and the"
echo "       settings that fit, each verified by replaying"
"$cachealloc" synth transformer --capacity 5800MiB | sed -n '/^First out-of-memory/,$p'
echo
echo "Next: replay your own PyTorch snapshot with $cachealloc replay snapshot.pickle"
echo "(see README.md), or run your program with LD_PRELOAD=$lib"
