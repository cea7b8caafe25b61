//! The invariant walker: checks the whole pool after any step (tests call it constantly).
//!
//! No overlap between segments; blocks tile each segment with symmetric neighbour links; no two
//! free neighbours left unmerged; the free indexes hold exactly the free blocks; the block table
//! finds every block at its slot; the pending queue names exactly the pending blocks; every
//! stat equals a recount.

use super::allocator::DeviceAllocator;
use super::block::{BlockState, NIL, NextLink};
use super::stats::StatArray;
use super::types::PoolKind;
use crate::backend::Backend;
use std::collections::HashSet;

impl<B: Backend> DeviceAllocator<B> {
    /// Check every invariant; the error names the first one broken.
    pub fn validate(&self) -> Result<(), String> {
        let segments = self.whole_segments();
        let mut recount = Recount::default();
        let mut prev_end = 0u64;
        let mut block_count = 0usize;
        for seg in &segments {
            if seg.addr < prev_end {
                return Err(format!("segment {:#x} overlaps the previous one", seg.addr));
            }
            prev_end = seg.addr + seg.size;
            match self.segments.get(seg.addr) {
                Some(size) if size == seg.size => {}
                other => {
                    return Err(format!(
                        "segment {:#x}: blocks add up to {} but the segment table says {other:?}",
                        seg.addr, seg.size
                    ));
                }
            }
            if seg.expandable {
                check_expandable(seg)?;
                let mapped = seg
                    .blocks
                    .iter()
                    .filter(|b| b.state != BlockState::Unmapped);
                recount.mapped(seg.pool, mapped.map(|b| b.size).sum());
            } else {
                recount.segment(seg.pool, seg.size);
            }
            // PyTorch counts no inactive splits in expandable segments.
            let split = seg.blocks.len() > 1 && !seg.expandable;
            let mut cursor = seg.addr;
            let mut prev_state = None;
            for b in &seg.blocks {
                block_count += 1;
                if b.addr != cursor {
                    return Err(format!(
                        "block {:#x} is not contiguous (expected {cursor:#x})",
                        b.addr
                    ));
                }
                cursor += b.size;
                if matches!(b.state, BlockState::Free | BlockState::Unmapped)
                    && prev_state == Some(b.state)
                {
                    return Err(format!(
                        "{:?} block {:#x} was not merged with its neighbour",
                        b.state, b.addr
                    ));
                }
                prev_state = Some(b.state);
                recount.block(seg.pool, b.state, b.size, b.requested, split);
            }
        }
        if self.segments.len() != segments.len() {
            return Err(format!(
                "segment table has {} entries but {} segments have blocks",
                self.segments.len(),
                segments.len()
            ));
        }
        if block_count != self.blocks.len() {
            return Err(format!(
                "{} blocks live but {block_count} reachable",
                self.blocks.len()
            ));
        }
        self.blocks.check()?;
        self.check_unmapped_sets()?;
        self.check_links()?;
        self.check_indexes()?;
        self.check_stats(&recount)
    }

    /// The unmapped sets list exactly the unmapped blocks, each under its pool and stream.
    fn check_unmapped_sets(&self) -> Result<(), String> {
        let mut count = 0;
        for (_, b) in self.blocks.iter() {
            if b.state != BlockState::Unmapped {
                continue;
            }
            count += 1;
            if !b.expandable {
                return Err(format!("unmapped block {:#x} is not expandable", b.addr));
            }
            if !self.unmapped.of(b.pool).contains(&(b.stream, b.addr)) {
                return Err(format!("unmapped block {:#x} is not in its set", b.addr));
            }
        }
        if count != self.unmapped.len() {
            return Err(format!(
                "{count} unmapped blocks but {} in the unmapped sets",
                self.unmapped.len()
            ));
        }
        Ok(())
    }

    fn check_links(&self) -> Result<(), String> {
        for (id, b) in self.blocks.iter() {
            if b.next != NIL {
                let n = self.blocks.get(b.next);
                // Neighbours share their segment's pool, stream and kind.
                if n.prev != id
                    || n.addr != b.end()
                    || n.pool != b.pool
                    || n.stream != b.stream
                    || n.expandable != b.expandable
                {
                    return Err(format!("block {:#x}: next link is not symmetric", b.addr));
                }
            }
            if b.prev != NIL && self.blocks.get(b.prev).next != id {
                return Err(format!("block {:#x}: prev link is not symmetric", b.addr));
            }
        }
        Ok(())
    }

