//! Installing an expandable segment that existed before the pool started (rebuilt from a
//! snapshot): its reserved address range, the runs of mapped pages in it with their blocks,
//! and the stretches between them unmapped — the layout `expandable.rs` keeps, as PyTorch's
//! snapshot shows it (one segment per run of mapped pages).

use super::allocator::DeviceAllocator;
use super::block::{Block, BlockId, BlockState, NIL};
use super::error::Error;
use super::expandable::page_size;
use super::layout::{BlockSeed, check_tiling};
use super::types::{DevicePtr, PoolKind, StreamId};
use crate::backend::Backend;

/// A run of mapped pages of an expandable segment, with the blocks that tile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedRunSeed {
    pub addr: u64,
    pub size: u64,
    /// Blocks tiling the run exactly, in address order.
    pub blocks: Vec<BlockSeed>,
}

/// An expandable segment that exists before the pool starts: its reserved range, and the runs
/// of pages mapped in it, in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSeed {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub runs: Vec<MappedRunSeed>,
}

impl RangeSeed {
    /// The bytes of its mapped pages.
    pub fn mapped_bytes(&self) -> u64 {
        self.runs
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.size))
    }
}

/// One stretch of a range to install: a run's block, or the unmapped space between runs.
struct Piece {
    addr: u64,
    size: u64,
    state: BlockState,
    requested: u64,
}

impl<B: Backend> DeviceAllocator<B> {
    /// Install an expandable segment that already exists on the device (its range reserved,
    /// its runs' pages mapped), without calling the backend (the caller has made the backend
    /// aware of it). Returns the addresses of its allocated blocks. Needs expandable segments
    /// on: with them off the pool holds no expandable block.
    pub fn adopt_range(&mut self, seed: &RangeSeed) -> Result<Vec<DevicePtr>, Error> {
        if !self.settings.expandable_segments {
            let at = seed.runs.first().map_or(seed.addr, |run| run.addr);
            return Err(Error::SeedForbiddenBySettings(format!(
                "the segment at {at:#x} is expandable (pages mapped into a reserved range), but \
                 expandable_segments is off"
            )));
        }
        let pieces = self.range_pieces(seed).map_err(|why| {
            Error::InvalidSeed(format!("expandable segment {:#x}: {why}", seed.addr))
        })?;
        // As for an adopted segment: the pool has grown, and had its limit.
        self.resolve_allowed_maximum();
        self.reserve_blocks(pieces.len());
        let (pool, stream) = (seed.pool, seed.stream);
        let mut prev: BlockId = NIL;
        let mut allocated = Vec::new();
        for piece in &pieces {
            let block = Block {
                addr: piece.addr,
                size: piece.size,
                requested: 0,
                stream,
                pool,
                prev,
                next: NIL,
                state: piece.state,
                gc_count_base: 0,
                expandable: true,
            };
            let id = self.blocks.insert(block);
            if prev != NIL {
                self.blocks.get_mut(prev).next = id;
            }
            prev = id;
            match piece.state {
                BlockState::Unmapped => self.unmapped.insert(&block),
                BlockState::Free => self.cache_block(id),
                _ => {
                    self.blocks.get_mut(id).requested = piece.requested;
                    let oversize = piece.size >= self.settings.max_split_size;
                    self.stats
                        .allocation_made(pool, piece.size, piece.requested, oversize);
                    allocated.push(DevicePtr::new(piece.addr).expect("checked nonzero"));
                }
            }
        }
        let mapped = seed.mapped_bytes();
        self.segments.insert(seed.addr, seed.size);
        self.total_reserved += mapped;
        self.stats.reserved_bytes.increase(pool, mapped);
        Ok(allocated)
    }

