#!/usr/bin/env bash
# The checks that need a GPU, printed as one table. Each row is a measured figure or
# "not run: <reason>"; the last column says what it was measured on.
#
#   scripts/gpu-check.sh [--dry-run] [--lib PATH]
#
#   (a) cudaMalloc/cudaFree pairs (1 KiB, 1 MiB, 64 MiB) without and with
#       LD_PRELOAD=libcachealloc.so: time per pair and the speedup;
#   (b) a small PyTorch training loop: PyTorch's own caching vs PYTORCH_NO_CUDA_MEMORY_CACHING=1
#       alone vs the same under the shim: step time and peak reserved memory;
#   (c) the same loop with cachealloc's pluggable allocator (CUDAPluggableAllocator), then a
#       tensor read on a busy side stream, recorded (Tensor.record_stream) and freed: its block
#       must not be zeroed under the read; and a 1 PiB tensor must raise;
#   (d) out of memory under the shim: allocate until cudaMalloc answers 2, then free and go on;
#   (e) the same with expandable_segments:True, every chunk written with cudaMemset: the pages
#       come from the driver's virtual-memory calls (counted in the library's device log);
#   (f) sharing memory with another process: the IPC handle of a segment's first block opens, in
#       a child process, on that block's bytes; a block further inside is refused (1);
#   (g) another device's memory copied to and from the host while device 0 is current, with
#       fixed and with expandable segments (needs two GPUs; the fake runtime models two);
#   (h) the run of (e), recorded with trace:PATH, replayed with `cachealloc replay --faithful`:
#       every allocation at its recorded address, the same peak, page maps, retries and OOM, with the
#       device memory the recording names (on the fake runtime, a 300 MiB context holds part);
#   (i) a quarter of the device set as the limit at run time (cachealloc_set_memory_fraction,
#       found with dlsym under LD_PRELOAD), then the allocations of (d): they stop at the limit;
#   (j) PyTorch's torch.cuda.set_per_process_memory_fraction(0.25, 0) and torch.cuda.empty_cache()
#       through the pluggable allocator's hooks (set_memory_fraction_fn, set_reset_fn): 64 MiB
#       tensors until one raises "CUDA out of memory.", holding at most the fraction and within
#       two tensors of it; freed, then empty_cache gives what was held back to the driver
#       (torch.cuda.mem_get_info's free memory before and after);
#   (k) cudaDeviceReset with expandable_segments:True under the shim: chunks written, every other
#       one freed, the reset: the free memory cudaMemGetInfo reports is back at its start (the
#       reset does not free the driver's virtual-memory pages; cachealloc releases them first),
#       and the next allocation is served and written;
#   (l) a CUDA graph capture under the shim: a cudaMalloc during the capture (the capture mode
#       relaxed, as PyTorch's caching allocator makes it) after a cudaFree the pool keeps pending
#       (completed by the synchronization the shim makes as the capture begins), and with the
#       shim a second one after a free made during the capture, which stays pending; without
#       and with the shim: the capture must end with a graph; and, with torch on a GPU,
#       torch.cuda.graph with libcachealloc.so preloaded under PyTorch's own allocator, replayed
#       and compared with the eager result;
#   (m) cudaFreeAsync of memory cudaMalloc gave: two 1 MiB blocks (with the shim, one segment),
#       the first freed with cudaFreeAsync on a stream, the second read back intact; then freed on
#       a capturing stream, which the shim refuses (1) with the capture going on; without the shim
#       the runtime's own answers are the row's figures.
#
# Without a GPU (no working nvidia-smi), or with --dry-run, every helper is built and run against
# the project's fake CUDA runtime (tests/fake-cudart) so the plumbing is exercised; those rows
# say "fake runtime (not a GPU measurement)". PyTorch rows then use a torch-free stand-in with
# the same allocation pattern (row (j)'s also on a GPU without torch: a C++ program calling the
# hooks as PyTorch does, since a failed cachealloc_torch_malloc throws a C++ exception).
#
# The library is --lib PATH, else $CACHEALLOC_LIB, else target/release/libcachealloc.so built
# with `cargo build --release --lib --bin cachealloc`; the CLI (row h) is $CACHEALLOC_CLI, else
# the `cachealloc` beside the library. The real runtime is $CACHEALLOC_REAL_CUDART, else the one in
# .venv (scripts/setup-test-deps.sh), else one the dynamic linker knows (ldconfig) or torch's.
# The whole run is bounded by $GPU_CHECK_BUDGET seconds (default 300).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helpers="$root/scripts/gpu-check"
work="$root/target/gpu-check"
budget_s="${GPU_CHECK_BUDGET:-300}"
deadline=$((SECONDS + budget_s))

readonly PAIRS=2000                              # timed malloc/free pairs per size
readonly SIZES=(1024 1048576 67108864)           # 1 KiB, 1 MiB, 64 MiB
readonly OOM_CHUNK_GPU=$((1 << 30))              # 1 GiB per cudaMalloc in the OOM check
readonly OOM_CHUNK_FAKE=$((64 << 20))            # 64 MiB, with a 1 GiB fake device
readonly OOM_MAX_CHUNKS=4096
readonly HOOKS_FRACTION=0.25                     # row (j): the fraction of device 0 set
readonly TENSOR_BYTES=$((64 << 20))              # one tensor of row (j)
readonly RESET_CHUNK_GPU=$((256 << 20))          # row (k): 8 chunks of 256 MiB on a GPU
readonly RESET_CHUNK_FAKE=$((64 << 20))          # 64 MiB, with a 1 GiB fake device
readonly RESET_CHUNKS=8
readonly RESET_MARGIN=$((32 << 20))              # free memory after the reset vs at the start
readonly CAPTURE_BYTES=$((64 << 20))             # row (l): freed, then allocated in the capture
readonly FREE_ASYNC_BYTES=$((1 << 20))           # row (m): two blocks, one 2 MiB segment

