#!/usr/bin/env bash
# Runs the shim's threaded, fork, exit, two-device, capture and cudaFreeAsync test programs
# (tests/preload) under ThreadSanitizer (`thread`) or AddressSanitizer with LeakSanitizer
# (`address`), against the fake runtime.
# Needs the nightly toolchain with rust-src (`rustup +nightly component add rust-src`) and gcc.
#
# The library is built with `-Zsanitizer=KIND -Zbuild-std` into target/sanitize/KIND; it leaves
# the sanitizer's functions undefined, for the program to provide. The programs are compiled
# with gcc's instrumentation but linked with the Rust toolchain's own (LLVM) sanitizer runtime,
# whole and exported (-rdynamic): gcc's libtsan lacks `__tsan_memcpy` and its kin, which rustc's
# instrumentation calls. They link the library ahead of the runtime instead of preloading it,
# which resolves the CUDA calls the same way (each library kept, --no-as-needed, as a preloaded
# one would be, though the program calls nothing of the runtime's directly): a preloaded
# library would be loaded into the sanitizer's symbolizer too, which has no runtime for it.
# Each run's output is kept in target/sanitize/KIND/run/NAME.out. Prints each run and exits 1
# when a sanitizer reported anything or a program failed. Takes a few minutes (the first build
# of the standard library most of it).
# Usage: scripts/sanitize.sh thread|address
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
kind="${1:-}"
case "$kind" in
thread) report='WARNING: ThreadSanitizer' options_var=TSAN_OPTIONS options='halt_on_error=0' ;;
address) report='ERROR: (Address|Leak)Sanitizer' options_var=ASAN_OPTIONS options='detect_leaks=1' ;;
*)
    echo "usage: scripts/sanitize.sh thread|address (the sanitizer to run the programs under)" >&2
    exit 2
    ;;
esac
dir="$root/target/sanitize/$kind"
triple=x86_64-unknown-linux-gnu
runtime="$(rustc +nightly --print sysroot)/lib/rustlib/$triple/lib/librustc-nightly_rt.${kind:0:1}san.a"
if [[ ! -f "$runtime" ]]; then
    echo "no $runtime: the nightly toolchain is needed (rustup toolchain install nightly)" >&2
    exit 2
fi

(cd "$root" && CARGO_TARGET_DIR="$dir/cargo" RUSTFLAGS="-Zsanitizer=$kind" \
    cargo +nightly build -Zbuild-std --target "$triple" --lib)
lib_dir="$dir/cargo/$triple/debug"
fake="$("$root/scripts/build-fake-cudart.sh" "$dir/fake")"
fake_dir="$(dirname "$fake")"

bin="$dir/bin"
mkdir -p "$bin"
# compile NAME [LINK_FLAGS...]: tests/preload/NAME.c into $bin/NAME.
compile() {
    local name="$1"
    shift
    gcc -std=gnu11 -g -O1 -pthread "-fsanitize=$kind" -fno-omit-frame-pointer \
        -I "$root/tests/fake-cudart/include" -I "$root/include" \
        -c -o "$bin/$name.o" "$root/tests/preload/$name.c"
    gcc -o "$bin/$name" "$bin/$name.o" -rdynamic -Wl,--no-as-needed -Wl,--whole-archive \
        "$runtime" -Wl,--no-whole-archive -lpthread -ldl -lm -lrt "$@" \
        -L "$fake_dir" -lcudart "-Wl,-rpath,$fake_dir"
}
gcc -shared -fPIC -g -I "$root/tests/fake-cudart/include" -o "$bin/libslow_malloc.so" \
    "$root/tests/preload/slow_malloc.c" -ldl
cachealloc=(-L "$lib_dir" -lcachealloc "-Wl,-rpath,$lib_dir")
for name in stress shim_check trace_mix fork_locks fork_race fork_log c_api_check \
    torch_hooks_check expandable_check capture_check free_async_check; do
    compile "$name" "${cachealloc[@]}"
done
# The slow cudaMalloc between the library and the runtime, as preloaded after the library.
compile exit_busy_pool "${cachealloc[@]}" -L "$bin" -lslow_malloc "-Wl,-rpath,$bin"
compile multi_device "${cachealloc[@]}" -L "$bin" -lslow_malloc "-Wl,-rpath,$bin"

