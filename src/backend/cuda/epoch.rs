//! Device-wide synchronization epochs, the fences of the `free_sync:device` policy.
//!
//! A block freed now may be reused once a device-wide synchronization that *started after the
//! free* has completed: such a synchronization waited for every piece of work issued before the
//! free. Every synchronization of the device takes a ticket before it starts and publishes the
//! ticket when it has finished; a free records "the next ticket" as its fence. The program's own
//! `cudaDeviceSynchronize` (interposed) and the pool's synchronize both take tickets, so one
//! program-side synchronization makes every earlier free ready at once.

use std::sync::atomic::{AtomicU64, Ordering};

/// Synchronization tickets of one device.
#[derive(Debug, Default)]
pub struct SyncEpochs {
    /// Tickets handed out so far (ticket numbers start at 1).
    started: AtomicU64,
    /// Highest ticket whose synchronization has finished.
    completed: AtomicU64,
}

impl SyncEpochs {
    pub const fn new() -> Self {
        Self {
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }
    }

    /// The fence for a free happening now: the first synchronization that starts after it.
    pub fn fence(&self) -> u64 {
        self.started.load(Ordering::SeqCst) + 1
    }

    /// Take a ticket before starting a device-wide synchronization.
    pub fn begin(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The synchronization holding `ticket` has finished successfully.
    pub fn end(&self, ticket: u64) {
        self.completed.fetch_max(ticket, Ordering::SeqCst);
    }

    /// Whether a synchronization at or after `fence` has finished.
    pub fn done(&self, fence: u64) -> bool {
        self.completed.load(Ordering::SeqCst) >= fence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_waits_for_a_synchronization_that_starts_after_it() {
        let epochs = SyncEpochs::new();
        let before = epochs.begin(); // started before the free, still running
        let fence = epochs.fence();
        epochs.end(before);
        assert!(
            !epochs.done(fence),
            "an earlier synchronization does not cover the free"
        );
        let after = epochs.begin();
        assert!(!epochs.done(fence));
        epochs.end(after);
        assert!(epochs.done(fence));
    }

    #[test]
    fn one_synchronization_covers_every_earlier_free() {
        let epochs = SyncEpochs::new();
        let fences: Vec<u64> = (0..5).map(|_| epochs.fence()).collect();
        let ticket = epochs.begin();
        epochs.end(ticket);
        assert!(fences.iter().all(|&f| epochs.done(f)));
        assert!(
            !epochs.done(epochs.fence()),
            "a free after it is not covered"
        );
    }
}