dry_run=0
lib="${CACHEALLOC_LIB:-}"
while (($#)); do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --lib) lib="${2:?--lib needs a path}"; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (allowed: --dry-run, --lib PATH)" >&2; exit 2 ;;
    esac
    shift
done

mkdir -p "$work"
note() { printf 'gpu-check: %s\n' "$*" >&2; }

# --- the table ---------------------------------------------------------------------------------

rows=()
row() { rows+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"); }   # check, variant, result, measured on
print_table() {
    local r
    printf '| %s | %s | %s | %s |\n' check variant result "measured on"
    printf '|---|---|---|---|\n'
    for r in "${rows[@]}"; do
        IFS=$'\t' read -r c v res on <<<"$r"
        printf '| %s | %s | %s | %s |\n' "$c" "$v" "$res" "$on"
    done
}
trap print_table EXIT

# Runs a helper under what is left of the budget (at most $1 seconds). Its output is in $out;
# the return code is the helper's, 124 on time-out, 125 when no budget is left.
out=""
bounded() {
    local limit=$1 left=$((deadline - SECONDS - 5))
    shift
    ((left < limit)) && limit=$left
    if ((limit <= 0)); then out="time budget of ${budget_s}s spent"; return 125; fi
    local rc=0
    out="$(timeout --kill-after=5 "$limit" "$@" 2>"$work/last-stderr")" || rc=$?
    ((rc == 124)) && out="timed out after ${limit}s"
    return "$rc"
}
why_failed() {   # a one-line reason from the helper's output or stderr
    local text="${out:-$(tail -n 1 "$work/last-stderr")}"
    printf '%s' "${text//$'\n'/; }" | cut -c1-160
}
# "FAILED: <why>" after a helper's failure RC, or "not run: ..." when no time was left to run it.
failed() {
    if (($1 == 125)); then printf 'not run: %s' "$out"; else printf 'FAILED: %s' "$(why_failed)"; fi
}

# --- environment: GPU or fake runtime ------------------------------------------------------------

gpu_name=""
if ((!dry_run)) && command -v nvidia-smi >/dev/null 2>&1; then
    gpu_name="$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
fi
if [[ -n "$gpu_name" ]]; then
    on="GPU: $gpu_name"
else
    ((dry_run)) || note "no GPU (nvidia-smi absent or shows none): running against the fake runtime"
    on="fake runtime (not a GPU measurement)"
fi

# Finds the real libcudart for the C programs: the variable, .venv, ldconfig, torch's wheel.
find_real_cudart() {
    local c
    if [[ -n "${CACHEALLOC_REAL_CUDART:-}" ]]; then printf '%s\n' "$CACHEALLOC_REAL_CUDART"; return; fi
    for c in "$root"/.venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12; do
        [[ -f "$c" ]] && { printf '%s\n' "$c"; return; }
    done
    c="$(ldconfig -p 2>/dev/null | awk '/libcudart\.so\.[0-9]+ /{print $NF; exit}')"
    [[ -n "$c" ]] && { printf '%s\n' "$c"; return; }
    python3 - 2>/dev/null <<'EOF' || true
import glob, os, nvidia
for d in nvidia.__path__:
    for f in sorted(glob.glob(os.path.join(d, "*", "lib", "libcudart.so.*"))):
        print(f); raise SystemExit
EOF
}

# The fake runtime (tests/fake-cudart), rebuilt when its sources change.
build_fake_cudart() {
    "$root/scripts/build-fake-cudart.sh" "$work/fake-cudart"
}

cudart=""
if [[ -n "$gpu_name" ]]; then
    cudart="$(find_real_cudart)"
    [[ -n "$cudart" && -f "$cudart" ]] || cudart=""
else
    cudart="$(build_fake_cudart)" || { note "building the fake runtime failed"; cudart=""; }
fi
# The fake device: 16 GiB for timing, 1 GiB for the OOM check (see its README).
export FAKECUDART_DEVICES=1 FAKECUDART_CAPACITY=16GiB

# --- the library -------------------------------------------------------------------------------

lib_problem=""
if [[ -z "$lib" ]]; then
    lib="$root/target/release/libcachealloc.so"
    if command -v cargo >/dev/null 2>&1; then
        note "cargo build --release --lib --bin cachealloc"
        if ! (cd "$root" && cargo build --release --lib --bin cachealloc --quiet); then
            # A machine without network cannot fetch crates: a library built before still serves.
            if [[ -f "$lib" ]]; then
                note "cargo build --release --lib --bin cachealloc failed; using the library (and CLI) already built beside $lib"
            else
                lib_problem="cargo build --release --lib --bin cachealloc failed (build it elsewhere and pass --lib PATH)"
            fi
        fi
    fi
fi
[[ -z "$lib_problem" && ! -f "$lib" ]] && lib_problem="no $lib (cargo not found to build it; pass --lib PATH)"
exports=""
if [[ -z "$lib_problem" ]]; then
    exports="$(nm -D --defined-only "$lib" 2>/dev/null | awk '{print $NF}')" ||
        lib_problem="nm -D $lib failed (binutils missing?)"
fi
shim_problem="$lib_problem"
if [[ -z "$shim_problem" ]] && ! grep -qx cudaMalloc <<<"$exports"; then
    shim_problem="libcachealloc.so exports no cudaMalloc"
fi
pluggable_problem="$lib_problem"
if [[ -z "$pluggable_problem" ]] && ! grep -qx cachealloc_torch_malloc <<<"$exports"; then
    pluggable_problem="libcachealloc.so exports no cachealloc_torch_malloc"
fi

# --- helper programs ---------------------------------------------------------------------------

build_problem=""
if [[ -z "$cudart" ]]; then
    build_problem="no libcudart (GPU: set CACHEALLOC_REAL_CUDART or run scripts/setup-test-deps.sh; no GPU: the fake runtime did not build)"
elif ! command -v gcc >/dev/null 2>&1; then
    build_problem="gcc not found"
else
    for prog in malloc_loop oom_check ipc_check cross_device reset_check graph_capture \
        free_async; do
        gcc -std=gnu11 -O2 -Wall -Wextra -o "$work/$prog" "$helpers/$prog.c" \
            -L "$(dirname "$cudart")" -l:"$(basename "$cudart")" -ldl \
            -Wl,-rpath,"$(dirname "$cudart")" 2>"$work/last-stderr" ||
            build_problem="compiling $prog.c failed: $(tail -n 1 "$work/last-stderr")"
    done
fi

# The C++ stand-in of row (j): a C++ exception is how the pluggable allocator's malloc fails.
cxx_problem="$build_problem"
if [[ -z "$cxx_problem" ]] && ! command -v g++ >/dev/null 2>&1; then
    cxx_problem="g++ not found"
elif [[ -z "$cxx_problem" ]]; then
    g++ -std=c++17 -O2 -Wall -Wextra -o "$work/fraction_hooks" "$helpers/fraction_hooks.cpp" \
        -L "$(dirname "$cudart")" -l:"$(basename "$cudart")" -ldl \
        -Wl,-rpath,"$(dirname "$cudart")" 2>"$work/last-stderr" ||
        cxx_problem="compiling fraction_hooks.cpp failed: $(tail -n 1 "$work/last-stderr")"
fi

fmt_us() { awk -v ns="$1" 'BEGIN { printf "%.2f µs", ns / 1000 }'; }
fmt_bytes() {
    awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'
}
size_name() { case "$1" in 1024) echo "1 KiB" ;; 1048576) echo "1 MiB" ;; 67108864) echo "64 MiB" ;; *) echo "$1 B" ;; esac; }

