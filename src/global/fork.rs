//! A child made by `fork()` from a process where cachealloc holds pools.
//!
//! The child inherits the parent's pools (segments of the parent's CUDA context, which the child
//! cannot use), the trace recorder's buffered events and file, and locks other threads of the
//! parent may have held at the fork. So in such a child cachealloc steps aside: every call goes
//! to the runtime as under `CACHEALLOC_DISABLE=1` (the runtime then answers as it does in a
//! forked child of a process with a CUDA context: `cudaErrorInitializationError`), and the exit
//! hook writes neither the parent's trace again nor a statistics report of the parent's pools
//! under the child's process id. A worker process that never touches CUDA (a data-loader
//! worker that exits normally) leaves the parent's files as they were. Every forked child lets
//! go of the parent's trace and statistics files (`file_claim::let_go_in_forked_child`), so
//! that one outliving its parent does not keep their locks.
//!
//! A parent that has made no pool yet (it only asked `cudaGetLastError`, say) has no CUDA
//! context of cachealloc's making: its children keep cachealloc, with their own statistics and
//! their own trace file (`%p` is expanded by the process that creates the file). A child forked
//! while another thread of the parent was deciding the mode steps aside too: the decision
//! would never finish in it. So does one forked while another thread held a pool slot's lock
//! or the trace file's (a parent with no pool yet takes them too: a `cudaMemGetInfo` that counts
//! cached memory as free looks at its device's slot, the statistics calls, a memory fraction,
//! the making of the first pool, and every flush of a recording): the lock would stay held in
//! the child for ever, and its first `cudaMalloc` would wait on it.
//!
//! The prepare step waits for a lookup through the dynamic loader that another thread is making
//! (`backend::cuda::loader`: a child forked in the middle of one crashed at its own lookup) and
//! holds new ones off until the fork has returned, in the parent and in the child.
//!
//! The handlers are registered when the library is loaded (a constructor), before any thread of
//! the program can call them; the child's only reads atomics, try-locks and releases
//! uncontended locks, and repoints descriptors (it is async-signal-safe). Registered at the
//! first call instead, they could miss a fork another thread made at that moment: glibc runs
//! after a fork only the handlers registered before the fork's prepare phase began, so a child
//! forked just as the first decision started waited forever on it (3 of 300 runs of the race
//! test in a debug build).

use super::{file_claim, pools, trace_file};
use crate::backend::cuda::loader;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static IN_FORKED_CHILD: AtomicBool = AtomicBool::new(false);
/// Threads deciding the mode right now.
static DECIDING: AtomicUsize = AtomicUsize::new(0);
/// Set when the handler could not be registered (reported by the mode's decision).
static UNWATCHED: AtomicBool = AtomicBool::new(false);

extern "C" fn before_fork() {
    loader::before_fork();
}

extern "C" fn parent_after_fork() {
    loader::after_fork_in_parent();
}

extern "C" fn child_after_fork() {
    loader::after_fork_in_child();
    file_claim::let_go_in_forked_child();
    if pools::any_used()
        || deciding()
        || pools::any_lock_held_at_fork()
        || trace_file::lock_held_at_fork()
    {
        IN_FORKED_CHILD.store(true, Ordering::Relaxed);
    }
}

/// A thread deciding the mode, for as long as this lives.
pub struct Deciding(());

impl Deciding {
    pub fn begin() -> Self {
        DECIDING.fetch_add(1, Ordering::SeqCst);
        Deciding(())
    }
}

impl Drop for Deciding {
    fn drop(&mut self) {
        DECIDING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Register the fork handlers when the library is loaded. Only libc is called: the Rust runtime
/// may not be set up yet.
// SAFETY (of running before main): the function calls `pthread_atfork` and stores an atomic,
// neither of which needs anything the Rust runtime sets up.
#[ctor::ctor(unsafe)]
fn watch_forks() {
    // SAFETY: the three handlers are `extern "C" fn()`s of this library. glibc's
    // `pthread_atfork` registers them under the library's own `__dso_handle` and drops them
    // when the library is unloaded (a `dlclose` of it), so none is called once it is gone.
    let rc = unsafe {
        libc::pthread_atfork(
            Some(before_fork),
            Some(parent_after_fork),
            Some(child_after_fork),
        )
    };
    if rc != 0 {
        UNWATCHED.store(true, Ordering::Relaxed);
    }
}

/// Say that forked children are not watched, if the handler could not be registered. Called by
/// the mode's decision, which runs once per process, once the log is set up.
pub fn report_if_unwatched() {
    if UNWATCHED.load(Ordering::Relaxed) {
        log_event!(
            warn,
            "could not register the fork handler: a forked child would use the parent's pools"
        );
    }
}

/// Whether a thread is deciding the mode now.
pub fn deciding() -> bool {
    DECIDING.load(Ordering::SeqCst) > 0
}

/// Whether this process is a child forked from a process where cachealloc held pools (or was
/// deciding its mode).
#[inline]
pub fn in_forked_child() -> bool {
    IN_FORKED_CHILD.load(Ordering::Relaxed)
}
