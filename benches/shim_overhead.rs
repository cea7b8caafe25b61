//! Benchmark: what an interposed cudaMalloc+cudaFree pair costs on a cache hit, next to the pool
//! core alone. One table, one row per request size:
//!
//! - core: `DeviceAllocator<SimDevice>` malloc+free in-process (no FFI, no lock, no runtime);
//! - shim none: `pairs.c` under `LD_PRELOAD=libcachealloc.so` with `free_sync:none` (the block
//!   is reusable at once: FFI boundary, mode check, cudaGetDevice, pool lock, core);
//! - shim device: the same with the default `free_sync:device`: each free is pending until a
//!   device synchronization, so mallocs carve new blocks from cached free space until none fits,
//!   then the pool synchronizes the (fake) device and reuses the pending blocks — the row
//!   includes those fake cudaDeviceSynchronize calls (their count is printed);
//! - fake alone: `pairs.c` without the shim, every call reaching the fake runtime (a host mmap and
//!   munmap per pair, not a GPU figure).
//!
//! `cargo bench --bench shim_overhead` (`-- --quick` for a short run). The preloaded library is
//! `$CACHEALLOC_LIB` when set, else the `libcachealloc.so` built with this benchmark (same
//! profile as the in-process core), else `target/release/libcachealloc.so` (from
//! `cargo build --release --lib`).

// Only part of the fake runtime's helpers are used here.
#[allow(dead_code)]
#[path = "../tests/support/fake_cudart.rs"]
mod fake_cudart;
mod quick_arg;
mod shim_pairs;

use shim_pairs::{PairsRun, SIZES, Setup, run_pairs, time_core_pairs};
use std::path::{Path, PathBuf};

fn library() -> PathBuf {
    if let Some(lib) = std::env::var_os("CACHEALLOC_LIB").filter(|v| !v.is_empty()) {
        return PathBuf::from(lib);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|deps| deps.join("libcachealloc.so")));
    match beside {
        Some(lib) if lib.is_file() => lib,
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libcachealloc.so"),
    }
}

fn run_or_exit(setup: Setup<'_>, pairs: u64, rounds: u64) -> PairsRun {
    run_pairs(setup, &SIZES, pairs, rounds).unwrap_or_else(|e| {
        eprintln!("shim_overhead: {e}");
        std::process::exit(1);
    })
}

fn ns_for(run: &PairsRun, size: u64) -> f64 {
    run.ns_per_pair
        .iter()
        .find(|(s, _)| *s == size)
        .map_or(f64::NAN, |(_, ns)| *ns)
}

fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

const USAGE: &str = "\
Usage: cargo bench --bench shim_overhead [-- --quick]

An interposed cudaMalloc+cudaFree pair of one size (a cache hit) against the pool core alone,
in ns per pair: the best of 5 rounds of 200,000 pairs per size (--quick: 3 of 20,000). The
preloaded library is $CACHEALLOC_LIB, else the libcachealloc.so built with this benchmark, else
target/release/libcachealloc.so.
";

fn main() {
    let quick = quick_arg::quick_or_exit("shim_overhead", USAGE);
    let (pairs, rounds) = if quick { (20_000, 3) } else { (200_000, 5) };
    let lib = library();
    if !lib.is_file() {
        eprintln!(
            "shim_overhead: {} not found; run `cargo build --release --lib` or set CACHEALLOC_LIB",
            lib.display()
        );
        std::process::exit(1);
    }

    let core: Vec<f64> = SIZES
        .iter()
        .map(|&size| time_core_pairs(size, pairs, rounds).ns_per_pair)
        .collect();
    let none = run_or_exit(
        Setup::Shim {
            library: &lib,
            free_sync: "none",
        },
        pairs,
        rounds,
    );
    let device = run_or_exit(
        Setup::Shim {
            library: &lib,
            free_sync: "device",
        },
        pairs,
        rounds,
    );
    let fake = run_or_exit(Setup::FakeAlone, pairs, rounds);

    println!(
        "cudaMalloc+cudaFree pair of one size, cache hit, ns per pair (best of {rounds} rounds of \
         {pairs} pairs)"
    );
    println!("library: {}", lib.display());
    println!(
        "{:>8} {:>10} {:>14} {:>10} {:>16} {:>10} {:>20}",
        "size", "core", "shim none", "none/core", "shim device", "device/core", "fake alone (mmap)"
    );
    for (&size, &core_ns) in SIZES.iter().zip(&core) {
        let (n, d) = (ns_for(&none, size), ns_for(&device, size));
        println!(
            "{:>8} {:>10.1} {:>14.1} {:>9.2}x {:>16.1} {:>10.2}x {:>20.1}",
            size_label(size),
            core_ns,
            n,
            n / core_ns,
            d,
            d / core_ns,
            ns_for(&fake, size)
        );
    }
    println!(
        "runtime calls: shim none {} cudaMalloc / {} cudaDeviceSynchronize; shim device {} / {}; \
         fake alone {} cudaMalloc",
        none.fake_mallocs,
        none.fake_device_syncs,
        device.fake_mallocs,
        device.fake_device_syncs,
        fake.fake_mallocs
    );
    println!(
        "core: DeviceAllocator<SimDevice> in-process. shim none: LD_PRELOAD, free_sync:none \
         (immediate reuse). shim device: default free_sync:device, frees pending until a device \
         sync, so the row includes the fake cudaDeviceSynchronize calls the pool makes when no \
         ready block fits. fake alone: no \
         shim, host mmap+munmap per pair in the fake runtime (not a GPU figure)."
    );
}