# --- (a) cudaMalloc/cudaFree pairs ----------------------------------------------------------------

# ns per pair of one run, keyed by size, in the associative array named $1.
loop_times() {
    local -n times=$1
    shift
    local line
    while read -r line; do
        [[ "$line" =~ ^size=([0-9]+)\ pairs=[0-9]+\ ns_per_pair=([0-9.]+) ]] &&
            times[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
    done <<<"$out"
}

per_pair() {   # NS REASON: the figure, or why there is none
    if [[ -n "$1" ]]; then printf '%s per pair' "$(fmt_us "$1")"; else printf 'not run: %s' "${2:-no figure printed}"; fi
}

declare -A plain_ns=() shim_ns=()
plain_failed="" shim_failed=""
if [[ -n "$build_problem" ]]; then
    plain_failed="$build_problem"
elif bounded 60 env -u LD_PRELOAD "$work/malloc_loop" "$PAIRS" "${SIZES[@]}"; then
    loop_times plain_ns
else
    plain_failed="$(why_failed)"
fi
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    shim_failed="${build_problem:-$shim_problem}"
elif bounded 60 env LD_PRELOAD="$lib" "$work/malloc_loop" "$PAIRS" "${SIZES[@]}"; then
    loop_times shim_ns
else
    shim_failed="$(why_failed)"
fi
for size in "${SIZES[@]}"; do
    check="(a) cudaMalloc+cudaFree $(size_name "$size")"
    p="${plain_ns[$size]:-}" s="${shim_ns[$size]:-}"
    row "$check" "no shim ($PAIRS pairs)" "$(per_pair "$p" "$plain_failed")" "$on"
    row "$check" "LD_PRELOAD shim" "$(per_pair "$s" "$shim_failed")" "$on"
    if [[ -n "$p" && -n "$s" ]]; then
        row "$check" "speedup" "$(awk -v p="$p" -v s="$s" 'BEGIN { printf "%.1f×", p / s }')" "$on"
    else
        row "$check" "speedup" "not run: needs both timings" "$on"
    fi
done

# --- (b), (c) the training loop ---------------------------------------------------------------

standin=""
if [[ -n "$gpu_name" ]]; then
    train_args=(--backend torch)
else
    standin=" (torch-free stand-in)"
    # The torch-free stand-in, with fewer and smaller steps: its figures mean nothing anyway.
    train_args=(--backend ctypes --cudart "$cudart" --steps 10 --warmup 2 --width 256)
fi

# train VARIANT CHECK ALLOCATOR PROBLEM [ENV=VALUE...]: one row.
train() {
    local check=$1 variant=$2 allocator=$3 problem=$4
    shift 4
    if [[ -n "$problem" ]]; then row "$check" "$variant" "not run: $problem" "$on"; return; fi
    if ! command -v python3 >/dev/null 2>&1; then row "$check" "$variant" "not run: python3 not found" "$on"; return; fi
    local stats="$work/stats-$allocator-$RANDOM.json"
    rm -f "$stats"
    local extra=()
    [[ "$allocator" == pluggable ]] && extra=(--shim "$lib")
    if ! bounded 120 env "$@" CACHEALLOC_CONF="stats:json,stats_file:$stats" \
        python3 "$helpers/train_step.py" "${train_args[@]}" --allocator "$allocator" "${extra[@]}"; then
        row "$check" "$variant" "not run: $(why_failed)" "$on"
        return
    fi
    if [[ "$out" =~ NOT_RUN\ (.*) ]]; then
        row "$check" "$variant" "not run: ${BASH_REMATCH[1]}" "$on"
    elif [[ "$out" =~ RESULT\ step_ms=([0-9.]+)\ peak_reserved=([0-9a-z]+)\ loss=([-0-9.e+a-z]+) ]]; then
        local ms=${BASH_REMATCH[1]} peak=${BASH_REMATCH[2]} loss=${BASH_REMATCH[3]} reserved same
        if [[ "$peak" != none ]]; then
            reserved="peak reserved $(fmt_bytes "$peak")"
        elif [[ "$allocator" == pluggable || "$*" == *LD_PRELOAD=* ]]; then
            peak="$(python3 "$helpers/peak_reserved.py" "$stats")"
            reserved="peak reserved $(fmt_bytes "$peak") (cachealloc stats)"
            [[ "$peak" == none ]] && reserved="peak reserved not reported (no cachealloc stats file)"
        else
            reserved="peak reserved not tracked (no caching layer)"
        fi
        # The last step's loss against PyTorch's own allocator's (same seeds, deterministic
        # kernels): a block handed out while a kernel still used it would change it.
        same=""
        if [[ "$loss" != none && "$allocator" == native ]]; then
            native_loss=$loss
        elif [[ "$loss" != none && -n "$native_loss" ]]; then
            if [[ "$loss" == "$native_loss" ]]; then
                same=", last loss $loss as with PyTorch's own allocator"
            else
                same=", DIFFERENT last loss $loss (PyTorch's own allocator: $native_loss)"
            fi
        fi
        row "$check" "$variant" "step ${ms} ms (median), $reserved$same" "$on"
    else
        row "$check" "$variant" "not run: no result line ($(why_failed))" "$on"
    fi
}

torch_check="(b) training loop"
native_loss=""
# On a GPU the training rows run PyTorch itself and need neither gcc nor a libcudart of ours;
# without one they stand in with the C helpers.
train_problem="$build_problem"
[[ -n "$gpu_name" ]] && train_problem=""
if [[ -n "$gpu_name" ]]; then
    train "$torch_check" "PyTorch's own caching" native "" -u LD_PRELOAD
else
    row "$torch_check" "PyTorch's own caching" "not run: needs torch on a GPU" "$on"
fi
train "$torch_check" "PYTORCH_NO_CUDA_MEMORY_CACHING=1, no shim$standin" uncached "$train_problem" \
    -u LD_PRELOAD PYTORCH_NO_CUDA_MEMORY_CACHING=1
train "$torch_check" "PYTORCH_NO_CUDA_MEMORY_CACHING=1 + LD_PRELOAD shim$standin" uncached \
    "${train_problem:-$shim_problem}" LD_PRELOAD="$lib" PYTORCH_NO_CUDA_MEMORY_CACHING=1
train "(c) pluggable allocator" "CUDAPluggableAllocator(cachealloc_torch_malloc)$standin" pluggable \
    "${train_problem:-$pluggable_problem}" -u LD_PRELOAD

# --- (d) out of memory under the shim -----------------------------------------------------------

oom_check="(d) OOM under the shim"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$oom_check" "allocate until 2, free, continue" "not run: ${build_problem:-$shim_problem}" "$on"
else
    chunk=$OOM_CHUNK_GPU
    [[ -z "$gpu_name" ]] && chunk=$OOM_CHUNK_FAKE
    if bounded 120 env LD_PRELOAD="$lib" FAKECUDART_CAPACITY=1GiB "$work/oom_check" "$chunk" "$OOM_MAX_CHUNKS" &&
        [[ "$out" =~ chunks=([0-9]+)\ oom_rc=2\ last_error=2 ]]; then
        row "$oom_check" "allocate until 2, free, continue" \
            "cudaMalloc answered 2 after ${BASH_REMATCH[1]} × $(fmt_bytes "$chunk"), cudaGetLastError 2 as the runtime's own; freed and allocated again: ok" "$on"
    else
        row "$oom_check" "allocate until 2, free, continue" "$(failed $?)" "$on"
    fi
fi

# --- (e) expandable segments under the shim ----------------------------------------------------

expandable_check="(e) expandable segments"
expandable_rc=0
trace_dir="$work/trace-e"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$expandable_check" "allocate and write until 2, free, continue" "not run: ${build_problem:-$shim_problem}" "$on"
else
    chunk=$OOM_CHUNK_GPU
    [[ -z "$gpu_name" ]] && chunk=$OOM_CHUNK_FAKE
    rm -rf "$trace_dir" && mkdir -p "$trace_dir"
    # Recorded for (h); on the fake runtime a context holds part of the device, as on a GPU.
    if bounded 120 env LD_PRELOAD="$lib" FAKECUDART_CAPACITY=1GiB FAKECUDART_CONTEXT=300MiB \
        CACHEALLOC_CONF="expandable_segments:True,trace:$trace_dir/run-%p.jsonl" \
        CACHEALLOC_LOG=cachealloc::device=debug \
        "$work/oom_check" "$chunk" "$OOM_MAX_CHUNKS" touch &&
        [[ "$out" =~ chunks=([0-9]+)\ oom_rc=2\ last_error=2 ]]; then
        chunks=${BASH_REMATCH[1]}
        maps=$(grep -c ': map ' "$work/last-stderr" || true)
        mallocs=$(grep -c ': cudaMalloc ' "$work/last-stderr" || true)
        if ((maps > 0 && mallocs == 0)); then
            row "$expandable_check" "allocate and write until 2, free, continue" \
                "$chunks × $(fmt_bytes "$chunk") written, then 2; $maps page maps, no cudaMalloc; freed and allocated again: ok" "$on"
        else
            row "$expandable_check" "allocate and write until 2, free, continue" \
                "FAILED: $maps page maps and $mallocs cudaMalloc in the device log (expandable segments not used: $(grep -m1 'expandable' "$work/last-stderr" | cut -c1-120))" "$on"
        fi
    else
        expandable_rc=$?
        row "$expandable_check" "allocate and write until 2, free, continue" "$(failed $expandable_rc)" "$on"
    fi
fi

# --- (f) IPC handles under the shim ------------------------------------------------------------

ipc_check="(f) IPC handles"
ipc_variant="first block of a segment, and one 4 KiB inside it"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$ipc_check" "$ipc_variant" "not run: ${build_problem:-$shim_problem}" "$on"
elif bounded 60 env -u CACHEALLOC_DISABLE LD_PRELOAD="$lib" CACHEALLOC_CONF= "$work/ipc_check" &&
    [[ "$out" =~ first_rc=0\ second_rc=1\ second_offset=4096($|[^0-9]) ]]; then
    case "$out" in
    *"opened byte=0x11"*) opened="opened in a child process on the first block's bytes (0x11)" ;;
    *"open unsupported"*) opened="opening in a child process not run (the runtime has no cudaIpcOpenMemHandle)" ;;
    *"opened rc="*) opened="the child's cudaIpcOpenMemHandle answered ${out##*opened rc=} (the runtime's own answer)" ;;
    *) opened="" ;;
    esac
    if [[ -n "$opened" ]]; then
        row "$ipc_check" "$ipc_variant" "first: handle made, $opened; inside: 1, refused" "$on"
    else
        row "$ipc_check" "$ipc_variant" "FAILED: the child found $(why_failed)" "$on"
    fi