run_dir="$dir/run"
rm -rf "$run_dir"
mkdir -p "$run_dir"
record="trace:$run_dir/trace-%p.jsonl,stats:json,stats_file:$run_dir/stats-%p.json"
failed=0
# check NAME [VAR=VALUE...] PROGRAM ARGS...: run one program, its output in $run_dir/NAME.out.
check() {
    local name="$1" rc=0 found
    shift
    env "$options_var=$options" "$@" >"$run_dir/$name.out" 2>&1 || rc=$?
    found="$(grep -cE "$report" "$run_dir/$name.out" || true)"
    printf '%-24s exit %d, %d reports\n' "$name" "$rc" "$found"
    if [[ "$rc" != 0 || "$found" != 0 ]]; then
        failed=1
    fi
}
for free_sync in device event none; do
    check "stress-$free_sync" CACHEALLOC_CONF="free_sync:$free_sync,stats:text" "$bin/stress" 3000
done
check stress-trace CACHEALLOC_CONF="$record" "$bin/stress" 2000
check stress-gc CACHEALLOC_CONF="garbage_collection_threshold:0.5,per_process_memory_fraction:0.05,count_cached_as_free:True" \
    "$bin/stress" 3000
check shim-threads CACHEALLOC_CONF="$record" "$bin/shim_check" threads
check shim-fork CACHEALLOC_CONF="$record" "$bin/shim_check" fork
check trace-mix CACHEALLOC_CONF="$record" FAKECUDART_CAPACITY=1GiB "$bin/trace_mix" mix
check trace-busy-exit CACHEALLOC_CONF="$record" FAKECUDART_CAPACITY=1GiB "$bin/trace_mix" busy_exit
check fork-locks CACHEALLOC_CONF="count_cached_as_free:True,trace:$run_dir/locks-%p.jsonl" \
    "$bin/fork_locks" 50
check fork-race CACHEALLOC_CONF=stats:json,stats_file:/dev/null "$bin/fork_race"
check fork-log CACHEALLOC_LOG=debug "$bin/fork_log" 50
check exit-busy-pool \
    SLOW_MALLOC_BYTES=$((256 << 20)) CACHEALLOC_CONF=stats:text "$bin/exit_busy_pool" $((256 << 20))
for free_sync in device event none; do
    check "two-devices-$free_sync" CACHEALLOC_CONF="free_sync:$free_sync" \
        "$bin/multi_device" threads_own_devices
done
check two-devices-busy-free SLOW_MALLOC_BYTES=$((256 << 20)) \
    "$bin/multi_device" free_while_other_device_busy
check c-api CACHEALLOC_CONF="stats:json,stats_file:$run_dir/c-api.json" \
    "$bin/c_api_check" "$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)"
check torch-hooks CACHEALLOC_CONF="$record" "$bin/torch_hooks_check" contract
check expandable CACHEALLOC_CONF="expandable_segments:True,$record" "$bin/expandable_check" grow
for free_sync in device event; do
    check "capture-$free_sync" CACHEALLOC_CONF="free_sync:$free_sync" "$bin/capture_check" pending_free
    check "capture-freed-before-$free_sync" CACHEALLOC_CONF="free_sync:$free_sync" \
        "$bin/capture_check" freed_before
done
check capture-other-thread CACHEALLOC_CONF=free_sync:device "$bin/capture_check" other_thread
check capture-oom CACHEALLOC_CONF=free_sync:none FAKECUDART_CAPACITY=64MiB "$bin/capture_check" oom
check capture-reset CACHEALLOC_CONF=free_sync:device "$bin/capture_check" reset
check capture-direct-malloc "$bin/capture_check" direct_malloc
check capture-deferred-refused "$bin/capture_check" deferred_refused
check capture-deferred-fails CACHEALLOC_CONF=free_sync:event \
    "$bin/capture_check" deferred_fence_create_fails_again
for scenario in stream_ordered per_thread capturing; do
    check "free-async-$scenario" CACHEALLOC_CONF="$record" "$bin/free_async_check" "$scenario"
done
if [[ "$failed" != 0 ]]; then
    echo "sanitize $kind: a program failed or the sanitizer reported (outputs in $run_dir)" >&2
    exit 1
fi
echo "sanitize $kind: no reports"
