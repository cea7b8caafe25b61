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
mod tests {
    use crate::pool::{PoolKind, StreamId};
    use crate::trace::fixtures::{BASE, MIB, at, entry, recording, segment};
    use crate::trace::recording::{Action, CallSite, DeviceRecording, RecordedSegment, TraceEntry};
    use crate::trace::{ReplayConfig, ReplayOutcome, replay_faithful};

    const GIB: u64 = 1 << 30;

    /// A run of mapped pages of an expandable segment, from `(offset, size, requested,
    /// allocated)` blocks.
    fn run(addr: u64, size: u64, stream: u64, blocks: &[(u64, u64, u64, bool)]) -> RecordedSegment {
        RecordedSegment {
            is_expandable: true,
            stream: StreamId(stream),
            ..segment(addr, size, blocks)
        }
    }

    /// 40 MiB of mapped pages on stream 0: a 20 MiB block, then a 4 MiB one allocated at the
    /// start of the 20 MiB page after it (`SegmentMap` and `Alloc` at `BASE + 20 MiB`).
    fn grown_by_a_map() -> RecordedSegment {
        run(
            BASE,
            40 * MIB,
            0,
            &[
                (0, 20 * MIB, 20 * MIB, true),
                (20 * MIB, 4 * MIB, 4 * MIB, true),
                (24 * MIB, 16 * MIB, 0, false),
            ],
        )
    }