else
    row "$ipc_check" "$ipc_variant" "$(failed $?)" "$on"
fi

# --- (g) another device's memory under the shim --------------------------------------------------

cross_check="(g) another device's memory"
for segments in fixed expandable; do
    variant="device 1's block copied to and from the host with device 0 current, $segments segments"
    conf=""
    [[ $segments == expandable ]] && conf="expandable_segments:True"
    if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
        row "$cross_check" "$variant" "not run: ${build_problem:-$shim_problem}" "$on"
    elif bounded 60 env -u CACHEALLOC_DISABLE LD_PRELOAD="$lib" FAKECUDART_DEVICES=2 CACHEALLOC_CONF="$conf" \
        "$work/cross_device"; then
        if [[ "$out" =~ d2h_rc=([0-9]+)\ byte=(0x[0-9a-f]+)\ h2d_rc=([0-9]+) ]]; then
            row "$cross_check" "$variant" \
                "to host: ${BASH_REMATCH[1]} (first byte ${BASH_REMATCH[2]}, 0x33 when read), from host: ${BASH_REMATCH[3]}" "$on"
        elif [[ "$out" =~ devices=([0-9]+) ]]; then
            row "$cross_check" "$variant" "not run: needs two devices, found ${BASH_REMATCH[1]}" "$on"
        else
            row "$cross_check" "$variant" "FAILED: $(why_failed)" "$on"
        fi
    else
        row "$cross_check" "$variant" "$(failed $?)" "$on"
    fi
