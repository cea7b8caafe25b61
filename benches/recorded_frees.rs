//! Benchmark: what frees waiting on other streams (`Tensor.record_stream`) cost every malloc.
//!
//! While any recorded free waits, each malloc polls the backend for stream fences done. A poll
//! should cost what completed, not what waits: a program that records hundreds of blocks on a
//! long-running side stream (a communication stream) must not pay for each of them on every
//! malloc. Each row keeps that many recorded frees waiting on a stream whose work never
//! finishes (the simulated device with pending work) and times malloc+free pairs of 64 KiB on
//! the default stream; the ratio is against the row with none waiting, measured in the same
//! run, rounds alternating between the rows.
//!
//! `cargo bench --bench recorded_frees` (`-- --quick` for a short run).

mod quick_arg;

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{DeviceAllocator, Settings, StreamId};
use std::hint::black_box;
use std::time::Instant;

const MAIN: StreamId = StreamId(0);
const SIDE: StreamId = StreamId(7);
const WAITING: [usize; 4] = [0, 16, 256, 4096];

/// A pool with `waiting` 4 KiB allocations freed after `SIDE`'s work, which never completes.
fn pool_with_waiting(waiting: usize) -> DeviceAllocator<SimDevice> {
    let sim = SimDevice::new(u64::MAX).with_pending_work();
    let mut pool = DeviceAllocator::new(sim, Settings::default());
    let ptrs: Vec<_> = (0..waiting)
        .map(|_| pool.malloc(4096, MAIN).expect("the sim has room"))
        .collect();
    for ptr in ptrs {
        pool.free_after_streams(ptr, &[SIDE])
            .expect("a live allocation");
    }
    assert_eq!(pool.pending_frees(), waiting);
    pool
}

/// Nanoseconds per malloc+free pair over `pairs` pairs.
fn time_pairs(pool: &mut DeviceAllocator<SimDevice>, pairs: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..pairs {
        let ptr = pool.malloc(black_box(64 << 10), MAIN).expect("cached");
        pool.free(ptr).expect("live");
    }
    start.elapsed().as_nanos() as f64 / pairs as f64
}

const USAGE: &str = "\
Usage: cargo bench --bench recorded_frees [-- --quick]

Malloc+free pairs of 64 KiB with 0, 16, 256 and 4,096 recorded frees waiting on a stream that
never finishes, in ns per pair: the best of 9 rounds of 200,000 pairs (--quick: 3 of 20,000).
";

fn main() {
    let quick = quick_arg::quick_or_exit("recorded_frees", USAGE);
    let (rounds, pairs) = if quick { (3, 20_000) } else { (9, 200_000) };
    let mut pools: Vec<_> = WAITING.iter().map(|&w| pool_with_waiting(w)).collect();
    let mut best = vec![f64::MAX; WAITING.len()];
    for _ in 0..rounds {
        for (pool, best) in pools.iter_mut().zip(&mut best) {
            *best = best.min(time_pairs(pool, pairs));
        }
    }
    for (pool, &waiting) in pools.iter().zip(&WAITING) {
        assert_eq!(
            pool.pending_frees(),
            waiting,
            "still waiting: never polled done"
        );
    }
    println!("| recorded frees waiting | malloc+free ns/pair (best of {rounds}) | ratio to none |");
    println!("|---:|---:|---:|");
    for (&waiting, &ns) in WAITING.iter().zip(&best) {
        println!("| {waiting} | {ns:.1} | {:.2}x |", ns / best[0]);
    }
}