    fn on(stream: u64, action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            stream: StreamId(stream),
            ..entry(action, addr, size)
        }
    }

    fn replayed(rec: &DeviceRecording) -> ReplayOutcome {
        let config = ReplayConfig {
            settings: rec.replay_settings(),
            ..ReplayConfig::default()
        };
        replay_faithful(rec, &config).unwrap().outcome
    }

    /// (address, size, allocated, id) of every block of the start's runs, and each range's
    /// (address, runs).
    type Blocks = Vec<(u64, u64, bool, Option<u32>)>;
    fn start_of(rec: &DeviceRecording) -> (Blocks, Vec<(u64, usize)>) {
        let start = rec.faithful().unwrap().start;
        let blocks = start
            .blocks()
            .map(|b| (b.addr, b.size, b.allocated, b.id))
            .collect();
        let ranges = start
            .ranges
            .iter()
            .map(|r| (r.addr, r.runs.len()))
            .collect();
        (blocks, ranges)
    }

    /// The pool and size of the range at the start of `rec` that holds the run at `addr`, on a
    /// device of `memory` bytes when given.
    fn range_holding(
        rec: &DeviceRecording,
        addr: u64,
        memory: Option<u64>,
    ) -> Option<(PoolKind, u64)> {
        let start = rec.faithful_on(memory).unwrap().start;
        let range = start
            .ranges
            .iter()
            .find(|r| r.runs.iter().any(|x| x.addr == addr));
        range.map(|r| (r.pool, r.size))
    }

    /// A recording that begins with pages mapped: the pages its maps add are taken away, and
    /// the replay maps them again where the recording did.
    #[test]
    fn pages_mapped_in_the_trace_are_unmapped_at_its_start() {
        let rec = recording(
            vec![
                entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
                entry(Action::Alloc, BASE + 20 * MIB, 4 * MIB),
            ],
            vec![grown_by_a_map()],
        );
        assert_eq!(rec.figures().start_reserved_bytes, 20 * MIB);
        let (blocks, ranges) = start_of(&rec);
        assert_eq!(blocks, [(BASE, 20 * MIB, true, None)]);
        assert_eq!(ranges, [(BASE, 1)]);
        let out = replayed(&rec);
        assert_eq!(out.allocs_at_recorded_addr, 1);
        assert_eq!(out.stats.counts.num_device_alloc, 1);
        assert_eq!(out.stats.reserved_bytes.all.peak as u64, 40 * MIB);
    }

    /// Pages the trace unmaps were mapped at its start, holding the blocks it frees, in the run
    /// they touch; `empty_cache()` unmaps them again.
    #[test]
    fn pages_unmapped_in_the_trace_are_mapped_at_its_start() {
        let rec = recording(
            vec![
                entry(Action::FreeCompleted, BASE + 20 * MIB, 4 * MIB),
                entry(Action::SegmentUnmap, BASE + 20 * MIB, 20 * MIB),
            ],
            vec![run(
                BASE,
                20 * MIB,
                0,
                &[(0, 4 * MIB, 4 * MIB, true), (4 * MIB, 16 * MIB, 0, false)],
            )],
        );
        let (blocks, ranges) = start_of(&rec);
        assert_eq!(
            blocks,
            [
                (BASE, 4 * MIB, true, None),
                (BASE + 4 * MIB, 16 * MIB, false, None),
                (BASE + 20 * MIB, 4 * MIB, true, Some(0)),
                (BASE + 24 * MIB, 16 * MIB, false, None),
            ]
        );
        assert_eq!(ranges, [(BASE, 1)], "one run of 40 MiB");
        let out = replayed(&rec);
        assert_eq!((out.frees, out.empty_cache_calls), (1, 1));
        assert_eq!(out.stats.counts.num_device_free, 1);
        assert_eq!(out.stats.reserved_bytes.all.current as u64, 20 * MIB);
    }

    /// Where two of the snapshot's runs meet, two ranges meet: pages mapped again there by
    /// undoing an unmap join neither run across that place. Here the upper range was reserved
    /// where pages of another were unmapped (given back) just before; at the start those pages
    /// lie in a range of their own, right after the lower run's.
    #[test]
    fn pages_mapped_again_do_not_join_a_run_across_where_two_ranges_meet() {
        let upper = BASE + 20 * MIB;
        let rec = recording(
            vec![
                entry(Action::SegmentUnmap, upper, 20 * MIB),
                entry(Action::SegmentMap, upper, 40 * MIB),
                entry(Action::Alloc, upper, 40 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(upper, 40 * MIB, 0, &[(0, 40 * MIB, 40 * MIB, true)]),
            ],
        );
        let start = rec.faithful().unwrap().start;
        let runs: Vec<Vec<(u64, u64)>> = start
            .ranges
            .iter()
            .map(|r| r.runs.iter().map(|x| (x.addr, x.size)).collect())
            .collect();
        assert_eq!(runs, [vec![(BASE, 20 * MIB)], vec![(upper, 20 * MIB)]]);
    }

    /// A map in pages whose pool was guessed says which pool's they are: here the small
    /// pool's, which mapped nine 2 MiB pages after one it held at the start, then unmapped all
    /// ten at once (20 MiB, whole large pages: nothing else tells).
    #[test]
    fn a_map_tells_the_pool_of_pages_mapped_again() {
        let far = BASE + 100 * GIB;
        let mut entries: Vec<TraceEntry> = (1..10)
            .map(|i| entry(Action::SegmentMap, far + i * 2 * MIB, 2 * MIB))
            .collect();
        entries.push(entry(Action::SegmentUnmap, far, 20 * MIB));
        let rec = recording(
            entries,
            vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)])],
        );
        let start = rec.faithful().unwrap().start;
        let ranges: Vec<(u64, PoolKind, u64)> = start
            .ranges
            .iter()
            .map(|r| (r.addr, r.pool, r.mapped_bytes()))
            .collect();
        assert_eq!(
            ranges,
            [
                (BASE, PoolKind::Large, 20 * MIB),
                (far, PoolKind::Small, 2 * MIB)
            ]
        );
    }

    /// Pages mapped again by undoing an unmap join only the runs they touch of their own
    /// stream and pool: not stream 1's run right below them, nor a large run right above small
    /// pages they join.
    #[test]
    fn pages_mapped_again_join_only_runs_of_their_stream_and_pool() {
        let rec = recording(
            vec![entry(Action::SegmentUnmap, BASE + 20 * MIB, 20 * MIB)],
            vec![run(BASE, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)])],
        );
        let start = rec.faithful().unwrap().start;
        let ranges: Vec<(u64, u64, u64)> = start
            .ranges
            .iter()
            .map(|r| (r.addr, r.stream.0, r.mapped_bytes()))
            .collect();
        assert_eq!(
            ranges,
            [(BASE, 1, 20 * MIB), (BASE + 20 * MIB, 0, 20 * MIB)]
        );
        let rec = recording(
            vec![entry(Action::SegmentUnmap, BASE + 2 * MIB, 2 * MIB)],
            vec![
                run(BASE, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
                run(
                    BASE + 4 * MIB,
                    20 * MIB,
                    0,
                    &[(0, 20 * MIB, 20 * MIB, true)],
                ),
            ],
        );
        let start = rec.faithful().unwrap().start;
        let ranges: Vec<(u64, PoolKind, u64)> = start
            .ranges
            .iter()
            .map(|r| (r.addr, r.pool, r.mapped_bytes()))
            .collect();
        assert_eq!(
            ranges,
            [
                (BASE, PoolKind::Small, 4 * MIB),
                (BASE + 4 * MIB, PoolKind::Large, 20 * MIB)
            ]
        );
    }

    /// Pages mapped again whose pool was a guess, joined to a run whose pool is known, take
    /// that pool for certain: a small block placed in them later in the walk is a
    /// contradiction, not a new guess.
    #[test]
    fn a_guess_joined_to_a_known_run_is_no_guess() {
        let p = BASE + 100 * GIB;
        let rec = recording(
            vec![
                entry(Action::FreeCompleted, p - 20 * MIB, 512),
                entry(Action::SegmentUnmap, p, 20 * MIB),
                entry(Action::SegmentUnmap, p - 20 * MIB, 20 * MIB),
            ],
            vec![run(
                p + 20 * MIB,
                20 * MIB,
                0,
                &[(0, 20 * MIB, 20 * MIB, true)],
            )],
        );
        let err = rec.faithful().unwrap_err().to_string();
        assert!(
            err.contains("entry 0: free at 0x7f18fec00000 of 512 bytes, a small pool block, in pages of the large pool"),
            "{err}"
        );
    }

    /// Large pages seen later inside pages mapped again outweigh small ones seen there, below
    /// them or above.
    #[test]
    fn large_pages_seen_inside_outweigh_small_ones() {
        use crate::pool::PoolKind::Large;
        let far = BASE + 100 * GIB;
        let rec = recording(
            vec![
                entry(Action::SegmentUnmap, far, 40 * MIB),
                entry(Action::SegmentMap, far + 20 * MIB, 20 * MIB),
                entry(Action::SegmentMap, far + 2 * MIB, 2 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(far + 2 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]),
                run(far + 20 * MIB, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)]),
            ],
        );
        assert_eq!(range_holding(&rec, far, None).map(|r| r.0), Some(Large));
    }

    /// The pages of their stream seen next to pages mapped again tell their pool when the two
    /// could share a range: right next to them, but not across another stream's pages.
    #[test]
    fn pages_seen_next_to_them_tell_unless_another_streams_lie_between() {
        use crate::pool::PoolKind::{Large, Small};
        let far = BASE + 100 * GIB;
        let large_run = || run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]);
        let small_at = |at: u64| run(at, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]);
        let adjacent = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                entry(Action::SegmentMap, far + 20 * MIB, 2 * MIB),
            ],
            vec![large_run(), small_at(far + 20 * MIB)],
        );
        assert_eq!(
            range_holding(&adjacent, far, None).map(|r| r.0),
            Some(Small)
        );
        let across = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                on(1, Action::SegmentMap, far + 20 * MIB, 20 * MIB),
                entry(Action::SegmentMap, far + 40 * MIB, 2 * MIB),
            ],
            vec![
                large_run(),
                run(far + 20 * MIB, 20 * MIB, 1, &[(0, 20 * MIB, 0, false)]),
                small_at(far + 40 * MIB),
            ],
        );
        assert_eq!(range_holding(&across, far, None).map(|r| r.0), Some(Large));
    }

    /// Another stream's pages seen across pages mapped again, from below their start, make
    /// pages of their own stream seen there only afterwards tell nothing.
    #[test]
    fn another_streams_pages_from_below_take_the_place_over() {
        use crate::pool::PoolKind::Large;
        let far = BASE + 100 * GIB;
        let rec = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                on(1, Action::SegmentMap, far - 20 * MIB, 40 * MIB),
                on(1, Action::SegmentUnmap, far - 20 * MIB, 40 * MIB),
                entry(Action::SegmentMap, far, 2 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(far, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]),
            ],
        );
        assert_eq!(range_holding(&rec, far, None).map(|r| r.0), Some(Large));
    }

    /// No device has less memory than the recording reserved: ranges placed so that they
    /// imply less do not size the start's ranges.
    #[test]
    fn an_estimate_below_the_reserved_memory_is_not_taken() {
        let above = BASE + 60 * MIB;
        let far = BASE + 100 * GIB;
        let rec = recording(
            vec![
                on(1, Action::SegmentMap, BASE, 20 * MIB),
                on(1, Action::Alloc, BASE, 20 * MIB),
                entry(Action::SegmentUnmap, far, 20 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(above, 60 * MIB, 0, &[(0, 60 * MIB, 60 * MIB, true)]),
                run(far + 60 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            ],
        );
        let start = rec.faithful().unwrap().start;
        let sizes: Vec<(u64, u64)> = start
            .ranges
            .iter()
            .filter(|r| r.pool == PoolKind::Large)
            .map(|r| (r.addr, r.size))
            .collect();
        // The new range 60 MiB below the start's would imply a device of 53 MiB, less than
        // the 102 MiB reserved: the start's range is sized as on a device of unknown memory,
        // up to the next range,
        assert_eq!(sizes, [(above, far - above)]);
        // and the pages unmapped at `far` are guessed as on such a device: one small range
        // holds them and the small pages 40 MiB above (not on a device of 53 MiB).
        assert_eq!(
            range_holding(&rec, far, None).map(|r| r.0),
            Some(PoolKind::Small)
        );
    }

    /// Pages mapped again by undoing an unmap that touch no run are the large pool's (whole
    /// 20 MiB pages) until a block placed in them says otherwise.
    #[test]
    fn an_unmapped_runs_pool_is_told_by_its_blocks() {
        let small = BASE + 100 * GIB;
        let rec = recording(
            vec![
                entry(Action::FreeCompleted, small + 512, 512),
                entry(Action::SegmentUnmap, small, 20 * MIB),
            ],
            vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)])],
        );
        let start = rec.faithful().unwrap().start;
        let pools: Vec<_> = start.ranges.iter().map(|r| (r.addr, r.pool)).collect();
        use crate::pool::PoolKind::{Large, Small};
        assert_eq!(pools, [(BASE, Large), (small, Small)]);
        // Not whole large pages: the small pool's at once.
        let rec = recording(
            vec![entry(Action::SegmentUnmap, small, 6 * MIB)],
            vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)])],
        );
        let start = rec.faithful().unwrap().start;
        assert_eq!(start.ranges[1].pool, Small);
    }

    /// Wholly free pages the trace only unmaps take the pool of pages seen at their place
    /// later, else of the nearest pages of their stream that could share a range with them.
    #[test]
    fn an_unmapped_runs_pool_is_told_by_pages_around_it() {
        use crate::pool::PoolKind::{Large, Small};
        let far = BASE + 100 * GIB;
        let pool_at =
            |rec: &DeviceRecording, addr: u64| range_holding(rec, addr, None).map(|r| r.0);
        // The same pages mapped again later, one small page.
        let rec = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                entry(Action::SegmentMap, far, 2 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(far, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]),
            ],
        );
        assert_eq!(pool_at(&rec, far), Some(Small));
        // A small run of the stream nearer than the large one; one of another stream nearer
        // still does not count.
        let near = far + 60 * MIB;
        let rec = recording(
            vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(far - 6 * MIB, 2 * MIB, 1, &[(0, 2 * MIB, 512, true)]),
                run(near, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            ],
        );
        assert_eq!(pool_at(&rec, far), Some(Small));
        // A large run next to it, but not whole large pages away: it cannot share a range.
        let rec = recording(
            vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
            vec![
                run(BASE, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
                run(
                    far + 22 * MIB,
                    20 * MIB,
                    0,
                    &[(0, 20 * MIB, 20 * MIB, true)],
                ),
            ],
        );
        assert_eq!(pool_at(&rec, far), Some(Small));
        let rec = recording(
            vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
            vec![run(
                far + 40 * MIB,
                20 * MIB,
                0,
                &[(0, 20 * MIB, 20 * MIB, true)],
            )],
        );
        assert_eq!(pool_at(&rec, far), Some(Large));
    }

    /// Once all of a stream's pages are unmapped, PyTorch has given its ranges back, and those
    /// it reserves again may swap places: pages seen later at the place of wholly free pages
    /// unmapped before then do not tell their pool.
    #[test]
    fn pages_seen_after_the_streams_ranges_were_given_back_do_not_tell_a_pool() {
        use crate::pool::PoolKind::{Large, Small};
        let (far, top) = (BASE + 100 * GIB, BASE + 200 * GIB);
        // Large pages at `far` and small ones at `top` unmapped (empty_cache()), then the
        // small pool's range reserved at `far` and the large pool's at `top`.
        let swapped = |kept: Vec<RecordedSegment>| {
            let runs = [
                run(far, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
                run(top, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            ];
            recording(
                vec![
                    entry(Action::SegmentUnmap, far, 20 * MIB),
                    entry(Action::SegmentUnmap, top, 2 * MIB),
                    entry(Action::SegmentMap, far, 2 * MIB),
                    entry(Action::Alloc, far, 512),
                    entry(Action::SegmentMap, top, 20 * MIB),
                    entry(Action::Alloc, top, 20 * MIB),
                ],
                kept.into_iter().chain(runs).collect(),
            )
        };
        let pool_at = |rec: &DeviceRecording, addr: u64| {
            let start = rec.faithful().unwrap().start;
            let run = start.ranges.iter().flat_map(|r| &r.runs);
            run.filter(|x| x.addr == addr).map(|x| x.pool).next()
        };
        let rec = swapped(Vec::new());
        assert_eq!(pool_at(&rec, far), Some(Large));
        assert_eq!(pool_at(&rec, top), Some(Small));
        // With other pages of the stream mapped all along, no range was given back: the small
        // pages seen at `far` say what its pages were.
        let rec = swapped(vec![run(
            BASE,
            20 * MIB,
            0,
            &[(0, 20 * MIB, 20 * MIB, true)],
        )]);
        assert_eq!(pool_at(&rec, far), Some(Small));
    }

    /// The small pool maps its stream's lowest unmapped page, so wholly free pages the trace
    /// only unmaps were not small pages of their stream when, with the stream's small range
    /// kept, its small pool maps a page above them later and none at them; nor when a small
    /// range holding them and the small pages seen would span more than the device's memory.
    #[test]
    fn an_unmapped_runs_pool_is_not_small_where_the_small_pool_could_not_have_it() {
        use crate::pool::PoolKind::{Large, Small};
        let far = BASE + 100 * GIB;
        let pool_at = |rec: &DeviceRecording, addr: u64, memory: Option<u64>| {
            range_holding(rec, addr, memory).map(|r| r.0)
        };
        let large_run = || run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]);
        // The stream's small range, kept: pages mapped below the large run.
        let kept_small = || run(BASE - 100 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]);
        // Small pages of the stream mapped later inside the pages: those at their start tell;
        // one above their start alone does not, while the small range is kept (the map would
        // have taken the lowest of them), and does when it may have been given back.
        let inside = |at: &[u64], kept: bool| {
            let maps = at.iter().map(|&a| entry(Action::SegmentMap, a, 2 * MIB));
            let runs = at
                .iter()
                .map(|&a| run(a, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]));
            let held = [large_run()].into_iter().chain(kept.then(kept_small));
            let entries = [entry(Action::SegmentUnmap, far, 20 * MIB)];
            recording(
                entries.into_iter().chain(maps).collect(),
                held.chain(runs).collect(),
            )
        };
        assert_eq!(
            pool_at(&inside(&[far, far + 2 * MIB], true), far, None),
            Some(Small)
        );
        assert_eq!(
            pool_at(&inside(&[far + 4 * MIB], true), far, None),
            Some(Large)
        );
        assert_eq!(
            pool_at(&inside(&[far + 4 * MIB], false), far, None),
            Some(Small)
        );
        // Pages of the stream at their start seen only after another stream's there: the range
        // was given back and reserved again in between, and they tell nothing.
        let taken_over = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                on(1, Action::SegmentMap, far, 40 * MIB),
                on(1, Action::SegmentUnmap, far, 40 * MIB),
                entry(Action::SegmentMap, far, 2 * MIB),
            ],
            vec![large_run(), run(far, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)])],
        );
        assert_eq!(pool_at(&taken_over, far, None), Some(Large));
        // One mapped later above them, after an `empty_cache()` (an unmap just before a map
        // would be a release for want of memory, which bounds the capacity).
        let above = far + 60 * MIB;
        let after_empty_cache = |kept: bool| {
            let held = [run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])].into_iter();
            recording(
                vec![
                    entry(Action::SegmentUnmap, far, 20 * MIB),
                    entry(Action::Alloc, BASE, 20 * MIB),
                    entry(Action::FreeCompleted, BASE, 20 * MIB),
                    entry(Action::SegmentMap, above, 2 * MIB),
                ],
                held.chain(kept.then(kept_small))
                    .chain([run(above, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)])])
                    .collect(),
            )
        };
        assert_eq!(after_empty_cache(true).capacity(), None);
        assert_eq!(pool_at(&after_empty_cache(true), far, None), Some(Large));
        assert_eq!(pool_at(&after_empty_cache(false), far, None), Some(Small));
        // Small pages at `at` in the snapshot (mapped before the trace, perhaps).
        let small_at = |at: u64| {
            recording(
                vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
                vec![large_run(), run(at, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)])],
            )
        };
        assert_eq!(pool_at(&small_at(above), far, None), Some(Small));
        // Small pages 10 GiB above: one small range holds both only on a device of more than
        // 10 GiB, whose small pool had them all mapped at once.
        let rec = small_at(far + 10 * GIB);
        assert_eq!(pool_at(&rec, far, None), Some(Small));
        assert_eq!(pool_at(&rec, far, Some(16 * GIB)), Some(Small));
        assert_eq!(pool_at(&rec, far, Some(8 * GIB)), Some(Large));
    }

    /// Without the device's memory, the pools are guessed again under the memory the start's
    /// ranges are sized with: here the memory that two ranges the recording reserves, one
    /// right below the other, imply.
    #[test]
    fn an_unmapped_runs_pool_is_guessed_again_under_the_estimated_memory() {
        use crate::pool::PoolKind::{Large, Small};
        use crate::pool::range_size;
        let far = BASE + 100 * GIB;
        let high = far + 10 * GIB;
        let top = far + 40 * GIB;
        let below_top = top - range_size(8 * GIB, PoolKind::Large);
        let rec = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                on(1, Action::SegmentMap, top, 20 * MIB),
                on(1, Action::Alloc, top, 20 * MIB),
                on(2, Action::SegmentMap, below_top, 20 * MIB),
                on(2, Action::Alloc, below_top, 20 * MIB),
            ],
            vec![
                run(high, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
                run(top, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(below_top, 20 * MIB, 2, &[(0, 20 * MIB, 20 * MIB, true)]),
            ],
        );
        let pool_at = |memory: Option<u64>| range_holding(&rec, far, memory);
        // 10 GiB from the small pages: on a device of 16 GiB, one small range holds both.
        assert_eq!(pool_at(Some(16 * GIB)).unwrap().0, Small);
        // The recording's ranges imply about 8 GiB: then it cannot.
        let (pool, size) = pool_at(None).unwrap();
        assert_eq!((pool, size), (Large, range_size(8 * GIB, PoolKind::Large)));
    }

    /// A capacity the recording only brackets bounds what the device could map by the
    /// bracket's top, in the second walk too (not by its middle, which a replay runs with).
    #[test]
    fn a_bracketed_capacity_bounds_the_guesses_by_its_top() {
        use crate::pool::PoolKind::{Large, Small};
        use crate::trace::CapacityEstimate;
        let far = BASE + 100 * GIB;
        let rec = recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
                entry(Action::Alloc, BASE + 20 * MIB, 20 * MIB),
            ],
            vec![
                run(
                    BASE,
                    40 * MIB,
                    0,
                    &[
                        (0, 20 * MIB, 20 * MIB, true),
                        (20 * MIB, 20 * MIB, 20 * MIB, true),
                    ],
                ),
                run(far + 56 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            ],
        );
        // The unmap released cached pages for the map after it, which did not fit.
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Bracket {
                low: 42 * MIB,
                high: 62 * MIB
            })
        );
        let pool_at = |memory: Option<u64>| range_holding(&rec, far, memory).map(|r| r.0);
        // The unmapped pages and the small ones span 58 MiB: a device of up to 62 MiB could
        // have had them all mapped.
        assert_eq!(pool_at(None), Some(Small));
        assert_eq!(pool_at(Some(62 * MIB)), Some(Small));
        assert_eq!(pool_at(Some(56 * MIB)), Some(Large));
    }

    /// The device memory, when known (`--device-memory`), sizes the ranges there at the start.
    #[test]
    fn a_known_device_memory_sizes_the_start_ranges() {
        use crate::pool::range_size;
        let rec = recording(
            vec![entry(Action::FreeCompleted, BASE, 20 * MIB)],
            vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])],
        );
        for memory in [8 * GIB, 80 * GIB] {
            let start = rec.faithful_on(Some(memory)).unwrap().start;
            let sizes: Vec<u64> = start.ranges.iter().map(|r| r.size).collect();
            assert_eq!(sizes, [range_size(memory, PoolKind::Large)]);
        }
    }

    /// A range there at the start ends short of a range the recording reserves above it while
    /// it is kept, and only then: one reserved far above leaves its size as it is.
    #[test]
    fn a_start_range_ends_only_where_a_later_range_is_reserved_within_it() {
        use crate::pool::range_size;
        let full = range_size(8 * GIB, PoolKind::Large);
        let start_sizes = |later: u64| {
            let rec = recording(
                vec![
                    on(1, Action::SegmentMap, later, 20 * MIB),
                    on(1, Action::Alloc, later, 20 * MIB),
                ],
                vec![
                    run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                    run(later, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)]),
                ],
            );
            let start = rec.faithful_on(Some(8 * GIB)).unwrap().start;
            start
                .ranges
                .iter()
                .map(|r| (r.size, r.cut_short))
                .collect::<Vec<_>>()
        };
        assert_eq!(start_sizes(BASE + 100 * GIB), [(full, false)]);
        // 1 GiB up to it: 51 whole pages.
        assert_eq!(start_sizes(BASE + GIB), [(51 * 20 * MIB, true)]);
    }

    /// A private pool's run at the start lies in a range of its own, apart from a run of the
    /// default pool of the same stream and pool of pages next to it.
    #[test]
    fn a_private_pools_run_at_the_start_has_a_range_of_its_own() {
        let rec = recording(
            vec![entry(Action::FreeCompleted, BASE, 20 * MIB)],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)]),
                RecordedSegment {
                    private_pool: Some((1, 2)),
                    ..run(BASE + 60 * MIB, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])
                },
            ],
        );
        let (_, ranges) = start_of(&rec);
        assert_eq!(ranges, [(BASE, 1), (BASE + 60 * MIB, 1)]);
    }

    /// A range's pages unmapped before the recording and mapped again in it lie below its
    /// lowest run at the start: the range reaches down to them, and the replay maps them where
    /// the recording did.
    #[test]
    fn a_range_reaches_down_to_pages_mapped_below_it() {
        let rec = recording(
            vec![
                entry(Action::SegmentMap, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 20 * MIB),
                entry(Action::SegmentMap, BASE + 40 * MIB, 100 * MIB),
                entry(Action::Alloc, BASE + 40 * MIB, 100 * MIB),
            ],
            vec![run(
                BASE,
                140 * MIB,
                0,
                &[
                    (0, 20 * MIB, 20 * MIB, true),
                    (20 * MIB, 20 * MIB, 20 * MIB, true),
                    (40 * MIB, 100 * MIB, 100 * MIB, true),
                ],
            )],
        );
        let start = rec.faithful().unwrap().start;
        let ranges: Vec<_> = start
            .ranges
            .iter()
            .map(|r| (r.addr, r.runs[0].addr))
            .collect();
        assert_eq!(ranges, [(BASE, BASE + 20 * MIB)]);
        let out = replayed(&rec);
        assert_eq!(out.allocs_at_recorded_addr, 2);
        assert_eq!(out.stats.counts.num_device_alloc, 2);
        assert_eq!(out.stats.reserved_bytes.all.peak as u64, 140 * MIB);
    }

    /// A segment of its own ending right where such pages begin does not stop the range
    /// reaching down to them.
    #[test]
    fn a_range_reaches_down_to_a_segment_right_below() {
        let rec = recording(
            vec![
                entry(Action::SegmentMap, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 20 * MIB),
            ],
            vec![
                segment(BASE - 20 * MIB, 20 * MIB, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(
                    BASE,
                    40 * MIB,
                    0,
                    &[
                        (0, 20 * MIB, 20 * MIB, true),
                        (20 * MIB, 20 * MIB, 20 * MIB, true),
                    ],
                ),
            ],
        );
        let start = rec.faithful().unwrap().start;
        let ranges: Vec<_> = start
            .ranges
            .iter()
            .map(|r| (r.addr, r.runs[0].addr))
            .collect();
        assert_eq!(ranges, [(BASE, BASE + 20 * MIB)]);
    }

    /// Nor does a range reach down across a segment of its own lying between: the map below
    /// is in another range.
    #[test]
    fn a_range_does_not_reach_down_across_a_segment() {
        let high = BASE + 40 * MIB;
        let rec = recording(
            vec![
                entry(Action::SegmentMap, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 20 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                segment(BASE + 20 * MIB, 20 * MIB, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(high, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            ],
        );
        let start = rec.faithful().unwrap().start;
        let ranges: Vec<_> = start.ranges.iter().map(|r| r.addr).collect();
        assert_eq!(ranges, [high]);
    }

    /// A range all of whose pages `empty_cache()` unmaps is given back; pages mapped at its
    /// place afterwards reserve a range again (where the recording's was).
    #[test]
    fn a_range_given_back_in_the_trace_is_reserved_again() {
        let rec = recording(
            vec![
                entry(Action::FreeCompleted, BASE, 30 * MIB),
                at(Action::SegmentUnmap, BASE, 40 * MIB, CallSite::EmptyCache),
                entry(Action::SegmentMap, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 10 * MIB),
                entry(Action::SegmentMap, BASE + 20 * MIB, 40 * MIB),
                entry(Action::Alloc, BASE + 10 * MIB, 40 * MIB),
            ],
            vec![run(
                BASE,
                60 * MIB,
                0,
                &[
                    (0, 10 * MIB, 10 * MIB, true),
                    (10 * MIB, 40 * MIB, 40 * MIB, true),
                    (50 * MIB, 10 * MIB, 0, false),
                ],
            )],
        );
        let out = replayed(&rec);
        assert_eq!(out.allocs_at_recorded_addr, 2);
        assert_eq!(out.empty_cache_calls, 1);
        let counts = &out.stats.counts;
        assert_eq!((counts.num_device_alloc, counts.num_device_free), (2, 1));
    }

    /// A range reserved during the recording goes where the recording's driver put it, though
    /// the trace maps pages of a range that was there before it first: that map reserves
    /// nothing.
    #[test]
    fn ranges_reserved_before_the_trace_are_not_reserved_again() {
        let later = BASE + 100 * GIB;
        let rec = recording(
            vec![
                on(0, Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
                on(0, Action::Alloc, BASE + 20 * MIB, 4 * MIB),
                on(1, Action::SegmentMap, later, 20 * MIB),
                on(1, Action::Alloc, later, 4 * MIB),
            ],
            vec![
                grown_by_a_map(),
                run(
                    later,
                    20 * MIB,
                    1,
                    &[(0, 4 * MIB, 4 * MIB, true), (4 * MIB, 16 * MIB, 0, false)],
                ),
            ],
        );
        let f = rec.faithful().unwrap();
        let hints = crate::trace::ranges::range_hints(&f.range_changes, None);
        assert_eq!(hints.addresses(), [later]);
        let out = replayed(&rec);
        assert_eq!(out.allocs_at_recorded_addr, 2);
        assert_eq!(out.stats.counts.num_device_alloc, 2);
    }

    /// A recording whose walk meets pages that cannot be so is refused, naming the entry.
    #[test]
    fn impossible_pages_are_refused_by_entry() {
        let end = vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])];
        let cases = [
            (
                vec![
                    entry(Action::SegmentMap, BASE, 20 * MIB),
                    entry(Action::FreeCompleted, BASE, 2 * MIB),
                ],
                "entry 0: segment_map at 0x7f0000000000, but the block at 0x7f0000000000 in its \
                 pages is live later",
            ),
            (
                vec![entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB)],
                "entry 0: segment_map of 20971520 bytes at 0x7f0001400000, but those pages are \
                 not all mapped later",
            ),
            (
                vec![entry(Action::SegmentUnmap, BASE, 20 * MIB)],
                "entry 0: segment_unmap of 20971520 bytes at 0x7f0000000000, but the pages at \
                 0x7f0000000000 are mapped later",
            ),
            (
                vec![entry(Action::FreeCompleted, BASE, 512)],
                "entry 0: free at 0x7f0000000000 of 512 bytes, a small pool block, in pages of \
                 the large pool",
            ),
            (
                vec![entry(Action::FreeCompleted, BASE + 19 * MIB, 2 * MIB)],
                "reaches past the mapped pages, which end at 0x7f0001400000",
            ),
            (
                vec![entry(Action::SegmentMap, BASE, 22 * MIB)],
                "segment_map of 23068672 bytes at 0x7f0000000000: neither one 2 MiB page",
            ),
            (
                vec![entry(Action::SegmentUnmap, BASE + 40 * MIB, 0)],
                "segment_unmap of 0 bytes at 0x7f0002800000: not whole pages",
            ),
            (
                vec![
                    entry(Action::FreeCompleted, BASE, 4 * MIB),
                    entry(Action::FreeCompleted, BASE, 4 * MIB),
                ],
                "entry 0: free at 0x7f0000000000, but a block is still live there",
            ),
            // Pages mapped again by undoing an unmap: a guess of their pool stands only until
            // a block placed in them says which.
            (
                vec![
                    entry(Action::FreeCompleted, BASE + 44 * MIB, 512),
                    entry(Action::FreeCompleted, BASE + 40 * MIB, 4 * MIB),
                    entry(Action::SegmentUnmap, BASE + 40 * MIB, 20 * MIB),
                ],
                "entry 0: free at 0x7f0002c00000 of 512 bytes, a small pool block, in pages of \
                 the large pool",
            ),
        ];
        for (entries, want) in cases {
            let rec = recording(entries, end.clone());
            let err = rec.faithful().unwrap_err().to_string();
            assert!(err.contains(want), "{err}\nwants: {want}");
        }
        // Pages of stream 0 mapped by a map on stream 1.
        let rec = recording(vec![on(1, Action::SegmentMap, BASE, 20 * MIB)], end.clone());
        let err = rec.faithful().unwrap_err().to_string();
        let want = "entry 0: segment_map at 0x7f0000000000 on stream 1, in pages of stream 0";
        assert!(err.contains(want), "{err}\nwants: {want}");
        // Pages mapped where a segment of its own (cudaMalloc'd) lies later.
        let native = segment(BASE + 40 * MIB, 20 * MIB, &[(0, 20 * MIB, 0, false)]);
        let rec = recording(
            vec![entry(Action::SegmentMap, BASE + 40 * MIB, 20 * MIB)],
            [end.clone(), vec![native]].concat(),
        );
        let err = rec.faithful().unwrap_err().to_string();
        let want = "entry 0: segment_map at 0x7f0002800000, inside the segment at 0x7f0002800000, \
                    which is not expandable";
        assert!(err.contains(want), "{err}\nwants: {want}");
    }
}
