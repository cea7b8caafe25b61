//! What `cachealloc state` prints: the memory state and the request's outcome, as one JSON
//! object or as a readable report.

use crate::outcome::counted;
use crate::request_report::RequestJson;
use cachealloc::pool::format_size;
use cachealloc::trace::memory_state::{FreeBlock, PoolMemory, StreamMemory};
use cachealloc::trace::{DeviceRecording, MemoryState};
use serde::Serialize;

/// How many of the largest free cached blocks the readable report lists.
const LISTED_IN_TEXT: usize = 5;

/// One pool's (or both pools') figures.
#[derive(Serialize)]
struct PoolJson {
    segments: usize,
    reserved_bytes: u64,
    allocated_bytes: u64,
    requested_bytes: u64,
    pending_free_bytes: u64,
    free_bytes: u64,
    free_blocks: usize,
    largest_free_block_bytes: u64,
    /// Wholly free segments (returned to the device when a request finds no room, or by
    /// empty_cache()) and their bytes; the rest of the free bytes lie in segments that also
    /// hold allocations.
    free_segments: usize,
    free_segment_bytes: u64,
}

impl From<PoolMemory> for PoolJson {
    fn from(p: PoolMemory) -> Self {
        PoolJson {
            segments: p.segments,
            reserved_bytes: p.reserved,
            allocated_bytes: p.allocated,
            requested_bytes: p.requested,
            pending_free_bytes: p.pending_free,
            free_bytes: p.free,
            free_blocks: p.free_blocks,
            largest_free_block_bytes: p.largest_free_block,
            free_segments: p.free_segments,
            free_segment_bytes: p.free_segment_bytes,
        }
    }
}

#[derive(Serialize)]
struct PoolsJson {
    /// The default pools, which serve requests outside CUDA graph captures and MemPools.
    small: PoolJson,
    large: PoolJson,
    /// The private pools (CUDA graphs', torch.cuda.MemPools'), small and large together; null
    /// when the snapshot has none.
    private: Option<PoolJson>,
    /// Their ids (`segment_pool_id`).
    private_pool_ids: Vec<[u64; 2]>,
    /// Every pool: what PyTorch's statistics count ("reserved in total by PyTorch").
    all: PoolJson,
}

#[derive(Serialize)]
struct StreamJson {
    stream: u64,
    reserved_bytes: u64,
    free_bytes: u64,
    largest_free_block_bytes: u64,
}

impl From<&StreamMemory> for StreamJson {
    fn from(s: &StreamMemory) -> Self {
        StreamJson {
            stream: s.stream.0,
            reserved_bytes: s.reserved,
            free_bytes: s.free,
            largest_free_block_bytes: s.largest_free_block,
        }
    }
}

#[derive(Serialize)]
struct FreeBlockJson {
    address: u64,
    size: u64,
    pool: &'static str,
    stream: u64,
}

impl From<&FreeBlock> for FreeBlockJson {
    fn from(b: &FreeBlock) -> Self {
        FreeBlockJson {
            address: b.addr,
            size: b.size,
            pool: b.pool.name(),
            stream: b.stream.0,
        }
    }
}

/// The report, in the shape of the `--json` output.
#[derive(Serialize)]
pub(crate) struct StateJson {
    snapshot: String,
    device: i32,
    settings: String,
    /// Entries of the device's allocation trace.
    trace_entries: usize,
    /// The trace allocates: `cachealloc replay` can replay it.
    replayable: bool,
    /// The command that replays the device's trace, when it has one to replay.
    replay_command: Option<String>,
    /// The segments are expandable (pages mapped into reserved ranges): free pages are
    /// unmapped when a request finds no room, so pieces of free memory matter less.
    expandable_segments: bool,
    /// Native segments too, beside the expandable ones (expandable segments turned on while the
    /// program ran, or a CUDA graph's private pool kept on native segments).
    both_segment_kinds: bool,
    pools: PoolsJson,
    /// The default pools together: what the sentences on free memory speak of.
    #[serde(skip)]
    default_pools: PoolJson,
    streams: Vec<StreamJson>,
    /// The largest free cached blocks, largest first.
    largest_free_blocks: Vec<FreeBlockJson>,
    request: Option<RequestJson>,
}