done

# --- (h) the recording of (e) replayed faithfully -------------------------------------------------

replay_check="(h) recording replayed faithfully"
replay_variant="the run of (e), recorded with trace:PATH, then cachealloc replay --faithful"
cli="${CACHEALLOC_CLI:-$(dirname "$lib")/cachealloc}"
trace="$(ls "$trace_dir"/run-*.jsonl 2>/dev/null | head -n 1 || true)"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$replay_check" "$replay_variant" "not run: ${build_problem:-$shim_problem}" "$on"
elif [[ ! -x "$cli" ]]; then
    row "$replay_check" "$replay_variant" "not run: no cachealloc CLI at $cli (set CACHEALLOC_CLI)" "$on"
elif ! command -v python3 >/dev/null 2>&1; then
    row "$replay_check" "$replay_variant" "not run: python3 not found (it reads the replay's JSON)" "$on"
elif [[ -z "$trace" ]] && ((expandable_rc == 125)); then
    row "$replay_check" "$replay_variant" "not run: (e), whose recording it replays, was not run" "$on"
elif [[ -z "$trace" ]]; then
    row "$replay_check" "$replay_variant" "FAILED: (e) wrote no trace in $trace_dir" "$on"
else
    rc=0
    bounded 120 "$cli" replay "$trace" --faithful --json || rc=$?
    if ((rc != 0)); then
        row "$replay_check" "$replay_variant" "$(failed $rc)" "$on"
    else
        verdict="$(python3 "$helpers/faithful_verdict.py" <<<"$out")" ||
            verdict="FAILED: the replay's JSON could not be read"
        row "$replay_check" "$replay_variant" "$verdict" "$on"
    fi
