//! Allocations of the C API and the pluggable allocator that the program recorded as used on a
//! stream other than their allocation's (`Tensor.record_stream` in PyTorch).
//!
//! Those frees are immediate otherwise: a block belongs to its allocation stream and the next
//! allocation on that stream is ordered after the freed one's work. Work on another stream is
//! not, so the free of a recorded block is deferred, as an interposed `cudaFree` is: under the
//! default `free_sync:device` the block is reused after a device-wide synchronization that
//! started after the free (the pool makes one before it would grow while frees are pending),
//! which waits for every stream; under `free_sync:event`, after an event on the legacy default
//! stream (blocking streams only); under `free_sync:none`, at once. PyTorch's own allocator
//! records an event on each recorded stream instead and never synchronizes the device.
//!
//! Only work on streams of the block's own device is covered: the device-wide synchronization
//! is the block's device's. An entry goes when its allocation is freed (through the C API, the
//! pluggable allocator or the interposed `cudaFree`) or its pool is dropped by a device reset.
//! The set is small (the recorded allocations alive at one moment) and read by every free only
//! through one atomic load while it is empty.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

static RECORDED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// `RECORDED`'s length, readable without the lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn recorded() -> std::sync::MutexGuard<'static, Vec<u64>> {
    // A panic while the lock was held leaves a list of addresses, still consistent.
    RECORDED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The allocation at `addr` is used on another stream too.
pub fn record(addr: u64) {
    let mut list = recorded();
    if !list.contains(&addr) {
        list.push(addr);
        COUNT.store(list.len(), Ordering::Release);
    }
}

/// Forget the recorded allocations `gone` says are gone (a pool dropped by a device reset).
pub fn forget(gone: impl Fn(u64) -> bool) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut list = recorded();
    list.retain(|&addr| !gone(addr));
    COUNT.store(list.len(), Ordering::Release);
}

/// Whether the allocation at `addr` was recorded; forgets it (it is being freed).
#[inline]
pub fn take(addr: u64) -> bool {
    if COUNT.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mut list = recorded();
    let Some(pos) = list.iter().position(|&a| a == addr) else {
        return false;
    };
    list.swap_remove(pos);
    COUNT.store(list.len(), Ordering::Release);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test owns the process-wide set (tests run in parallel threads).
    #[test]
    fn a_record_lasts_until_its_free_or_its_pools_reset() {
        assert!(!take(0x1000), "nothing recorded");
        record(0x1000);
        record(0x1000);
        record(0x2000);
        record(0x9000);
        assert!(take(0x1000), "recorded once, however often");
        assert!(!take(0x1000), "a free forgets it");
        forget(|addr| addr < 0x8000);
        assert!(!take(0x2000), "its pool was reset");
        assert!(take(0x9000), "another pool's record stays");
        assert_eq!(COUNT.load(Ordering::Acquire), 0);
    }
}
