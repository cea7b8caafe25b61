//! The one error type of the pool.

use super::oom::OomReport;
use crate::backend::BackendError;
use std::fmt;

/// Why a pointer passed to `free` was refused: what the pool holds at that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadPointer {
    /// Memory the pool holds free, in its cache: freed already (a double free, the block maybe
    /// merged with its free neighbours since), or never handed out.
    CachedFree,
    /// Pages of an expandable segment with no memory mapped: freed already and given back to
    /// the device, or never handed out.
    Unmapped,
    /// Inside a live allocation, past its start (an interior pointer).
    Interior {
        /// Where the allocation starts: the pointer to free.
        start: u64,
        /// The bytes it was asked for.
        requested: u64,
    },
    /// The allocation's free is already pending (freed twice before its fence completed).
    AlreadyFreed,
    /// Inside an allocation whose free is pending, past its start.
    InsidePending {
        /// Where the allocation starts.
        start: u64,
    },
    /// A replay's completion of a free that was not requested: the allocation is live.
    FreeNotRequested,
}

/// What a pool operation can fail with.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// No memory for the request after the whole retry ladder. Maps to `cudaErrorMemoryAllocation`.
    OutOfMemory(Box<OomReport>),
    /// A request so large (≥ 1 EiB) that it is refused without trying.
    RequestTooLarge { size: u64 },
    /// `free` of an address that no segment of this pool contains: not ours (forward it).
    NotOwned { addr: u64 },
    /// `free` of an address inside our segments that is not a live allocation's start, or a
    /// replay's completion of a free not requested (`BadPointer` says which, and what is there).
    InvalidPointer { addr: u64, reason: BadPointer },
    /// The device failed for a reason other than memory; passed through unchanged.
    Backend(BackendError),
    /// A memory fraction outside [0, 1] (`set_memory_fraction`).
    InvalidFraction(f64),
    /// A start state that is not a valid pool state (replay seeding).
    InvalidSeed(String),
    /// A start state that is valid but that the current settings could not have produced
    /// (replay seeding under other settings than the recording's).
    SeedForbiddenBySettings(String),
    /// The invariant walker found the pool inconsistent (a bug; reported, never hidden).
    Invariant(String),
}

impl Error {
    /// The pointer handed to a free was no live allocation of the pool (so the free changed
    /// nothing, and nothing of that allocation is left to keep).
    pub fn is_bad_pointer(&self) -> bool {
        matches!(self, Error::NotOwned { .. } | Error::InvalidPointer { .. })
    }
}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error::Backend(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfMemory(report) => write!(
                f,
                "CUDA out of memory. Tried to allocate {} bytes",
                report.alloc_size
            ),
            Error::RequestTooLarge { size } => write!(
                f,
                "CUDA out of memory. Tried to allocate more than 1EB memory ({size} bytes requested)."
            ),
            Error::NotOwned { addr } => write!(f, "{addr:#x} was not allocated by cachealloc"),
            Error::InvalidPointer { addr, reason } => {
                write!(f, "invalid device pointer {addr:#x}: ")?;
                bad_pointer(f, *addr, *reason)
            }
            Error::Backend(e) => write!(f, "{e}"),
            Error::InvalidSeed(why) | Error::SeedForbiddenBySettings(why) => {
                write!(f, "invalid start state: {why}")
            }
            Error::InvalidFraction(fraction) => write!(
                f,
                "invalid memory fraction {fraction}: set it within [0, 1] (1 = no limit)"
            ),
            Error::Invariant(why) => write!(f, "cachealloc internal inconsistency: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// Why `addr` was refused, in words that say what to look for in the program.
fn bad_pointer(f: &mut fmt::Formatter<'_>, addr: u64, reason: BadPointer) -> fmt::Result {
    match reason {
        BadPointer::CachedFree => write!(
            f,
            "the memory there is free in cachealloc's cache (already freed: a double free; or \
             never allocated)"
        ),
        BadPointer::Unmapped => write!(
            f,
            "inside a cachealloc expandable segment, in pages given back to the device (already \
             freed: a double free; or never allocated)"
        ),
        BadPointer::Interior { start, requested } if addr - start < requested => write!(
            f,
            "{} bytes inside the live allocation at {start:#x} of {requested} bytes (an interior \
             pointer: free the pointer the allocation returned)",
            addr - start
        ),
        BadPointer::Interior { start, requested } => write!(
            f,
            "{} bytes past the start of the live allocation at {start:#x} of {requested} bytes, \
             beyond its end in the padding of its block (free the pointer the allocation \
             returned)",
            addr - start
        ),
        BadPointer::AlreadyFreed => {
            write!(f, "already freed, its free still pending (a double free)")
        }
        BadPointer::InsidePending { start } => write!(
            f,
            "{} bytes inside the allocation at {start:#x}, which was already freed (its free is \
             pending)",
            addr - start
        ),
        BadPointer::FreeNotRequested => {
            write!(f, "a live allocation whose free was not requested")
        }
    }
}