fi

# --- (i) a memory fraction set at run time ------------------------------------------------------

fraction_check="(i) memory fraction set at run time"
fraction_variant="cachealloc_set_memory_fraction(0, 0.25), then allocate until 2"
fraction_problem="${build_problem:-$shim_problem}"
if [[ -z "$fraction_problem" ]] && ! grep -qx cachealloc_set_memory_fraction <<<"$exports"; then
    fraction_problem="libcachealloc.so exports no cachealloc_set_memory_fraction"
fi
if [[ -n "$fraction_problem" ]]; then
    row "$fraction_check" "$fraction_variant" "not run: $fraction_problem" "$on"
else
    chunk=$OOM_CHUNK_GPU
    [[ -z "$gpu_name" ]] && chunk=$OOM_CHUNK_FAKE
    if bounded 120 env LD_PRELOAD="$lib" FAKECUDART_CAPACITY=1GiB \
        "$work/oom_check" "$chunk" "$OOM_MAX_CHUNKS" fraction=0.25 &&
        [[ "$out" =~ limit=([0-9]+)\ chunks=([0-9]+)\ oom_rc=2 ]]; then
        limit=${BASH_REMATCH[1]} chunks=${BASH_REMATCH[2]}
        # Each chunk is its own segment of exactly its size: the pool stops at the last chunk
        # that keeps what it reserves within the limit.
        if ((chunks * chunk <= limit && limit < (chunks + 1) * chunk)); then
            row "$fraction_check" "$fraction_variant" \
                "cudaMalloc answered 2 after $chunks × $(fmt_bytes "$chunk"), within the limit of $(fmt_bytes "$limit"); freed and allocated again: ok" "$on"
        else
            row "$fraction_check" "$fraction_variant" \
                "FAILED: $chunks × $(fmt_bytes "$chunk") allocated under a limit of $(fmt_bytes "$limit")" "$on"
        fi
    else
        row "$fraction_check" "$fraction_variant" "$(failed $?)" "$on"
    fi
fi

# --- (j) PyTorch's memory fraction and empty_cache through the pluggable allocator's hooks ---------

hooks_check="(j) set_per_process_memory_fraction, empty_cache"
hooks_variant="pluggable allocator with its hooks: fraction $HOOKS_FRACTION of device 0, $(fmt_bytes "$TENSOR_BYTES") tensors until refused, freed, empty_cache()"
# What ran: torch or standin; else the row's result, "not run: ..." or "FAILED: ...".
hooks_ran="" torch_missing=""
if [[ -n "$pluggable_problem" ]]; then
    hooks_ran="not run: $pluggable_problem"
elif [[ -z "$gpu_name" ]]; then
    torch_missing="needs torch on a GPU"
elif ! command -v python3 >/dev/null 2>&1; then
    torch_missing="python3 not found"
else
    rc=0
    bounded 120 env -u LD_PRELOAD python3 "$helpers/fraction_hooks.py" "$lib" "$TENSOR_BYTES" "$HOOKS_FRACTION" || rc=$?
    if ((rc != 0)); then
        hooks_ran="$(failed "$rc")"
    elif [[ "$out" =~ NOT_RUN\ (.*) ]]; then
        torch_missing="${BASH_REMATCH[1]}"
    else
        hooks_ran=torch
    fi
fi
if [[ -n "$torch_missing" ]]; then
    # Without torch the hooks are called as PyTorch calls them, from C++.
    hooks_variant+=" (torch-free stand-in)"
    if [[ -n "$cxx_problem" ]]; then
        hooks_ran="not run: $cxx_problem (torch: $torch_missing)"
    else
        rc=0
        bounded 60 env -u LD_PRELOAD FAKECUDART_CAPACITY=1GiB "$work/fraction_hooks" "$lib" "$TENSOR_BYTES" "$HOOKS_FRACTION" || rc=$?
        if ((rc != 0)); then
            hooks_ran="$(failed "$rc")"
        elif [[ "$out" =~ NOT_RUN\ (.*) ]]; then
            hooks_ran="not run: ${BASH_REMATCH[1]} (torch: $torch_missing)"
        else
            hooks_ran=standin
        fi
    fi
fi
if [[ "$hooks_ran" != torch && "$hooks_ran" != standin ]]; then
    row "$hooks_check" "$hooks_variant" "$hooks_ran" "$on"
