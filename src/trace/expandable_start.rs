//! The start state of an expandable-segments recording that begins mid-run (its history
//! buffer wrapped, or recording began after warm-up): the runs of mapped pages and their blocks
//! at trace start, found by the backward walk of `start_state` from the snapshot's runs, then
//! placed in ranges.
//!
//! What the walk undoes in a run of mapped pages:
//! - A free: the block reappears exactly its rounded size. With expandable segments PyTorch
//!   splits off any remainder of 512 bytes or more, so no block keeps an unsplit tail.
//! - `segment_map`: its pages, which must be mapped and hold no block, become unmapped; a run
//!   they cut in two leaves two runs.
//! - `segment_unmap`: its pages, which must be unmapped, are mapped again, wholly free. They
//!   join the runs of the same stream they touch, never across a place where two of the
//!   snapshot's runs meet (two ranges meet there: the snapshot shows a range's adjacent mapped
//!   pages as one run), and take their pool. Pages that touch no run are the small pool's when
//!   they are not whole 20 MiB pages; else they take, as a guess, the pool of pages seen at
//!   their place later in the recording (a map, a snapshot's run: a guess, since a range given
//!   back and reserved again may hold the other pool's pages there), else of the nearer of the
//!   pages of their stream seen next to them each way that could share a range with them (a
//!   large range's pages lie whole 20 MiB pages apart, and no other stream's or pool's pages
//!   lie between), else the large pool's. Pages seen at their start decide among those seen at
//!   their place, and pages of their stream seen there only after another stream's tell nothing
//!   (the range was given back and reserved again in between); nor do any pages of their stream
//!   seen after it had none mapped (its ranges were all given back then, and those reserved
//!   again may have swapped places). PyTorch's small pool maps its
//!   stream's lowest unmapped page, and a small range's pages up to its highest were all
//!   mapped at once. So while the stream's small range is kept (it has pages mapped once these
//!   are unmapped; a range is given back only when all its pages are), small pages the stream
//!   maps later above their start and none at it do not make them small; nor, ever, do small
//!   pages seen so far from them that one range holding both would span more than the device
//!   could map (`PagesSeen::set_most_mapped`). A guess stands until a block or a map placed in
//!   the pages says which (a small-pool block is at most 1 MiB, a small-pool map one 2 MiB
//!   page).
//!
//! The runs at the start are placed in ranges as a snapshot's are (`infer_ranges`), and
//! `range_hints` is told of them (`RangeChange::Adopt`, before the recording's own changes), so
//! that their pages' maps reserve nothing. A range's pages may have been unmapped below its
//! lowest run when the recording began: a map of its pool and stream below it, with no range
//! between, shows how far down it reaches (`range_hints` lowers it), and it is placed again
//! from there. Its size comes from the device memory: `--device-memory` when it is given, else
//! the capacity the recording implies, else the memory the ranges reserved in the recording
//! imply (a range there before the recording bounds the ones below it, not its own size: its
//! start may lie lower; and no estimate below what the recording reserved is taken), read again
//! until both settle, or the largest estimate if they go round in a circle. It ends short of a
//! range the recording reserves while it is kept. (What the device could map at once, for the
//! walk's guesses, is the least of `--device-memory` and the most the recorded capacity can be;
//! without `--device-memory`, the trace is walked back again under the memory the start's
//! ranges were sized with, `start_state::reconstruct_start`.)
//!
//! What a recording cut mid-run cannot show, and so a replay of it may not reproduce: the pool
//! of wholly free pages it only unmaps, when nothing around them tells; and a range's pages
//! below every page of it the recording maps, which a request could have reached (a map there,
//! or an out-of-memory error for want of it). tests/expandable_cuts.rs measures how often.

use std::collections::BTreeMap;

use super::capacity::CapacityEstimate;
use super::expandable_state::{Occupied, SeedRange, infer_ranges};
use super::ranges::{RangeChange, Reservation, pool_of_page, range_hints};
use super::recording::{DeviceRecording, RecordedSegment};
use super::start_state::{SeedSegment, StartState, Walk, WalkBlock, WalkSegment};
use crate::pool::rounding::{LARGE_BUFFER, SMALL_BUFFER, pool_for, round_size};
use crate::pool::{PoolKind, Settings, StreamId, page_size};

