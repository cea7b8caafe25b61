//! What each kind of hint says (`OomHint`'s `Display`), and what a hint tells of the
//! settings: the `max_split_size_mb` value it suggests, whether a setting may help.

use super::{MAX_SPLIT_LADDER_MB, MIB, OLDER_PYTORCH_REFUSES_MB, OomHint};
use crate::pool::format::format_size;
use crate::pool::rounding::{LARGE_BUFFER, SMALL_BUFFER};
use std::fmt;

/// The end of a hint that names a `max_split_size_mb` value to try.
const FINDS_VALUES: &str = " `cachealloc replay` of a recorded trace finds the values that fit.";
/// The end of a hint after which a setting may help, none named.
const SHOWS_SETTINGS: &str =
    "; `cachealloc replay` of a recorded trace shows whether any setting helps";

/// Qualifies "free on the device" when the fraction limit caps what this process may use.
fn within_limit(fraction_capped: bool) -> &'static str {
    if fraction_capped {
        " within the per_process_memory_fraction limit"
    } else {
        ""
    }
}

/// Why a new segment is larger than the block it is obtained for: the rule of
/// `rounding::segment_size` that gave it.
fn segment_rule(segment: u64) -> &'static str {
    match segment {
        SMALL_BUFFER => "requests up to 1 MiB share 2 MiB segments",
        LARGE_BUFFER => "requests of 1-10 MiB get 20 MiB segments",
        _ => "larger requests get segments rounded up to 2 MiB",
    }
}

impl OomHint {
    /// The `max_split_size_mb` value this hint suggests, if it suggests one.
    pub fn suggested_max_split_size_mb(&self) -> Option<u64> {
        match *self {
            OomHint::Fragmentation {
                suggested_max_split_size_mb,
                ..
            } => suggested_max_split_size_mb,
            _ => None,
        }
    }

    /// Whether an allocator setting may avoid this out-of-memory (the hints that point to a
    /// replay of a recording to find one). The others name what no setting changes: live
    /// memory, a segment's size, memory held outside the allocator, the small pool's memory
    /// (which no setting gives to a large request), or the fraction limit, which the hint
    /// itself names.
    pub fn settings_may_help(&self) -> bool {
        match self {
            OomHint::OtherStream { .. } | OomHint::Fragmentation { .. } => true,
            OomHint::Padding { .. } => !self.padding_settings().is_empty(),
            _ => false,
        }
    }

    /// For a padding hint, the settings that change the padding it found (empty for the other
    /// hints). Whether one of them lets the run fit, no rule here can tell (a setting changes
    /// the whole run's layout, not only the live blocks' padding): a replay of the recording
    /// does.
    fn padding_settings(&self) -> Vec<&'static str> {
        let OomHint::Padding {
            divisions_padding,
            block_padding,
            max_split_size_mb,
            expandable_segments,
            ..
        } = *self
        else {
            return Vec::new();
        };
        let mut settings = Vec::new();
        if divisions_padding > 0 {
            settings.push("roundup_power2_divisions with more divisions (finer steps), or none");
        }
        if block_padding > 0 && !expandable_segments {
            if max_split_size_mb.is_some() {
                settings.push(
                    "max_split_size_mb above the cached blocks taken whole, or none (blocks are \
                     then split, which may leave other pieces)",
                );
            }
            settings.push(
                "expandable_segments:True (any rest of 512 bytes or more is split off, but \
                 memory is mapped in whole 20 MiB pages)",
            );
        }
        settings
    }
}

/// What the `max_split_size_mb` a hint suggests does to the settings in force.
/// For the value `suggested`, 20 (the smallest), also that PyTorch 2.9 and older refuse it in
/// `PYTORCH_CUDA_ALLOC_CONF` (their parser wants more than 20), where it may be copied to.
fn suggested_in(current: Option<u64>, suggested: Option<u64>) -> String {
    let place = match current {
        Some(mb) => format!("in place of max_split_size_mb:{mb}"),
        None => "added to the other settings in force".to_string(),
    };
    if suggested == Some(OLDER_PYTORCH_REFUSES_MB) {
        format!("{place}; PyTorch 2.9 and older refuse 20, wanting more: 21 for them")
    } else {
        place
    }
}