impl StateJson {
    pub(crate) fn new(
        path: &str,
        rec: &DeviceRecording,
        memory: &MemoryState,
        settings: String,
        request: Option<RequestJson>,
        replay_command: Option<String>,
    ) -> Self {
        StateJson {
            snapshot: path.to_string(),
            device: rec.device.0,
            settings,
            trace_entries: rec.entries.len(),
            replayable: replay_command.is_some(),
            replay_command,
            expandable_segments: rec.segments.iter().any(|s| s.is_expandable),
            both_segment_kinds: rec.segments.iter().any(|s| s.is_expandable)
                && rec.segments.iter().any(|s| !s.is_expandable),
            pools: PoolsJson {
                small: memory.small.into(),
                large: memory.large.into(),
                private: (!memory.private_pools.is_empty()).then(|| memory.private.into()),
                private_pool_ids: memory.private_pools.iter().map(|&(a, b)| [a, b]).collect(),
                all: memory.total().into(),
            },
            default_pools: memory.default_pools().into(),
            streams: memory.streams.iter().map(StreamJson::from).collect(),
            largest_free_blocks: memory
                .largest_free_blocks
                .iter()
                .map(FreeBlockJson::from)
                .collect(),
            request,
        }
    }

    pub(crate) fn to_text(&self) -> String {
        let mut out = format!(
            "{}, device {}: the memory state when the snapshot was taken",
            self.snapshot, self.device
        );
        out += &match &self.replay_command {
            Some(command) => format!(" (its trace can be replayed: {command})\n"),
            None => " (it holds no allocation trace to replay)\n".to_string(),
        };
        out += &format!("Settings: {}\n\n", self.settings);
        out += &format!(
            "{:<11}{:>9}{:>14}{:>14}{:>14}{:>14}{:>8}{:>14}\n",
            "",
            "segments",
            "reserved",
            "allocated",
            "requested",
            "free cached",
            "blocks",
            "largest free"
        );
        let mut rows = vec![
            ("large pool", &self.pools.large),
            ("small pool", &self.pools.small),
        ];
        if let Some(private) = &self.pools.private {
            rows.push(("private", private));
        }
        rows.push(("all", &self.pools.all));
        for (name, p) in rows {
            out += &format!(
                "{:<11}{:>9}{:>14}{:>14}{:>14}{:>14}{:>8}{:>14}\n",
                name,
                p.segments,
                format_size(p.reserved_bytes),
                format_size(p.allocated_bytes),
                format_size(p.requested_bytes),
                format_size(p.free_bytes),
                p.free_blocks,
                format_size(p.largest_free_block_bytes)
            );
        }
        out += "\n";
        out += &self.private_pools_sentence();
        let all = &self.default_pools;
        if all.pending_free_bytes > 0 {
            out += &format!(
                "Of the allocated memory, {} is freed but pending: blocks that other streams \
                 still use (record_stream), cached once their work completes (a request's trial \
                 takes that work as not done until the pool synchronizes, which it does before \
                 returning segments to the device).\n",
                format_size(all.pending_free_bytes)
            );
        }
        if !self.largest_free_blocks.is_empty() {
            let one_stream = self.streams.len() == 1;
            let listed: Vec<String> = self
                .largest_free_blocks
                .iter()
                .take(LISTED_IN_TEXT)
                .map(|b| {
                    let stream = if one_stream {
                        String::new()
                    } else {
                        format!(", stream {:#x}", b.stream)
                    };
                    format!(
                        "{} at {:#x} ({}{stream})",
                        format_size(b.size),
                        b.address,
                        b.pool,
                    )
                })
                .collect();
            out += &format!("Largest free cached blocks: {}", listed.join(", "));
            let more = all.free_blocks.saturating_sub(listed.len());
            if more > 0 {
                out += &format!(" (and {more} more)");
            }
            out += ".\n";
        }
        if self.streams.len() > 1 {
            let listed: Vec<String> = self
                .streams
                .iter()
                .map(|s| {
                    format!(
                        "{:#x}: {} reserved, {} free cached",
                        s.stream,
                        format_size(s.reserved_bytes),
                        format_size(s.free_bytes)
                    )
                })
                .collect();
            out += &format!(
                "Streams (a cached block is reused only on its own): {}.\n",
                listed.join("; ")
            );
        }
        out += &self.free_memory_sentence();
        match &self.request {
            Some(request) => {
                out += "\n";
                let private = self.pools.private.as_ref();
                out += &request.to_text(private.map(|p| (p.reserved_bytes, p.free_bytes)));
            }
            None => {
                out += &format!(
                    "Try a request in this state: --request SIZE --device-free SIZE \
                     --device-memory SIZE, from PyTorch's message \"Tried to allocate SIZE. GPU \
                     {} has a total capacity of SIZE of which SIZE is free\" (its first size is \
                     the segment it tried to obtain: see cachealloc state --help).\n",
                    self.device
                )
            }
        }
        out
    }

