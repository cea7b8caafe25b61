//! A child made by `fork()` after cachealloc became active.
//!
//! The child inherits the parent's pools (segments of the parent's CUDA context, which the child
//! cannot use), the trace recorder's buffered events and file, and locks other threads of the
//! parent may have held at the fork. So in such a child cachealloc steps aside: every call goes
//! to the runtime as under `CACHEALLOC_DISABLE=1` (the runtime then answers as it does in a
//! forked child: it works if the parent never created a context, else
//! `cudaErrorInitializationError`), and the exit hook writes neither the parent's trace again
//! nor a statistics report of the parent's pools under the child's process id. A worker
//! process that never touches CUDA (a data-loader worker that exits normally) leaves the
//! parent's files as they were.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

static IN_FORKED_CHILD: AtomicBool = AtomicBool::new(false);
static REGISTERED: Once = Once::new();

extern "C" fn child_after_fork() {
    // Async-signal-safe: one atomic store.
    IN_FORKED_CHILD.store(true, Ordering::Relaxed);
}

/// Mark children forked from now on (once per process; called when cachealloc becomes active).
pub fn watch() {
    REGISTERED.call_once(|| {
        // SAFETY: `child_after_fork` is an `extern "C" fn()` that lives as long as the library,
        // which is never unloaded while the process can still fork.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
        if rc != 0 {
            log_event!(
                warn,
                "could not register the fork handler: a forked child would use the parent's pools"
            );
        }
    });
}

/// Whether this process is a child forked after cachealloc became active.
#[inline]
pub fn in_forked_child() -> bool {
    IN_FORKED_CHILD.load(Ordering::Relaxed)
}
