//! Domain newtypes shared by the whole pool: addresses, streams, devices, pool kinds.
//!
//! The core never sees a CUDA type: a device address is a `DevicePtr`, a stream is an opaque
//! `StreamId` (the numeric value of a `cudaStream_t`), a device is a `DeviceId`.

use std::fmt;
use std::num::NonZeroU64;

/// A device address handed out by a backend or by the pool. Never zero.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(NonZeroU64);

impl DevicePtr {
    /// `None` for the null address.
    pub fn new(addr: u64) -> Option<Self> {
        NonZeroU64::new(addr).map(Self)
    }

    pub fn addr(self) -> u64 {
        self.0.get()
    }

    /// The address `bytes` further on. Panics on overflow, which a valid segment never reaches.
    pub fn offset(self, bytes: u64) -> Self {
        let addr = self
            .addr()
            .checked_add(bytes)
            .expect("device address overflow");
        Self(NonZeroU64::new(addr).expect("nonzero + n is nonzero"))
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.addr())
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.addr())
    }
}

/// A stream, as the numeric value of its handle (0 = the legacy default stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

/// A CUDA device ordinal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub i32);

/// Which of the two block pools a block lives in (chosen from the rounded size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Rounded sizes up to 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything else.
    Large,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}