elif [[ "$out" =~ RESULT\ total=([0-9]+)\ chunk=([0-9]+)\ tensors=([0-9]+)\ refused=([01])\ free_before=([0-9]+)\ free_after=([0-9]+) ]]; then
    refusal="$(sed -n 's/^REFUSAL //p' <<<"$out" | head -n 1)"
    # The pool holds at most the fraction, and stops within two tensors of it (each tensor is a
    # segment of its own); the refusal is cachealloc's report; empty_cache gives back what was
    # held, to within one tensor.
    row "$hooks_check" "$hooks_variant" "$(awk -v total="${BASH_REMATCH[1]}" -v chunk="${BASH_REMATCH[2]}" \
        -v n="${BASH_REMATCH[3]}" -v refused="${BASH_REMATCH[4]}" -v before="${BASH_REMATCH[5]}" \
        -v after="${BASH_REMATCH[6]}" -v refusal="$refusal" -v fraction="$HOOKS_FRACTION" 'BEGIN {
        mib = 1048576; held = n * chunk; limit = fraction * total; rise = after - before
        if (!refused) bad = bad "; not refused as an exception (" substr(refusal, 1, 60) ")"
        else if (index(refusal, "CUDA out of memory.") != 1) bad = bad "; the refusal says \"" substr(refusal, 1, 60) "\""
        if (held > limit) bad = bad "; held more than the fraction"
        if (held + 2 * chunk <= limit) bad = bad "; refused more than two tensors below the fraction"
        if (rise - held > chunk || held - rise > chunk) bad = bad "; empty_cache gave back a different amount"
        printf "%srefused after %d × %.1f MiB: %.1f MiB, %.3f of %.1f MiB (limit %.1f MiB)%s; empty_cache: free %.1f → %.1f MiB (%+.1f MiB)",
            bad == "" ? "" : "FAILED: " substr(bad, 3) ": ", n, chunk / mib, held / mib, held / total,
            total / mib, limit / mib, refused ? ", \"CUDA out of memory.\"" : "", before / mib, after / mib, rise / mib
    }')" "$on"
else
    row "$hooks_check" "$hooks_variant" "FAILED: no result line ($(why_failed))" "$on"
fi

# --- (k) a device reset with expandable segments --------------------------------------------------

reset_check="(k) cudaDeviceReset, expandable segments"
chunk=$RESET_CHUNK_GPU
[[ -z "$gpu_name" ]] && chunk=$RESET_CHUNK_FAKE
reset_variant="$RESET_CHUNKS × $(fmt_bytes "$chunk") written, every other freed, cudaDeviceReset, then allocate again"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$reset_check" "$reset_variant" "not run: ${build_problem:-$shim_problem}" "$on"
elif bounded 60 env LD_PRELOAD="$lib" FAKECUDART_CAPACITY=1GiB CACHEALLOC_CONF=expandable_segments:True \
    CACHEALLOC_LOG=cachealloc::device=debug "$work/reset_check" "$chunk" "$RESET_CHUNKS" &&
    [[ "$out" =~ start_free=([0-9]+)\ chunks=[0-9]+\ freed=[0-9]+\ reset_rc=0\ reset_free=([0-9]+)\ again_rc=0 ]]; then
    start_free=${BASH_REMATCH[1]} reset_free=${BASH_REMATCH[2]}
    maps=$(grep -c ': map ' "$work/last-stderr" || true)
    mallocs=$(grep -c ': cudaMalloc ' "$work/last-stderr" || true)
    lost=$((start_free - reset_free))
    figures="free $(fmt_bytes "$start_free") at the start, $(fmt_bytes "$reset_free") after the reset"
    if ((maps == 0 || mallocs > 0)); then
        row "$reset_check" "$reset_variant" \
            "FAILED: $maps page maps and $mallocs cudaMalloc in the device log (expandable segments not used); $figures" "$on"
    elif ((lost > RESET_MARGIN)); then
        row "$reset_check" "$reset_variant" \
            "FAILED: $figures, $(fmt_bytes "$lost") not given back (allowed: $(fmt_bytes "$RESET_MARGIN")); $maps page maps" "$on"
    elif ((-lost > RESET_MARGIN)); then
        row "$reset_check" "$reset_variant" \
            "FAILED: $figures, $(fmt_bytes "$((-lost))") more than at the start (allowed: $(fmt_bytes "$RESET_MARGIN")): something else freed memory meanwhile?" "$on"
    else
        row "$reset_check" "$reset_variant" \
            "$figures; $maps page maps, no cudaMalloc; allocated and written again: ok" "$on"
    fi
else
    row "$reset_check" "$reset_variant" "$(failed $?)" "$on"
fi

# --- (l) a CUDA graph capture under the shim ---------------------------------------------------

