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