    /// What the private pools hold, and why the rest of the report leaves them out.
    fn private_pools_sentence(&self) -> String {
        let Some(private) = &self.pools.private else {
            return String::new();
        };
        let ids = self
            .pools
            .private_pool_ids
            .iter()
            .map(|[a, b]| format!("({a}, {b})"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{} of the {} reserved is in {} (CUDA graphs' or torch.cuda.MemPools', \
             segment_pool_id {ids}), {} of it cached free there. Their blocks serve the \
             requests made in their graph's capture or under their MemPool (the newest PyTorch \
             also lends a free block of a MemPool made with use_on_oom to a request that found \
             no room, which the trial does not), and the allocator returns their segments to \
             the device only once their graph or pool is gone: the rest of this report speaks \
             of the default pools{}.\n",
            format_size(private.reserved_bytes),
            format_size(self.pools.all.reserved_bytes),
            if self.pools.private_pool_ids.len() == 1 {
                "a private pool"
            } else {
                "private pools"
            },
            format_size(private.free_bytes),
            if self.request.is_some() {
                ", and the request's trial holds the private pools' memory as allocated"
            } else {
                ""
            }
        )
    }

    /// What the free cached memory amounts to: how much of it the allocator can return to the
    /// device, and how much lies in pieces beside allocations.
    fn free_memory_sentence(&self) -> String {
        let all = &self.default_pools;
        let private = self.pools.private.is_some();
        if all.reserved_bytes == 0 {
            return "The default pools reserve nothing.\n".to_string();
        }
        if all.free_bytes == 0 {
            return if private {
                "Every byte the default pools reserve is allocated: nothing is cached free \
                 there.\n"
            } else {
                "Every reserved byte is allocated: nothing is cached free.\n"
            }
            .to_string();
        }
        let reserved = if private {
            "the default pools reserve"
        } else {
            "reserved"
        };
        // "N of the M reserved (P%) is cached free, in B blocks", the memory named `of`.
        let cached_free = |of: &str| {
            format!(
                "{} of the {} {of} ({}) is cached free, in {}",
                format_size(all.free_bytes),
                format_size(all.reserved_bytes),
                percent(all.free_bytes, all.reserved_bytes),
                counted(all.free_blocks as u64, "block")
            )
        };
        if self.both_segment_kinds {
            return format!(
                "{}. The snapshot holds native segments beside expandable ones (expandable \
                 segments turned on while the program ran, or a CUDA graph's private pool kept \
                 on native segments): when a request finds no room the free pages of the \
                 expandable ones are unmapped, and a native segment is returned to the device \
                 only when wholly free.\n",
                cached_free(reserved)
            );
        }
        if self.expandable_segments {
            return format!(
                "{}. The segments are expandable: when a request finds no room the free pages \
                 are unmapped, and a request maps pages into its stream's range, so the free \
                 memory's pieces matter less than with native segments.\n",
                cached_free("mapped")
            );
        }
        let mut out = cached_free(reserved);
        let in_pieces = all.free_bytes.saturating_sub(all.free_segment_bytes);
        if all.free_segments > 0 && in_pieces == 0 {
            out += &format!(
                ", all of it in {} wholly free, which the allocator returns to the device when a \
                 request finds no room (as empty_cache() does)",
                counted(all.free_segments as u64, "segment")
            );
        } else if all.free_segments > 0 {
            out += &format!(
                ": {} in {} wholly free, which the allocator returns to the device when a request \
                 finds no room (as empty_cache() does), and {} in pieces of segments that also \
                 hold allocations",
                format_size(all.free_segment_bytes),
                counted(all.free_segments as u64, "segment"),
                format_size(in_pieces)
            );
        }
        out += ".\n";
        let large = &self.pools.large;
        if large.free_blocks > 0 {
            out += &format!(
                "The large pool's largest free block is {} ({} of its free memory): a larger \
                 request needs a new segment from the device.\n",
                format_size(large.largest_free_block_bytes),
                percent(large.largest_free_block_bytes, large.free_bytes)
            );
        }
        out
    }
}

/// `part` as a percentage of `whole`, one decimal ("under 0.1%" rather than "0.0%").
fn percent(part: u64, whole: u64) -> String {
    let p = 100.0 * part as f64 / whole.max(1) as f64;
    if part > 0 && p < 0.1 {
        "under 0.1%".to_string()
    } else {
        format!("{p:.1}%")
    }
}