capture_check="(l) CUDA graph capture"
capture_variant="$(fmt_bytes "$CAPTURE_BYTES") freed, then cudaMalloc in a global-mode capture with the mode relaxed (as PyTorch's allocator); with the shim, freed and allocated again in the capture"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$capture_check" "$capture_variant" "not run: ${build_problem:-$shim_problem}" "$on"
else
    results=()
    for preload in "" "$lib"; do
        rc=0
        bounded 60 env -u CACHEALLOC_DISABLE CACHEALLOC_CONF=free_sync:device LD_PRELOAD="$preload" \
            "$work/graph_capture" "$CAPTURE_BYTES" || rc=$?
        if ((rc == 0)) && [[ "$out" =~ begin_rc=0\ malloc_rc=0\ end_rc=0\ graph=1\ pending_rc=0 ]]; then
            results+=(captured)
        elif ((rc == 1)) && [[ "$out" =~ (begin_rc=[0-9]+\ malloc_rc=[0-9]+\ end_rc=[0-9]+\ graph=[01]\ pending_rc=[0-9]+) ]]; then
            results+=("FAILED: ${BASH_REMATCH[1]}")
        else
            results+=("$(failed "$rc")")
        fi
    done
    if [[ "${results[1]}" == "not run: "* ]]; then
        row "$capture_check" "$capture_variant" "${results[1]}" "$on"
    elif [[ "${results[0]}" == captured && "${results[1]}" == captured ]]; then
        row "$capture_check" "$capture_variant" "without the shim and with it: cudaStreamBeginCapture 0, cudaMalloc 0 (with the shim twice), cudaStreamEndCapture 0 with a graph: ok" "$on"
    elif [[ "${results[1]}" == captured ]]; then
        row "$capture_check" "$capture_variant" "with the shim: cudaStreamBeginCapture 0, cudaMalloc 0 twice, cudaStreamEndCapture 0 with a graph; without it (the runtime alone): ${results[0]}" "$on"
    else
        row "$capture_check" "$capture_variant" "FAILED with the shim: ${results[1]#FAILED: } (without it: ${results[0]})" "$on"
    fi
fi
torch_capture_variant="torch.cuda.graph of a 3-layer model with libcachealloc.so preloaded under PyTorch's own allocator, replayed on new input"
if [[ -n "$shim_problem" ]]; then
    row "$capture_check" "$torch_capture_variant" "not run: $shim_problem" "$on"
elif [[ -z "$gpu_name" ]]; then
    row "$capture_check" "$torch_capture_variant" "not run: needs torch on a GPU" "$on"
elif ! command -v python3 >/dev/null 2>&1; then
    row "$capture_check" "$torch_capture_variant" "not run: python3 not found" "$on"
else
    rc=0
    # PyTorch's own allocator in front, calling cudaMalloc (its expandable segments would not).
    bounded 180 env -u CACHEALLOC_DISABLE -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
        -u PYTORCH_NO_CUDA_MEMORY_CACHING CACHEALLOC_CONF=free_sync:device LD_PRELOAD="$lib" \
        python3 "$helpers/graph_capture.py" || rc=$?
    if ((rc != 0)); then
        row "$capture_check" "$torch_capture_variant" "$(failed "$rc")" "$on"
    elif [[ "$out" =~ NOT_RUN\ (.*) ]]; then
        row "$capture_check" "$torch_capture_variant" "not run: ${BASH_REMATCH[1]}" "$on"
    elif [[ "$out" =~ RESULT\ captured=1\ replay_matches=1\ max_abs_diff=([^ ]+) ]]; then
        row "$capture_check" "$torch_capture_variant" "captured and replayed; matches the eager result (max difference ${BASH_REMATCH[1]}): ok" "$on"
    elif [[ "$out" =~ RESULT\ (.*) ]]; then
        row "$capture_check" "$torch_capture_variant" "FAILED: ${BASH_REMATCH[1]}" "$on"
    else
        row "$capture_check" "$torch_capture_variant" "FAILED: no result line ($(why_failed))" "$on"
    fi
fi

# --- (m) cudaFreeAsync of cudaMalloc memory ------------------------------------------------------

free_async_check="(m) cudaFreeAsync"
free_async_variant="two $(fmt_bytes "$FREE_ASYNC_BYTES") blocks from cudaMalloc: the first freed with cudaFreeAsync on a stream, the second read back, then freed on a capturing stream"
free_async_want="free_rc=0 sync_rc=0 read_rc=0 intact=1 capture_free_rc=1 end_rc=0 graph=1 after_rc=0"
if [[ -n "$build_problem" || -n "$shim_problem" ]]; then
    row "$free_async_check" "$free_async_variant" "not run: ${build_problem:-$shim_problem}" "$on"
else
    results=()
    for preload in "" "$lib"; do
        rc=0
        bounded 60 env -u CACHEALLOC_DISABLE -u CACHEALLOC_CONF LD_PRELOAD="$preload" \
            "$work/free_async" "$FREE_ASYNC_BYTES" || rc=$?
        if ((rc == 0)) && [[ "$out" =~ (free_rc=.*after_rc=-?[0-9]+) ]]; then
            results+=("${BASH_REMATCH[1]}")
        else
            results+=("$(failed "$rc")")
        fi
    done
    if [[ "${results[1]}" == "not run: "* ]]; then
        row "$free_async_check" "$free_async_variant" "${results[1]}" "$on"
    elif [[ "${results[1]}" == "$free_async_want" ]]; then
        row "$free_async_check" "$free_async_variant" "with the shim: $free_async_want: ok; the runtime alone: ${results[0]}" "$on"
    else
        row "$free_async_check" "$free_async_variant" "FAILED with the shim: ${results[1]#FAILED: } (wanted $free_async_want; the runtime alone: ${results[0]})" "$on"
    fi
fi
