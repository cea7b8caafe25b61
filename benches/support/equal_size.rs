//! The equal-size churn workload: the worst case of a size-class free index.

use cachealloc::pool::StreamId;
use cachealloc::trace::rng::SplitMix64;
use cachealloc::trace::{AllocId, Op, Workload};

/// The size of the churned blocks.
pub const SIZE: u64 = 2 << 20;
/// The size of the live block after each churned one (never freed). Four (block, spacer) pairs
/// fill a 20 MiB segment exactly, so every churned block is `SIZE` bytes with a live spacer
/// after it.
pub const SPACER: u64 = 3 << 20;
/// Number of (block, spacer) pairs allocated first; half of the blocks are then freed.
pub const PAIRS: u32 = 2048;
/// Operations before the churn starts: the pairs, then the frees of half the blocks.
pub const SETUP_OPS: usize = 2 * PAIRS as usize + PAIRS as usize / 2;
/// Number of (allocate, free) steps of the churn.
pub const CHURN: usize = 50_000;

/// Many free blocks of one size, each between two live blocks so that none coalesce (one
/// tensor shape freed layer after layer), then churn: allocate that size, free a random one of
/// them. Every search lands in one long size class: the worst case of a size-class index.
pub fn equal_size_churn() -> Workload {
    let stream = StreamId(0);
    let mut workload = Workload::new("equal-size churn");
    let mut next_id = 0;
    let mut alloc = |ops: &mut Vec<Op>, size| {
        next_id += 1;
        ops.push(Op::Alloc {
            id: next_id - 1,
            size,
            stream,
            recorded_addr: None,
        });
        next_id - 1
    };
    let mut live = Vec::new();
    for _ in 0..PAIRS {
        live.push(alloc(&mut workload.ops, SIZE));
        alloc(&mut workload.ops, SPACER);
    }
    let mut rng = SplitMix64::new(7);
    let mut free_random = |ops: &mut Vec<Op>, live: &mut Vec<AllocId>| {
        let id = live.swap_remove(rng.below(live.len() as u64) as usize);
        ops.push(Op::Free { id });
    };
    for _ in 0..PAIRS / 2 {
        free_random(&mut workload.ops, &mut live);
    }
    assert_eq!(workload.ops.len(), SETUP_OPS);
    for _ in 0..CHURN {
        live.push(alloc(&mut workload.ops, SIZE));
        free_random(&mut workload.ops, &mut live);
    }
    workload.num_ids = next_id;
    workload
}
