//! The report's text. It follows PyTorch's newest message (its first sentence is the same
//! shape with "cachealloc" for "PyTorch") and adds lines of its own.

use super::OomReport;
use crate::pool::format::format_size;
use std::fmt;

/// How many of the largest free blocks the text lists.
const LISTED_FREE_BLOCKS: usize = 4;

impl fmt::Display for OomReport {
    /// PyTorch's sentence first, then one line each: the request's sizes, memory not tracked by
    /// cachealloc, the largest free cached blocks, and the hint (in the alternate form `{:#}`,
    /// without its pointer to `cachealloc replay`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. ",
            format_size(self.alloc_size)
        )?;
        if self.device_memory_unknown {
            write!(
                f,
                "GPU {} did not tell its memory (cudaMemGetInfo failed). ",
                self.device.0
            )?;
        } else {
            write!(
                f,
                "GPU {} has a total capacity of {} of which {} is free. ",
                self.device.0,
                format_size(self.device_total),
                format_size(self.device_free)
            )?;
        }
        if let Some(allowed) = self.allowed_maximum {
            write!(f, "{} allowed; ", format_size(allowed))?;
        }
        writeln!(
            f,
            "Of the allocated memory {} is allocated by cachealloc, and {} is reserved by \
             cachealloc but unallocated.",
            format_size(self.allocated),
            format_size(self.unallocated())
        )?;
        // The exact byte count beside a size in units (up to 1024 bytes the size is one).
        let requested = format_size(self.requested);
        let exact = if requested.ends_with(" bytes") {
            String::new()
        } else {
            format!(" ({} bytes)", self.requested)
        };
        write!(
            f,
            "Request: {requested}{exact} on stream {:#x}, rounded to a {} block, ",
            self.stream.0,
            format_size(self.rounded),
        )?;
        if self.expandable_segments {
            writeln!(f, "in pages mapped into an expandable segment.")?;
        } else {
            writeln!(f, "needing a {} segment.", format_size(self.alloc_size))?;
        }
        let untracked = if self.device_memory_unknown {
            "unknown".to_string()
        } else {
            format_size(self.untracked())
        };
        writeln!(
            f,
            "Memory not tracked by cachealloc (other processes, CUDA contexts, other \
             allocators): {untracked}.",
        )?;
        if self.largest_free_blocks.is_empty() {
            writeln!(f, "Largest free cached blocks: none.")?;
        } else {
            let listed: Vec<String> = self
                .largest_free_blocks
                .iter()
                .take(LISTED_FREE_BLOCKS)
                .map(|&size| format_size(size))
                .collect();
            let more = self.free_blocks.saturating_sub(listed.len());
            write!(f, "Largest free cached blocks: {}", listed.join(", "))?;
            if more > 0 {
                write!(f, " (and {more} more)")?;
            }
            writeln!(f, ".")?;
        }
        if self.other_streams_free > 0 {
            writeln!(
                f,
                "Cached in this pool for other streams (this request cannot use it): {}, the \
                 largest block {}.",
                format_size(self.other_streams_free),
                format_size(self.other_streams_largest_free_block)
            )?;
        }
        if self.capture_underway {
            writeln!(
                f,
                "A CUDA graph capture was underway: cachealloc gave no cached memory back to the \
                 device and waited for no pending free, since each synchronizes the device and \
                 would end the capture; outside a capture it does both before it fails."
            )?;
        }
        if f.alternate() {
            write!(f, "Hint: {:#}", self.hint())
        } else {
            write!(f, "Hint: {}", self.hint())
        }
    }
}
