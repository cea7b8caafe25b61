//! Shared by the shim-overhead benchmark and its bounded test: time malloc+free pairs of one size
//! through the pool core in-process, and through `pairs.c` (a C program linked against the fake
//! runtime) with or without `libcachealloc.so` preloaded.
//!
//! The including crate provides `crate::fake_cudart` (`tests/support/fake_cudart.rs`).

use crate::fake_cudart;
use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{DeviceAllocator, Settings, StreamId};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

/// Request sizes timed: small pool (512 B, 64 KiB, 1 MiB) and large pool (16 MiB), in bytes.
pub const SIZES: [u64; 4] = [512, 64 << 10, 1 << 20, 16 << 20];

/// What `time_core_pairs` measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CorePairs {
    /// Best nanoseconds per pair.
    pub ns_per_pair: f64,
    /// Segments the pool obtained from its (simulated) device, the warm-up pair's included.
    pub device_allocs: u64,
}

/// Best nanoseconds per `DeviceAllocator<SimDevice>` malloc+free pair of `size` over `rounds`
/// rounds of `pairs` pairs; a warm-up pair first, so every timed pair is a cache hit.
pub fn time_core_pairs(size: u64, pairs: u64, rounds: u64) -> CorePairs {
    let mut pool = DeviceAllocator::new(SimDevice::new(u64::MAX), Settings::default());
    let pair = |pool: &mut DeviceAllocator<SimDevice>| {
        let ptr = pool
            .malloc(std::hint::black_box(size), StreamId(0))
            .expect("unlimited device");
        pool.free(ptr).expect("live pointer");
    };
    pair(&mut pool);
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..pairs {
            pair(&mut pool);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / pairs as f64);
    }
    std::hint::black_box(pool.stats().allocation.all.allocated);
    CorePairs {
        ns_per_pair: best,
        device_allocs: pool.stats().counts.num_device_alloc,
    }
}

/// `pairs.c`, compiled against the fake runtime (once per process).
pub fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/shim_pairs/pairs.c");
        fake_cudart::compile_c_program(&source, "shim_pairs", &["-O2"])
    })
}

/// How `pairs.c` runs.
#[derive(Clone, Copy, Debug)]
pub enum Setup<'a> {
    /// Straight against the fake runtime: every cudaMalloc is a host mmap, every cudaFree a
    /// munmap (a baseline for the fake, not a GPU figure).
    FakeAlone,
    /// `library` preloaded with `CACHEALLOC_CONF=free_sync:<free_sync>`.
    Shim {
        library: &'a Path,
        free_sync: &'a str,
    },
}

/// What one run of `pairs.c` reported.
#[derive(Clone, Debug, PartialEq)]
pub struct PairsRun {
    /// (size in bytes, best ns per pair), in the order asked.
    pub ns_per_pair: Vec<(u64, f64)>,
    /// `cudaMalloc` calls that reached the fake runtime.
    pub fake_mallocs: u64,
    /// `cudaDeviceSynchronize` calls that reached the fake runtime.
    pub fake_device_syncs: u64,
}

/// Run `pairs.c` for `sizes`, `pairs` pairs per round, best of `rounds`.
pub fn run_pairs(
    setup: Setup<'_>,
    sizes: &[u64],
    pairs: u64,
    rounds: u64,
) -> Result<PairsRun, String> {
    let mut cmd = clean_command(program());
    cmd.arg(pairs.to_string()).arg(rounds.to_string());
    cmd.args(sizes.iter().map(u64::to_string));
    if let Setup::Shim { library, free_sync } = setup {
        cmd.env("LD_PRELOAD", library)
            .env("CACHEALLOC_CONF", format!("free_sync:{free_sync}"));
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed with {}:\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse(&text).ok_or_else(|| format!("unexpected output of {cmd:?}:\n{text}"))
}

/// A command for `program` without the caller's `FAKECUDART_*`, `CACHEALLOC_*` and
/// `*ALLOC_CONF` variables, and without `LD_PRELOAD`.
fn clean_command(program: &Path) -> Command {
    let mut cmd = fake_cudart::command(program);
    for (key, _) in std::env::vars_os() {
        let text = key.to_string_lossy();
        if text.starts_with("CACHEALLOC_") || text.ends_with("ALLOC_CONF") || text == "LD_PRELOAD" {
            cmd.env_remove(&key);
        }
    }
    cmd
}

fn parse(text: &str) -> Option<PairsRun> {
    let mut ns_per_pair = Vec::new();
    let mut counters = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["size", size, "pairs", _, "ns_per_pair", ns] => {
                ns_per_pair.push((size.parse().ok()?, ns.parse().ok()?));
            }
            ["fake_mallocs", mallocs, "fake_device_syncs", syncs, ..] => {
                counters = Some((mallocs.parse().ok()?, syncs.parse().ok()?));
            }
            _ => {}
        }
    }
    let (fake_mallocs, fake_device_syncs) = counters?;
    Some(PairsRun {
        ns_per_pair,
        fake_mallocs,
        fake_device_syncs,
    })
}