/// Pages of expandable segments the walk has seen (a snapshot's runs, the maps it undid), with
/// their pool: what tells the pool of pages mapped again by undoing an unmap.
#[derive(Debug, Default)]
pub(super) struct PagesSeen {
    /// `(stream, start)` → the pages.
    pages: BTreeMap<(StreamId, u64), Seen>,
    /// The same pages by start alone.
    by_addr: BTreeMap<u64, Seen>,
    /// Pages noted so far.
    noted: u64,
    /// The most memory the device could have mapped at once, when known (`None`: unbounded).
    most_mapped: Option<u64>,
    /// Per stream, `noted` when the walk last found it with no pages mapped: its ranges were
    /// given back then, so pages of it noted until then lie in ranges reserved again since.
    given_back: BTreeMap<StreamId, u64>,
}

/// Pages seen: where they start and end, whose, and when.
#[derive(Clone, Copy, Debug)]
struct Seen {
    start: u64,
    end: u64,
    stream: StreamId,
    pool: PoolKind,
    /// Seen as a map (later in the recording than what the walk undoes), not a snapshot's run.
    mapped: bool,
    /// Noted as the `order`-th: the walk goes back in time, so a larger one is earlier.
    order: u64,
}

impl PagesSeen {
    /// Bound the memory mapped at once to `most_mapped` bytes (the capacity's upper bound):
    /// a small range's pages up to its highest were all mapped at once.
    pub(super) fn set_most_mapped(&mut self, most_mapped: Option<u64>) {
        self.most_mapped = most_mapped;
    }

    pub(super) fn note(
        &mut self,
        stream: StreamId,
        addr: u64,
        end: u64,
        pool: PoolKind,
        mapped: bool,
    ) {
        self.noted += 1;
        let seen = Seen {
            start: addr,
            end,
            stream,
            pool,
            mapped,
            order: self.noted,
        };
        self.pages.insert((stream, addr), seen);
        self.by_addr.insert(addr, seen);
    }

    /// `stream` has no pages mapped at this point of the walk: PyTorch gave its ranges back
    /// (a range goes back when its last pages are unmapped), and those reserved afterwards may
    /// lie anywhere, the other pool's where this one's were.
    fn given_back(&mut self, stream: StreamId) {
        self.given_back.insert(stream, self.noted);
    }

    /// The pages seen of any stream across any of `low..high`.
    fn across(&self, low: u64, high: u64) -> impl Iterator<Item = &Seen> {
        let before = self.by_addr.range(..low).next_back();
        before
            .into_iter()
            .chain(self.by_addr.range(low..high))
            .map(|(_, seen)| seen)
            .filter(move |seen| seen.start < high && seen.end > low)
    }