    /// The range's stretches in address order, after checking that it can exist: a range of
    /// whole pages free of other segments, runs of whole pages inside it (counted from its
    /// start) with a gap between runs, each run tiled by its blocks.
    fn range_pieces(&self, seed: &RangeSeed) -> Result<Vec<Piece>, String> {
        let page = page_size(seed.pool);
        if seed.addr == 0 || seed.size == 0 || !seed.size.is_multiple_of(page) {
            return Err(format!(
                "{} bytes at {:#x}: not whole pages of {page} bytes at a nonzero address",
                seed.size, seed.addr
            ));
        }
        let end = seed
            .addr
            .checked_add(seed.size)
            .ok_or("runs past the end of the address space")?;
        if self.segments.overlaps(seed.addr, seed.size) {
            return Err("overlaps an existing segment".into());
        }
        if seed.runs.is_empty() {
            return Err("no pages mapped (PyTorch gives such a range back)".into());
        }
        let mut pieces = Vec::new();
        let mut cursor = seed.addr;
        for run in &seed.runs {
            let run_end = run.addr.checked_add(run.size).filter(|&e| e <= end);
            let Some(run_end) = run_end.filter(|_| run.addr >= cursor) else {
                return Err(format!(
                    "mapped run {:#x} of {} bytes lies outside the range or overlaps the run \
                     before it",
                    run.addr, run.size
                ));
            };
            if run.size == 0
                || !(run.addr - seed.addr).is_multiple_of(page)
                || !run.size.is_multiple_of(page)
            {
                return Err(format!(
                    "mapped run {:#x} of {} bytes is not whole pages of {page} bytes from the \
                     range's start",
                    run.addr, run.size
                ));
            }
            if run.addr == cursor && cursor != seed.addr {
                return Err(format!(
                    "mapped run {:#x} continues the run before it: they are one run",
                    run.addr
                ));
            }
            check_tiling(run.addr, run_end, &run.blocks)
                .map_err(|why| format!("mapped run {:#x}: {why}", run.addr))?;
            if run.addr > cursor {
                pieces.push(Piece {
                    addr: cursor,
                    size: run.addr - cursor,
                    state: BlockState::Unmapped,
                    requested: 0,
                });
            }
            pieces.extend(run.blocks.iter().map(|b| Piece {
                addr: b.addr,
                size: b.size,
                state: if b.allocated {
                    BlockState::Allocated
                } else {
                    BlockState::Free
                },
                requested: b.requested,
            }));
            cursor = run_end;
        }
        if cursor < end {
            pieces.push(Piece {
                addr: cursor,
                size: end - cursor,
                state: BlockState::Unmapped,
                requested: 0,
            });
        }
        Ok(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimDevice;
    use crate::pool::{Settings, StreamId};
    use crate::trace::rng::SplitMix64 as Rng;

    const MIB: u64 = 1 << 20;
    const PAGE: u64 = 20 * MIB;
    const RANGE: u64 = 0x7f00_0000_0000;

    fn block(addr: u64, size: u64, requested: u64) -> BlockSeed {
        BlockSeed {
            addr,
            size,
            requested,
            allocated: requested > 0,
        }
    }

    /// A 10-page range: pages 0-1 mapped (20 MiB allocated, 20 MiB free), page 3 mapped and
    /// free, the rest unmapped.
    fn two_runs() -> RangeSeed {
        RangeSeed {
            addr: RANGE,
            size: 10 * PAGE,
            stream: StreamId(0),
            pool: PoolKind::Large,
            runs: vec![
                MappedRunSeed {
                    addr: RANGE,
                    size: 2 * PAGE,
                    blocks: vec![block(RANGE, PAGE, PAGE), block(RANGE + PAGE, PAGE, 0)],
                },
                MappedRunSeed {
                    addr: RANGE + 3 * PAGE,
                    size: PAGE,
                    blocks: vec![block(RANGE + 3 * PAGE, PAGE, 0)],
                },
            ],
        }
    }

    /// A pool on a device of `capacity` bytes holding `seed`, as a replay installs it.
    fn pool_holding(
        seed: &RangeSeed,
        capacity: u64,
        settings: Settings,
    ) -> Result<DeviceAllocator<SimDevice>, Error> {
        let mut sim = SimDevice::new(capacity);
        let runs: Vec<(u64, u64)> = seed.runs.iter().map(|r| (r.addr, r.size)).collect();
        sim.claim_range(seed.addr, seed.size, page_size(seed.pool), &runs)
            .unwrap();
        let mut pool = DeviceAllocator::new(sim, settings);
        pool.adopt_range(seed)?;
        Ok(pool)
    }

    fn expandable() -> Settings {
        Settings {
            expandable_segments: true,
            ..Settings::default()
        }
    }

    /// The adopted segment behaves as one the pool made: the gap between the runs is mapped
    /// to grow a free block (the runs merge), and freeing everything then `empty_cache()`
    /// unmaps every page and gives the range back.
    #[test]
    fn an_adopted_range_grows_and_is_given_back() {
        let mut pool = pool_holding(&two_runs(), 1 << 40, expandable()).unwrap();
        pool.validate().unwrap();
        let s = pool.stats();
        assert_eq!(s.reserved_bytes.large_pool.current, 3 * PAGE as i64);
        assert_eq!(s.allocated_bytes.all.current, PAGE as i64);
        assert_eq!(
            s.segment.all.current, 0,
            "PyTorch counts no segment for a range"
        );
        assert_eq!(pool.backend().used(), 3 * PAGE);
        // 50 MiB: no free block holds it; the one at page 1 grows through the gap (one page
        // mapped) into page 3's.
        let ptr = pool.malloc(50 * MIB, StreamId(0)).unwrap();
        pool.validate().unwrap();
        assert_eq!(ptr.addr(), RANGE + PAGE);
        let s = pool.stats();
        assert_eq!(s.counts.num_device_alloc, 1);
        assert_eq!(s.reserved_bytes.large_pool.current, 4 * PAGE as i64);
        let first = DevicePtr::new(RANGE).unwrap();
        for p in [ptr, first] {
            pool.free(p).unwrap();
            pool.validate().unwrap();
        }
        pool.empty_cache().unwrap();
        pool.validate().unwrap();
        assert_eq!(pool.stats().reserved_bytes.all.current, 0);
        assert_eq!(pool.backend().used(), 0);
        assert!(pool.segments().is_empty(), "the range was given back");
    }

    #[test]
    fn an_expandable_segment_needs_expandable_segments_on() {
        let Err(err) = pool_holding(&two_runs(), 1 << 40, Settings::default()) else {
            panic!("adopted with expandable segments off");
        };
        assert!(
            matches!(&err, Error::SeedForbiddenBySettings(why) if why.contains("expandable_segments is off")),
            "{err}"
        );
    }

    #[test]
    fn ranges_that_cannot_exist_are_refused_naming_why() {
        let moved = |f: &dyn Fn(&mut RangeSeed)| {
            let mut seed = two_runs();
            f(&mut seed);
            seed
        };
        let cases: [(RangeSeed, &str); 6] = [
            (
                moved(&|s| s.size = 10 * PAGE + MIB),
                "not whole pages of 20971520 bytes",
            ),
            (moved(&|s| s.runs.clear()), "no pages mapped"),
            (
                moved(&|s| s.runs[1].addr = RANGE + 2 * PAGE),
                "continues the run before it",
            ),
            (
                moved(&|s| s.size = 3 * PAGE),
                "lies outside the range or overlaps the run before it",
            ),
            (
                moved(&|s| s.runs[0].blocks[1].size = MIB),
                "blocks add up to 22020096 bytes, not 41943040",
            ),
            (
                moved(&|s| {
                    s.runs[1].size = PAGE - MIB;
                    s.runs[1].blocks[0].size = PAGE - MIB;
                }),
                "of 19922944 bytes is not whole pages of 20971520 bytes",
            ),
        ];
        for (seed, needle) in cases {
            let mut pool = DeviceAllocator::new(SimDevice::new(1 << 40), expandable());
            let err = pool.adopt_range(&seed).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle}: {err}");
            pool.validate().unwrap();
            assert!(pool.segments().is_empty());
        }
        // A run off the range's pages.
        let seed = moved(&|s| {
            s.runs[1].addr = RANGE + 3 * PAGE + MIB;
            s.runs[1].blocks[0].addr = RANGE + 3 * PAGE + MIB;
        });
        let mut pool = DeviceAllocator::new(SimDevice::new(1 << 40), expandable());
        let err = pool.adopt_range(&seed).unwrap_err().to_string();
        assert!(err.contains("not whole pages"), "{err}");
        // A range over one the pool holds.
        let mut pool = pool_holding(&two_runs(), 1 << 40, expandable()).unwrap();
        let err = pool.adopt_range(&two_runs()).unwrap_err().to_string();
        assert!(err.contains("overlaps an existing segment"), "{err}");
        pool.validate().unwrap();
        assert_eq!(pool.stats().reserved_bytes.all.current, 3 * PAGE as i64);
        let err = SimDevice::new(1 << 40)
            .claim_range(
                seed.addr,
                seed.size,
                PAGE,
                &[(RANGE, 2 * PAGE), (RANGE + 3 * PAGE + MIB, PAGE)],
            )
            .unwrap_err();
        assert!(
            err.contains("is not whole pages"),
            "the device refuses it too: {err}"
        );
    }

    /// An adopted allocation counts as oversize from `max_split_size` up, as one the pool hands
    /// out does: under max_split_size_mb:20, the 20 MiB block is one, until it is freed.
    #[test]
    fn an_adopted_allocation_of_max_split_size_is_oversize() {
        let settings = Settings {
            max_split_size: PAGE,
            ..expandable()
        };
        let mut pool = pool_holding(&two_runs(), 1 << 40, settings).unwrap();
        assert_eq!(pool.stats().oversize_allocations.current, 1);
        pool.free(DevicePtr::new(RANGE).unwrap()).unwrap();
        pool.validate().unwrap();
        assert_eq!(pool.stats().oversize_allocations.current, 0);
    }

    /// A random range of `pages` pages of `pool`: runs of mapped pages with unmapped gaps
    /// between them, each cut into blocks (allocated, or free with no free neighbour).
    fn random_range(rng: &mut Rng, addr: u64, pool: PoolKind, pages: u64) -> RangeSeed {
        let page = page_size(pool);
        let mut runs = Vec::new();
        let mut at = rng.below(3).min(pages - 1);
        while at < pages {
            let len = rng.between(1, 4).min(pages - at);
            let (start, end) = (addr + at * page, addr + (at + len) * page);
            let mut blocks: Vec<BlockSeed> = Vec::new();
            let mut cursor = start;
            while cursor < end {
                let units = (end - cursor) / 512;
                let most = 1 << rng.between(1, 16);
                let size = 512 * rng.between(1, units.min(most));
                let free = rng.chance(0.4) && blocks.last().is_none_or(|b| b.allocated);
                blocks.push(block(
                    cursor,
                    size,
                    if free { 0 } else { size - rng.below(512) },
                ));
                cursor += size;
            }
            runs.push(MappedRunSeed {
                addr: start,
                size: end - start,
                blocks,
            });
            at += len + rng.between(1, 3);
        }
        RangeSeed {
            addr,
            size: pages * page,
            stream: StreamId(0),
            pool,
            runs,
        }
    }

    /// Random expandable layouts, installed and then driven by random requests and frees
    /// (and `empty_cache()`), hold every invariant after every step; freeing everything
    /// then gives every page and range back.
    #[test]
    fn random_adopted_ranges_stay_valid_under_random_requests() {
        let (mut maps, mut unmaps, mut ooms) = (0, 0, 0);
        for seed in 0..30 {
            let mut rng = Rng::new(seed);
            let (large_pages, small_pages) = (rng.between(2, 12), rng.between(1, 8));
            let large = random_range(&mut rng, RANGE, PoolKind::Large, large_pages);
            let small = random_range(&mut rng, RANGE + (1 << 36), PoolKind::Small, small_pages);
            let mapped = large.mapped_bytes() + small.mapped_bytes();
            let mut sim = SimDevice::new(mapped + rng.below(6) * PAGE);
            for r in [&large, &small] {
                let runs: Vec<(u64, u64)> = r.runs.iter().map(|r| (r.addr, r.size)).collect();
                sim.claim_range(r.addr, r.size, page_size(r.pool), &runs)
                    .unwrap();
            }
            let mut pool = DeviceAllocator::new(sim, expandable());
            let mut live: Vec<DevicePtr> = Vec::new();
            for r in [&large, &small] {
                live.extend(pool.adopt_range(r).unwrap());
            }
            pool.validate()
                .unwrap_or_else(|e| panic!("seed {seed}: adopted: {e}"));
            for step in 0..200 {
                match rng.below(10) {
                    0..=4 => {
                        let size = 1 << rng.between(9, 25);
                        if let Ok(ptr) = pool.malloc(size - rng.below(size / 2), StreamId(0)) {
                            live.push(ptr);
                        }
                    }
                    5..=8 if !live.is_empty() => {
                        let ptr = live.swap_remove(rng.below(live.len() as u64) as usize);
                        pool.free(ptr).unwrap();
                    }
                    _ => pool.empty_cache().unwrap(),
                }
                pool.validate()
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            }
            let counts = pool.stats().counts;
            (maps, unmaps, ooms) = (
                maps + counts.num_device_alloc,
                unmaps + counts.num_device_free,
                ooms + counts.num_ooms,
            );
            for ptr in live {
                pool.free(ptr).unwrap();
            }
            pool.empty_cache().unwrap();
            pool.validate().unwrap();
            assert_eq!(pool.backend().used(), 0, "seed {seed}");
            assert!(pool.segments().is_empty(), "seed {seed}");
        }
        // The runs mapped pages, unmapped them and ran out of memory.
        assert!(
            maps > 50 && unmaps > 20 && ooms > 10,
            "{maps} {unmaps} {ooms}"
        );
    }
}