/// `cachealloc replay` as the way to find a setting that helps, where the hint's text ends
/// with it; left out in the alternate form (`{:#}`), for a reader who is already shown that
/// replay's answer or the advice that leads to it.
fn replay_pointer(f: &fmt::Formatter<'_>, text: &'static str) -> &'static str {
    if f.alternate() { "" } else { text }
}

impl fmt::Display for OomHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OomHint::Exhausted {
                needed,
                available,
                missing,
                by_fraction_limit,
            } => {
                write!(
                    f,
                    "Not fragmentation: live allocations plus this request asked for {} but this \
                     process can use at most {}, {} short. ",
                    format_size(needed),
                    format_size(available),
                    format_size(missing)
                )?;
                if by_fraction_limit {
                    f.write_str(
                        "The per_process_memory_fraction limit binds (the device has room): \
                         raise it, or keep less memory alive (smaller batch, release tensors \
                         earlier).",
                    )
                } else {
                    f.write_str(
                        "No allocator setting helps: keep less memory alive (smaller batch, \
                         release tensors earlier) or use a larger GPU.",
                    )
                }
            }
            OomHint::SegmentTooLarge {
                request,
                segment,
                limit,
                by_fraction_limit,
                left,
            } => {
                write!(
                    f,
                    "Not fragmentation: no free block can hold this {} block, and a new segment \
                     for it takes {} ({}), ",
                    format_size(request),
                    format_size(segment),
                    segment_rule(segment),
                )?;
                if let Some(left) = left {
                    let page = if segment == SMALL_BUFFER {
                        SMALL_BUFFER
                    } else {
                        LARGE_BUFFER
                    };
                    return write!(
                        f,
                        "more than the memory left: {} free on the device{} plus {} reserved but \
                         unallocated {}. No allocator setting changes segment sizes, and \
                         expandable segments map whole pages of {}: keep less memory alive or \
                         use a larger GPU.",
                        format_size(left.device_free),
                        within_limit(left.fraction_capped),
                        format_size(left.unallocated),
                        if segment == SMALL_BUFFER {
                            "(in either pool)"
                        } else {
                            "in its pool"
                        },
                        format_size(page)
                    );
                }
                write!(
                    f,
                    "more than this process can use at all ({}). ",
                    format_size(limit)
                )?;
                f.write_str(if by_fraction_limit {
                    "No allocator setting changes segment sizes: raise \
                     per_process_memory_fraction or use a larger GPU."
                } else {
                    "No allocator setting changes segment sizes: use a larger GPU."
                })
            }
            OomHint::DeviceMemoryUnknown => f.write_str(
                "Device memory unknown: the device did not tell its capacity and free memory \
                 (cudaMemGetInfo failed), so this report cannot tell exhaustion from \
                 fragmentation. A failing cudaMemGetInfo often means the device or its context \
                 is in an error state: check the program's earlier CUDA errors.",
            ),
            OomHint::PendingDuringCapture { pending, block } => write!(
                f,
                "Pending during the capture: frees still pending hold {}, which cachealloc \
                 could not wait for while a CUDA graph capture was underway (waiting \
                 synchronizes the device, which would end the capture); once complete, they \
                 leave a free block of {} that would serve this request. Free that memory \
                 before the capture begins (cachealloc completes the frees still pending as a \
                 capture begins, unless another capture is underway then) or after it ends; no \
                 allocator setting helps.",
                format_size(pending),
                format_size(block)
            ),
            OomHint::HeldDuringCapture {
                held,
                device_free,
                segment,
            } => write!(
                f,
                "Held during the capture: {} of free cached memory lies in whole segments, \
                 which cachealloc gives back to the device only outside a CUDA graph capture \
                 (giving memory back waits for the device, which would end the capture; \
                 PyTorch's allocator does the same); given back, it and the {} free on the \
                 device would hold the {} segment this request needs. Outside a capture this \
                 request is served: empty cachealloc's cache before the capture begins \
                 (cachealloc_empty_cache; with the pluggable allocator, \
                 torch.cuda.empty_cache()), or make the request after it ends; no allocator \
                 setting helps.",
                format_size(held),
                format_size(device_free),
                format_size(segment)
            ),
            OomHint::FreedDuringRequest { request, block } => write!(
                f,
                "Freed too late: a free cached block of {} now holds this {} block, but it \
                 became free only while this request failed (frees waiting for other streams' \
                 work, record_stream, completed when the pool synchronized before returning \
                 memory), and PyTorch does not search its cache again after that \
                 (pytorch#189504). The same request made again is served; no allocator setting \
                 is needed.",
                format_size(block),
                format_size(request)
            ),
            OomHint::Padding {
                requested,
                available,
                missing,
                held_outside,
                limit,
                divisions_padding,
                block_padding,
                request,
                segment,
                max_split_size_mb,
                expandable_segments,
                ..
            } => {
                if held_outside == 0 {
                    write!(
                        f,
                        "Not fragmentation, but blocks larger than their requests: live \
                         allocations plus this request asked for {}, which fits in the {} this \
                         process can use, but the blocks that hold them take {} more than that. ",
                        format_size(requested),
                        format_size(available),
                        format_size(missing),
                    )?;
                } else {
                    write!(
                        f,
                        "Not fragmentation, but blocks larger than their requests, and memory \
                         outside cachealloc: live allocations plus this request asked for {}, \
                         which fits in the {} this process may use only without the {} held \
                         outside cachealloc (free that memory too), and the blocks that hold \
                         them take {} more than this process can use. ",
                        format_size(requested),
                        format_size(limit),
                        format_size(held_outside),
                        format_size(missing),
                    )?;
                }
                if segment > request {
                    write!(
                        f,
                        "A new segment for this {} block takes {}. ",
                        format_size(request),
                        format_size(segment)
                    )?;
                }
                // What pads the blocks, of what the settings in force allow.
                let mut parts = Vec::new();
                if divisions_padding > 0 {
                    parts.push(format!(
                        "roundup_power2_divisions round the blocks up by {}",
                        format_size(divisions_padding)
                    ));
                }
                if block_padding > 0 {
                    let whole = match max_split_size_mb.filter(|_| !expandable_segments) {
                        Some(mb) => format!(
                            "taken whole (a request of {mb} MiB or more, max_split_size_mb, takes \
                             a cached block up to max_non_split_rounding_mb larger) or "
                        ),
                        None => String::new(),
                    };
                    parts.push(format!(
                        "blocks {whole}left with a rest of 1 MiB or less unsplit hold {} more",
                        format_size(block_padding)
                    ));
                }
                if !parts.is_empty() {
                    write!(f, "Of the padding, {}. ", parts.join(", and "))?;
                }
                let settings = self.padding_settings();
                if settings.is_empty() {
                    f.write_str("No setting changes this padding: keep less memory alive.")
                } else {
                    write!(
                        f,
                        "Settings that change it, to try: {}{}.",
                        settings.join("; "),
                        replay_pointer(f, SHOWS_SETTINGS)
                    )
                }
            }
            OomHint::Untracked {
                untracked,
                missing,
                fraction_limit,
            } => {
                write!(
                    f,
                    "Memory outside cachealloc: {} of this GPU is used by other processes, CUDA \
                     contexts or other allocators; the request is {} short, and would fit \
                     without it",
                    format_size(untracked),
                    format_size(missing)
                )?;
                if let Some(limit) = fraction_limit {
                    write!(
                        f,
                        " and with per_process_memory_fraction raised (it allows {})",
                        format_size(limit)
                    )?;
                }
                f.write_str(". Free that memory or run on a less busy GPU.")
            }
            OomHint::OtherStream {
                request,
                unallocated,
                device_free,
                fraction_capped,
                other_stream_block,
                other_stream,
                expandable_segments,
            } => write!(
                f,
                "Cached for another stream: {} reserved but unallocated plus {} free on the \
                 device{} would hold this {} block, and a free cached block of {} would too, but \
                 it belongs to stream {:#x}: a block is reused only on the stream it was \
                 allocated on. Allocating these tensors on the stream that freed that memory, \
                 or all of them on one stream, lets it be reused. Settings to try too: \
                 max_split_size_mb (blocks at or above it are never split, so free memory that \
                 large stays in whole segments, which the pool returns to the device when it \
                 needs a new one){}{}.",
                format_size(unallocated),
                format_size(device_free),
                within_limit(fraction_capped),
                format_size(request),
                format_size(other_stream_block),
                other_stream.0,
                if expandable_segments {
                    ""
                } else {
                    ", and expandable_segments:True (free pages go back to the device)"
                },
                replay_pointer(f, SHOWS_SETTINGS)
            ),
            OomHint::SmallPoolHeld {
                request,
                unallocated,
                device_free,
                fraction_capped,
                small_pool_unallocated,
            } => write!(
                f,
                "Fragmentation of the small pool: {} reserved but unallocated in the large pool \
                 plus {} free on the device{} would not hold this {} block, and the {} reserved \
                 but unallocated in the small pool serves only requests of 1 MiB or less: it \
                 lies in 2 MiB segments (pages, under expandable segments) that each still hold \
                 a live block, and goes back to the device only when they are wholly free. No \
                 allocator setting gives it to this request: keep fewer small tensors alive \
                 here.",
                format_size(unallocated),
                format_size(device_free),
                within_limit(fraction_capped),
                format_size(request),
                format_size(small_pool_unallocated),
            ),
            OomHint::Fragmentation {
                request,
                unallocated,
                device_free,
                fraction_capped,
                segment,
                largest_free_block,
                large_pool_free_block,
                suggested_max_split_size_mb,
                current_max_split_size_mb,
                expandable_segments,
                refused_map,
                divisions_padding,
                other_pool_unallocated,
            } => {
                write!(
                    f,
                    "Fragmentation: {} reserved but unallocated ",
                    format_size(unallocated)
                )?;
                if other_pool_unallocated > 0 {
                    write!(
                        f,
                        "in the large pool (the {} of the small pool serves only requests of 1 \
                         MiB or less) ",
                        format_size(other_pool_unallocated)
                    )?;
                }
                write!(
                    f,
                    "plus {} free on the device{} would hold this {} block, but ",
                    format_size(device_free),
                    within_limit(fraction_capped),
                    format_size(request),
                )?;
                if largest_free_block == 0 {
                    f.write_str("no block of its pool is cached free. ")?;
                } else {
                    write!(
                        f,
                        "the largest free cached block of its pool is {}. ",
                        format_size(largest_free_block)
                    )?;
                }
                match refused_map {
                    Some(map) => write!(
                        f,
                        "Expandable segments grow by whole pages: the {} of pages it needed next \
                         are more than the device has free. ",
                        format_size(map)
                    )?,
                    None if !expandable_segments
                        && device_free >= request
                        && device_free < segment =>
                    {
                        write!(
                            f,
                            "The device's free memory would hold the block itself, but a new \
                             segment for it takes {} ({}). ",
                            format_size(segment),
                            segment_rule(segment)
                        )?
                    }
                    None => {}
                }
                let smallest = MAX_SPLIT_LADDER_MB[MAX_SPLIT_LADDER_MB.len() - 1];
                let small_pool = segment == SMALL_BUFFER;
                // A large request refused its pages might fit in a native segment: reserved but
                // unallocated plus free is what native segments might have left. (The small
                // pool's pages are its segments' size anyway.)
                let native_may_fit = refused_map.is_some()
                    && !small_pool
                    && segment <= unallocated.saturating_add(device_free);
                let instead = suggested_in(current_max_split_size_mb, suggested_max_split_size_mb);
                match (suggested_max_split_size_mb, current_max_split_size_mb) {
                    // The large pool's free memory lies in segments still in use.
                    (Some(mb), _) if small_pool => write!(
                        f,
                        "Requests of 1 MiB or less are served only from the small pool's 2 MiB \
                         segments. The large pool's free memory cannot serve them, and goes back \
                         to the device only as whole segments: its largest free block, {}, lies \
                         in a segment still in use. A value to try: max_split_size_mb:{mb} \
                         ({instead}): blocks of {mb} MiB or more are then never split, so free \
                         memory that large stays in whole segments, which the pool returns to \
                         the device when it needs a new one.{}",
                        format_size(large_pool_free_block),
                        replay_pointer(f, FINDS_VALUES)
                    ),
                    (None, _) if small_pool => {
                        f.write_str(
                            "Requests of 1 MiB or less are served only from the small pool's 2 \
                             MiB segments",
                        )?;
                        if expandable_segments {
                            // The large pool's whole pages may be what leaves no room.
                            write!(
                                f,
                                ". A setting to try: expandable_segments:False (the default), \
                                 under which larger requests take segments rounded to 2 MiB, not \
                                 whole 20 MiB pages{}.",
                                replay_pointer(f, SHOWS_SETTINGS)
                            )
                        } else if divisions_padding > 0 {
                            write!(
                                f,
                                ", and roundup_power2_divisions round the blocks up by {} in \
                                 all, so fewer fit in each. A setting to try: \
                                 roundup_power2_divisions with more divisions (finer steps), or \
                                 none{}.",
                                format_size(divisions_padding),
                                replay_pointer(f, SHOWS_SETTINGS)
                            )
                        } else {
                            write!(
                                f,
                                "{}. A setting to try: expandable_segments:True, under which the \
                                 small pool's blocks lie in one address range and free blocks \
                                 merge across its 2 MiB pages{}. Else keep less memory alive.",
                                if large_pool_free_block > 0 {
                                    "; memory reserved in the large pool serves only larger \
                                     requests"
                                } else {
                                    ""
                                },
                                replay_pointer(f, SHOWS_SETTINGS)
                            )
                        }
                    }
                    (Some(mb), _) if expandable_segments => write!(
                        f,
                        "A value to try: max_split_size_mb:{mb} ({instead}): with expandable \
                         segments it splits nothing whole, but requests smaller than {mb} MiB no \
                         longer take cached blocks of {mb} MiB or more, which keeps such blocks \
                         for the large requests.{}",
                        replay_pointer(f, FINDS_VALUES)
                    ),
                    (Some(mb), _) => write!(
                        f,
                        "A value to try: max_split_size_mb:{mb} ({instead}): blocks of {mb} MiB \
                         or more are then never split, so free memory is no longer left in \
                         pieces that large cut from bigger segments, and when the device cannot \
                         supply a new segment, cached blocks of {mb} MiB or more that the \
                         request cannot use are released first.{}",
                        replay_pointer(f, FINDS_VALUES)
                    ),
                    (None, Some(current)) if largest_free_block >= smallest * MIB => write!(
                        f,
                        "max_split_size_mb is already {current}; keep less memory alive or \
                         allocate the large tensors first, before small ones split the segments."
                    ),
                    (None, _) => {
                        if largest_free_block == 0 {
                            f.write_str(
                                "Nothing of its pool is cached free, so no max_split_size_mb \
                                 value applies.",
                            )?;
                        } else {
                            write!(
                                f,
                                "Every free cached block is smaller than {smallest} MiB, the \
                                 smallest max_split_size_mb, so no value keeps pieces this small \
                                 whole."
                            )?;
                        }
                        // Pages, not the order of allocation, stood in the way under expandable
                        // segments; native ones are named below when they may fit.
                        if native_may_fit {
                            Ok(())
                        } else if refused_map.is_some() || largest_free_block == 0 {
                            f.write_str(" Keep less memory alive.")
                        } else {
                            write!(
                                f,
                                " Keep less memory alive or allocate the large tensors first, \
                                 before small ones split the segments{}.",
                                replay_pointer(
                                    f,
                                    "; `cachealloc replay` of a recorded trace shows whether any \
                                     max_split_size_mb value helps"
                                )
                            )
                        }
                    }
                }?;
                // "Another" only after a value named above.
                let setting = if suggested_max_split_size_mb.is_some() {
                    " Another setting to try:"
                } else {
                    " A setting to try:"
                };
                if !expandable_segments && !small_pool {
                    f.write_str(setting)?;
                    f.write_str(if unallocated > 0 {
                        " expandable_segments:True, PyTorch's advice when memory reserved but \
                         unallocated is large."
                    } else {
                        " expandable_segments:True."
                    })?;
                }
                if !expandable_segments && small_pool && suggested_max_split_size_mb.is_some() {
                    f.write_str(
                        " Another setting to try: expandable_segments:True, under which the \
                         free pages of any segment go back to the device.",
                    )?;
                }
                if native_may_fit {
                    write!(
                        f,
                        "{setting} expandable_segments:False (the default), under which a new \
                         segment for this block takes {}, not whole pages.",
                        format_size(segment)
                    )?;
                }
                Ok(())
            }
        }
    }
}