    /// The pool of `addr..end` on `stream`, and whether it is a guess. `small_kept`: the
    /// stream's small pool still has pages mapped once these are unmapped, so its range is kept
    /// (PyTorch gives a range back only when all its pages are unmapped).
    fn pool_of(
        &self,
        stream: StreamId,
        addr: u64,
        end: u64,
        small_kept: bool,
    ) -> Option<(PoolKind, bool)> {
        if !(end - addr).is_multiple_of(LARGE_BUFFER) {
            return Some((PoolKind::Small, false));
        }
        // Pages of the stream seen after its ranges were last given back tell nothing.
        let given_back = self.given_back.get(&stream).copied().unwrap_or(0);
        let mut below = self
            .pages
            .range((stream, 0)..(stream, end))
            .rev()
            .map(|(_, seen)| *seen)
            .filter(|seen| seen.order > given_back)
            .peekable();
        let mut above = self
            .pages
            .range((stream, end)..=(stream, u64::MAX))
            .map(|(_, seen)| *seen)
            .filter(|seen| seen.order > given_back);
        // Pages seen at this place later (a guess too: a range given back and reserved again
        // may have put the other pool's pages there since). Those covering `addr` decide. Small
        // pages seen only above `addr` do not make these small while the stream's small range is
        // kept: its pool maps the stream's lowest unmapped page, so it would have mapped `addr`
        // first. Pages of the stream seen only after another stream's there tell nothing: the
        // range there was given back and reserved again by then.
        let taken_over = self
            .across(addr, end)
            .filter(|seen| seen.stream != stream)
            .map(|seen| seen.order)
            .max()
            .unwrap_or(0);
        let mut inside = None;
        while let Some(seen) = below.peek().copied() {
            if seen.start <= addr {
                if seen.end > addr && seen.order > taken_over {
                    return Some((seen.pool, true));
                }
                break;
            }
            below.next();
            if seen.order > taken_over && (seen.pool == PoolKind::Large || !small_kept) {
                // Large pages seen anywhere inside them outweigh small ones.
                if inside != Some(PoolKind::Large) {
                    inside = Some(seen.pool);
                }
            }
        }
        if let Some(pool) = inside {
            return Some((pool, true));
        }
        // Else the nearer of the pages seen next to these each way, if they could lie in one
        // range with them: whole 20 MiB pages apart for a large range, and no pages of another
        // stream or pool seen between. (Looking past the next pages each way for some that could,
        // or taking these before the pages seen at this place, made more cut recordings depart
        // in tests/expandable_cuts.rs's long sweep: 57 of 48,203 against 27 for the latter.)
        let could_share = |seen: &Seen| {
            let (low, high) = if seen.start >= end {
                (end, seen.start)
            } else {
                (seen.end, addr)
            };
            let span = seen.end.max(end) - seen.start.min(addr);
            low <= high
                && match seen.pool {
                    // The small pool maps its stream's lowest unmapped page: pages up to a small
                    // range's highest were all mapped at once.
                    PoolKind::Small => {
                        self.most_mapped.is_none_or(|most| span <= most)
                            && !(small_kept && seen.mapped && seen.start >= end)
                    }
                    PoolKind::Large => seen.start.abs_diff(addr).is_multiple_of(LARGE_BUFFER),
                }
                && self.nothing_else_between(low, high, stream, seen.pool)
        };
        let distance = |seen: &Seen| {
            if seen.start >= end {
                seen.start - end
            } else {
                addr - seen.end.min(addr)
            }
        };
        let below = below.next().filter(could_share);
        let above = above.next().filter(could_share);
        [below, above]
            .into_iter()
            .flatten()
            .min_by_key(distance)
            .map(|seen| (seen.pool, true))
    }

    /// Whether no pages seen of another stream or pool lie across any of `low..high`.
    fn nothing_else_between(&self, low: u64, high: u64, stream: StreamId, pool: PoolKind) -> bool {
        !self
            .across(low, high)
            .any(|seen| seen.stream != stream || seen.pool != pool)
    }
}

impl Walk {
    /// Undo a free in a run of mapped pages: the block reappears, exactly its rounded size.
    pub(super) fn undo_free_in_run(
        &mut self,
        addr: u64,
        requested: u64,
        settings: &Settings,
    ) -> Result<(), String> {
        let (start, run) = self.segment_at(addr)?;
        let rounded = round_size(settings, requested);
        let end = addr.saturating_add(rounded);
        let block_pool = pool_for(rounded);
        if run.pool != block_pool {
            if !run.pool_guessed {
                return Err(format!(
                    "free at {addr:#x} of {requested} bytes, a {} pool block, in pages of the {} \
                     pool",
                    block_pool.name(),
                    run.pool.name()
                ));
            }
            run.pool = block_pool;
        }
        run.pool_guessed = false;
        if run.blocks.contains_key(&addr) {
            return Err(format!(
                "free at {addr:#x}, but a block is still live there"
            ));
        }
        if let Some((&other, b)) = run.blocks.range(..end).next_back()
            && other + b.size > addr
        {
            return Err(format!(
                "free at {addr:#x} of {requested} bytes ({rounded} rounded) overlaps the block \
                 still live at {other:#x}"
            ));
        }
        if end > start + run.size {
            return Err(format!(
                "free at {addr:#x} of {requested} bytes ({rounded} rounded) reaches past the \
                 mapped pages, which end at {:#x}",
                start + run.size
            ));
        }
        run.blocks.insert(
            addr,
            WalkBlock {
                size: rounded,
                requested,
                exact_end: true,
                freed_in_trace: true,
            },
        );
        Ok(())
    }