    fn check_indexes(&self) -> Result<(), String> {
        let mut indexed = HashSet::new();
        for (pool, pools) in [
            (PoolKind::Small, &self.small),
            (PoolKind::Large, &self.large),
        ] {
            for (stream, index) in &pools.streams {
                for e in index.iter() {
                    let b = self.blocks.get(e.id);
                    if b.state != BlockState::Free || b.addr != e.addr || b.size != e.size {
                        return Err(format!(
                            "free index entry {:#x} does not match its block",
                            e.addr
                        ));
                    }
                    // (Only the native path reads it: expandable segments read the block.)
                    if !b.expandable && e.link != NextLink::of(b) {
                        return Err(format!(
                            "free index entry {:#x}: next link or split flag stale",
                            e.addr
                        ));
                    }
                    if b.pool != pool || b.stream != *stream {
                        return Err(format!("block {:#x} is indexed in the wrong pool", e.addr));
                    }
                    if !indexed.insert(e.id) {
                        return Err(format!("block {:#x} is indexed twice", e.addr));
                    }
                }
            }
        }
        let free = self
            .blocks
            .iter()
            .filter(|(_, b)| b.state == BlockState::Free)
            .count();
        if free != indexed.len() {
            return Err(format!("{free} free blocks but {} indexed", indexed.len()));
        }
        let pending: HashSet<_> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.state == BlockState::Pending)
            .map(|(id, _)| id)
            .collect();
        let in_queue: HashSet<_> = self.pending.iter().map(|&(_, id)| id).collect();
        let queued: HashSet<_> = in_queue
            .iter()
            .chain(self.stream_pending.values())
            .chain(&self.held)
            .copied()
            .collect();
        let entries = self.pending_frees() + self.held.len();
        if queued != pending || entries != pending.len() {
            return Err(format!(
                "{} pending blocks, {entries} queue entries naming {} blocks, not all of them \
                 pending",
                pending.len(),
                queued.len()
            ));
        }
        let mut waiting = self
            .held_until_sync
            .iter()
            .chain(&self.held_until_device_sync)
            .chain(&self.held_past_device_sync);
        if let Some(id) = waiting.find(|id| !self.held.contains(id)) {
            return Err(format!(
                "block {id} waits for a synchronization but its free was not requested"
            ));
        }
        if let Some(id) = self.then_streams.keys().find(|id| !in_queue.contains(id)) {
            return Err(format!(
                "block {id} waits for streams after a fence but is not waiting for one"
            ));
        }
        Ok(())
    }

    fn check_stats(&self, r: &Recount) -> Result<(), String> {
        let s = &self.stats.snapshot();
        let pairs: [(&str, &StatArray, &[i64; 2]); 9] = [
            ("segment", &s.segment, &r.segment),
            ("reserved_bytes", &s.reserved_bytes, &r.reserved_bytes),
            ("allocation", &s.allocation, &r.allocation),
            ("allocated_bytes", &s.allocated_bytes, &r.allocated_bytes),
            ("active", &s.active, &r.active),
            ("active_bytes", &s.active_bytes, &r.active_bytes),
            ("requested_bytes", &s.requested_bytes, &r.requested_bytes),
            ("inactive_split", &s.inactive_split, &r.inactive_split),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &r.inactive_split_bytes,
            ),
        ];
        for (name, stat, expect) in pairs {
            let got = [stat.small_pool.current, stat.large_pool.current];
            if got != *expect || stat.all.current != expect[0] + expect[1] {
                return Err(format!(
                    "{name}: stats say all={} small={} large={}, recount small={} large={}",
                    stat.all.current, got[0], got[1], expect[0], expect[1]
                ));
            }
        }
        if self.total_reserved as i64 != s.reserved_bytes.all.current {
            return Err("total reserved differs from reserved_bytes".into());
        }
        Ok(())
    }
}

/// An expandable segment's blocks are all expandable, of one page size, and its unmapped
/// blocks start and end on its pages.
fn check_expandable(seg: &super::layout::SegmentView) -> Result<(), String> {
    let page = super::expandable::page_size(seg.pool);
    if !seg.size.is_multiple_of(page) {
        return Err(format!(
            "expandable segment {:#x}: {} bytes is not a whole number of pages",
            seg.addr, seg.size
        ));
    }
    let unaligned = seg.blocks.iter().find(|b| {
        b.state == BlockState::Unmapped
            && (!(b.addr - seg.addr).is_multiple_of(page) || !b.size.is_multiple_of(page))
    });
    if let Some(b) = unaligned {
        return Err(format!(
            "unmapped block {:#x} of {} bytes is not on page boundaries",
            b.addr, b.size
        ));
    }
    Ok(())
}

/// Stats recomputed from the layout, [small, large].
#[derive(Default)]
struct Recount {
    segment: [i64; 2],
    reserved_bytes: [i64; 2],
    allocation: [i64; 2],
    allocated_bytes: [i64; 2],
    active: [i64; 2],
    active_bytes: [i64; 2],
    requested_bytes: [i64; 2],
    inactive_split: [i64; 2],
    inactive_split_bytes: [i64; 2],
}

impl Recount {
    fn segment(&mut self, pool: PoolKind, size: u64) {
        self.segment[pool as usize] += 1;
        self.mapped(pool, size);
    }

    /// Bytes reserved without a segment counted (the mapped pages of an expandable segment).
    fn mapped(&mut self, pool: PoolKind, size: u64) {
        self.reserved_bytes[pool as usize] += size as i64;
    }

    fn block(&mut self, pool: PoolKind, state: BlockState, size: u64, requested: u64, split: bool) {
        let i = pool as usize;
        let size = size as i64;
        match state {
            BlockState::Allocated => {
                self.allocation[i] += 1;
                self.allocated_bytes[i] += size;
                self.active[i] += 1;
                self.active_bytes[i] += size;
                self.requested_bytes[i] += requested as i64;
            }
            BlockState::Pending => {
                self.active[i] += 1;
                self.active_bytes[i] += size;
                self.requested_bytes[i] += requested as i64;
            }
            BlockState::Free if split => {
                self.inactive_split[i] += 1;
                self.inactive_split_bytes[i] += size;
            }
            BlockState::Free | BlockState::Unmapped => {}
        }
    }
}