    /// Undo `segment_map`: the pages become unmapped.
    pub(super) fn undo_map(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
    ) -> Result<(), String> {
        let map_pool = mapped_pages(addr, size)?;
        let end = addr + size;
        let covering = self.covering(addr, end);
        // Mapped from `addr` on, without a gap.
        let mut at = addr;
        for &(start, run_end) in &covering {
            if start > at {
                break;
            }
            at = run_end;
        }
        if at < end {
            return Err(format!(
                "segment_map of {size} bytes at {addr:#x}, but those pages are not all mapped \
                 later"
            ));
        }
        for &(start, _) in &covering {
            let run = &self.segments[&start];
            if !run.expandable {
                return Err(format!(
                    "segment_map at {addr:#x}, inside the segment at {start:#x}, which is not \
                     expandable"
                ));
            }
            if run.stream != stream {
                return Err(format!(
                    "segment_map at {addr:#x} on stream {}, in pages of stream {}",
                    stream.0, run.stream.0
                ));
            }
            if !run.pool_guessed && run.pool != map_pool {
                return Err(format!(
                    "segment_map of {size} bytes at {addr:#x} (the {} pool's pages) in pages of \
                     the {} pool",
                    map_pool.name(),
                    run.pool.name()
                ));
            }
            if let Some((&b, _)) = run
                .blocks
                .iter()
                .find(|&(&b, block)| b < end && b + block.size > addr)
            {
                return Err(format!(
                    "segment_map at {addr:#x}, but the block at {b:#x} in its pages is live \
                     later"
                ));
            }
        }
        self.seen.note(stream, addr, end, map_pool, true);
        for (start, run_end) in covering {
            let mut run = self.segments.remove(&start).expect("found above");
            if run.pool_guessed {
                (run.pool, run.pool_guessed) = (map_pool, false);
            }
            let above = run.blocks.split_off(&end);
            if run_end > end {
                let high = WalkSegment {
                    size: run_end - end,
                    blocks: above,
                    ..run.clone_empty()
                };
                self.segments.insert(end, high);
            }
            if start < addr {
                run.size = addr - start;
                self.segments.insert(start, run);
            }
        }
        if !self
            .segments
            .values()
            .any(|run| run.expandable && run.stream == stream)
        {
            self.seen.given_back(stream);
        }
        Ok(())
    }

    /// Undo `segment_unmap`: the pages are mapped again, wholly free, joining the runs of their
    /// stream they touch.
    pub(super) fn undo_unmap(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
    ) -> Result<(), String> {
        unmapped_pages(addr, size)?;
        let end = addr + size;
        if let Some(&(start, _)) = self.covering(addr, end).first() {
            return Err(format!(
                "segment_unmap of {size} bytes at {addr:#x}, but the pages at {:#x} are mapped \
                 later",
                start.max(addr)
            ));
        }
        let joins = |run: &WalkSegment, at: u64| {
            run.expandable && run.stream == stream && !self.joints.contains(&at)
        };
        let below = self
            .segments
            .range(..addr)
            .next_back()
            .filter(|&(&start, run)| start + run.size == addr && joins(run, addr))
            .map(|(&start, run)| (start, run.pool, run.pool_guessed));
        let above = self
            .segments
            .get(&end)
            .filter(|run| joins(run, end))
            .map(|run| (run.pool, run.pool_guessed));
        let (pool, pool_guessed) = match (below, above) {
            (Some((_, pool, guessed)), _) | (None, Some((pool, guessed))) => (pool, guessed),
            (None, None) => {
                let small_kept = self.segments.values().any(|run| {
                    run.expandable && run.stream == stream && run.pool == PoolKind::Small
                });
                self.seen
                    .pool_of(stream, addr, end, small_kept)
                    .unwrap_or((PoolKind::Large, true))
            }
        };
        let mut run = WalkSegment {
            size,
            stream,
            pool,
            blocks: BTreeMap::new(),
            expandable: true,
            pool_guessed,
        };
        let mut start = addr;
        if let Some((below_start, below_pool, _)) = below
            && below_pool == pool
        {
            let low = self.segments.remove(&below_start).expect("found above");
            run.size += low.size;
            run.blocks = low.blocks;
            run.pool_guessed &= low.pool_guessed;
            start = below_start;
        }
        if let Some((above_pool, _)) = above
            && above_pool == pool
        {
            let high = self.segments.remove(&end).expect("found above");
            run.size += high.size;
            run.blocks.extend(high.blocks);
            run.pool_guessed &= high.pool_guessed;
        }
        self.segments.insert(start, run);
        Ok(())
    }

    /// `(start, end)` of the segments and runs that overlap `addr..end`, in address order.
    fn covering(&self, addr: u64, end: u64) -> Vec<(u64, u64)> {
        let first = self
            .segments
            .range(..=addr)
            .next_back()
            .filter(|&(&start, s)| start + s.size > addr)
            .map(|(&start, _)| start)
            .unwrap_or(addr);
        self.segments
            .range(first..end)
            .map(|(&start, s)| (start, start + s.size))
            .filter(|&(_, e)| e > addr)
            .collect()
    }
}

/// The pool whose pages a `segment_map` of `size` bytes at `addr` maps: the small pool maps one
/// 2 MiB page at a time, the large pool 20 MiB pages. An error for any other length.
fn mapped_pages(addr: u64, size: u64) -> Result<PoolKind, String> {
    if size == SMALL_BUFFER || (size > 0 && size.is_multiple_of(LARGE_BUFFER)) {
        return Ok(pool_of_page(size));
    }
    Err(format!(
        "segment_map of {size} bytes at {addr:#x}: neither one 2 MiB page (the small pool \
         maps one at a time) nor whole 20 MiB pages (the large pool's)"
    ))
}

/// An error unless a `segment_unmap` of `size` bytes at `addr` is whole pages (2 MiB ones at
/// least: the small pool unmaps several at once).
fn unmapped_pages(addr: u64, size: u64) -> Result<(), String> {
    if size > 0 && size.is_multiple_of(SMALL_BUFFER) {
        return Ok(());
    }
    Err(format!(
        "segment_unmap of {size} bytes at {addr:#x}: not whole pages (2 MiB in the small pool, \
         20 MiB in the large)"
    ))
}

impl WalkSegment {
    /// Its description without size or blocks.
    fn clone_empty(&self) -> Self {
        WalkSegment {
            size: 0,
            stream: self.stream,
            pool: self.pool,
            blocks: BTreeMap::new(),
            expandable: self.expandable,
            pool_guessed: self.pool_guessed,
        }
    }
}

/// The ranges that hold `runs`, the runs of mapped pages at the start of `rec` (next to its
/// `segments` at the start), on a device of `device_memory` bytes when it is known, else of
/// the memory estimated from the recording (starting from its `recorded` capacity); and, when
/// the device memory is not known, the memory those ranges and the recording's imply, when
/// they bound it (not the recording's capacity, which may be the middle of a bracket).
pub(super) fn start_ranges(
    rec: &DeviceRecording,
    segments: &[SeedSegment],
    runs: Vec<SeedSegment>,
    device_memory: Option<u64>,
    recorded: Option<CapacityEstimate>,
) -> (Vec<SeedRange>, Option<u64>) {
    if runs.is_empty() {
        return (Vec::new(), None);
    }
    let occupied: Vec<Occupied> = segments
        .iter()
        .map(|s| (s.addr, s.addr + s.size, None))
        .chain(
            runs.iter()
                .zip(private_pools(rec, &runs))
                .map(|(r, private)| {
                    let group = (r.pool, r.stream, private);
                    (r.addr, r.addr + r.size, Some(group))
                }),
        )
        .collect();
    // The memory ranges are sized from: the device's, when known, else the recording's
    // capacity to begin with, read again from where the ranges then lie.
    let capacity = device_memory.or_else(|| recorded.and_then(|c| c.replay_capacity()));
    let changes = rec.range_changes();
    let told = |ranges: &[SeedRange]| -> Vec<RangeChange> {
        adopted(ranges).into_iter().chain(changes.clone()).collect()
    };
    let hints_for = |ranges: &[SeedRange]| range_hints(&told(ranges), capacity);
    let mut memory = capacity.unwrap_or(u64::MAX);
    // No device has less memory than the recording reserved: an estimate below that rests on
    // ranges placed wrong, and is not taken.
    let reserved = rec.figures().recorded_peak_reserved_bytes;
    // The first run of a range → where the range reaches down to.
    let mut floors: BTreeMap<u64, u64> = BTreeMap::new();
    let mut ranges = infer_ranges(&occupied, runs.clone(), memory, &floors);
    let mut hints = hints_for(&ranges);
    let mut estimates = Vec::new();
    let mut settled = false;
    for _ in 0..6 {
        let before = (memory, floors.clone());
        let lowered = ranges
            .iter()
            .zip(hints.reservations.iter().filter(|r| r.adopted))
            .filter(|(range, r)| r.addr < range.addr)
            .map(|(range, r)| (range.runs[0].addr, r.addr));
        floors.extend(lowered);
        memory = device_memory.unwrap_or_else(|| {
            hints
                .device_total
                .or(capacity)
                .filter(|&m| m >= reserved)
                .unwrap_or(memory)
        });
        if (memory, &floors) == (before.0, &before.1) {
            settled = true;
            break;
        }
        estimates.push(memory);
        ranges = infer_ranges(&occupied, runs.clone(), memory, &floors);
        hints = hints_for(&ranges);
    }
    // Estimates that go round in a circle: the largest, which cuts the fewest ranges short.
    if !settled && let Some(&largest) = estimates.iter().max() {
        memory = largest;
        ranges = infer_ranges(&occupied, runs.clone(), memory, &floors);
        hints = hints_for(&ranges);
    }
    end_below_later_ranges(&mut ranges, &hints.reservations);
    let implied = match device_memory {
        Some(_) => None,
        None => range_hints(&told(&ranges), None)
            .device_total
            .filter(|&m| m >= reserved),
    };
    (ranges, implied)
}

/// A range there before the recording ends short of where the recording reserves another
/// range while it is kept: its real start may lie lower, its end too.
fn end_below_later_ranges(ranges: &mut [SeedRange], reservations: &[Reservation]) {
    let adopted = reservations.iter().filter(|r| r.adopted);
    for (range, kept) in ranges.iter_mut().zip(adopted) {
        let until = kept.given_back.unwrap_or(usize::MAX);
        let last_end = range.runs_end();
        let next = reservations
            .iter()
            .filter(|r| !r.adopted && r.reserved < until && r.addr >= last_end)
            .map(|r| r.addr)
            .min();
        if let Some(next) = next {
            let page = page_size(range.pool);
            let room = ((next - range.addr) / page * page).max(last_end - range.addr);
            if room < range.size {
                range.size = room;
                range.cut_short = true;
            }
        }
    }
}

/// For each run, the private pool of the snapshot's run that holds its start, if any.
fn private_pools(rec: &DeviceRecording, runs: &[SeedSegment]) -> Vec<Option<(u64, u64)>> {
    // The snapshot's runs in address order.
    let mut held: Vec<&RecordedSegment> = rec.segments.iter().filter(|s| s.is_expandable).collect();
    held.sort_unstable_by_key(|s| s.address);
    runs.iter()
        .map(|run| {
            let i = held.partition_point(|s| s.address <= run.addr);
            i.checked_sub(1)
                .map(|i| held[i])
                .filter(|s| run.addr < s.address.saturating_add(s.total_size))
                .and_then(|s| s.private_pool)
        })
        .collect()
}

/// The changes that tell `range_hints` of `ranges`, there before the recording.
pub(crate) fn adopted(ranges: &[SeedRange]) -> Vec<RangeChange> {
    ranges
        .iter()
        .map(|r| RangeChange::Adopt {
            addr: r.addr,
            size: r.size,
            page: page_size(r.pool),
            stream: r.stream,
            mapped: r.mapped_bytes(),
        })
        .collect()
}

impl StartState {
    /// The range changes a faithful replay follows: the start state's ranges (`Adopt`), then
    /// the recording's.
    pub fn range_changes(&self, rec: &DeviceRecording) -> Vec<RangeChange> {
        let mut changes = adopted(&self.ranges);
        changes.extend(rec.range_changes());
        changes
    }
}

#[cfg(test)]
mod tests;
