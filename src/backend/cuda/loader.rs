//! The library's lookups through the dynamic loader (`dlopen`, and the `dlsym`s that follow it),
//! kept apart from `fork`.
//!
//! A child forked while another thread of the parent was inside `dlopen` inherits the loader's
//! state half-written: glibc resets the loader's lock in the child, not the data the lock
//! guarded. A `dlopen` in the child of a name that is not loaded — which reads the loader's
//! cache of library paths (`/etc/ld.so.cache`) — then crashed: SIGSEGV in
//! `_dl_load_cache_lookup`, in a child that called `cudaMalloc` after a fork made while another
//! thread's first call was looking the runtime up (1 child in about 17,000 forks of the
//! fork-during-the-first-call test under a loaded machine; 4 to 26 in 2,000 where no runtime
//! is loaded and every call of four threads looks it up again). The library looks names up with `dlopen` in a few
//! places (the runtime, the driver, libstdc++ for a C++ exception), each once the process has
//! what it looks for.
//!
//! So each lookup runs under a lock that the fork handler's prepare step takes too (`fork`):
//! a fork waits for a lookup under way to end, and no lookup begins while a fork is being made.
//! The lock is an atomic flag, spun on with `yield_now` (a lookup takes microseconds; loading
//! the driver with its constructors, milliseconds): it has no owner to confuse in the child,
//! which releases it after the fork as the parent does. A fork waiting for it goes before any
//! lookup not yet begun. A lookup must not fork, nor look up again inside itself (it would wait
//! for itself).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Held during a lookup, and by a thread that is forking from its prepare step to its return.
static LOOKING_UP: AtomicBool = AtomicBool::new(false);
/// Threads in a fork's prepare step waiting for the lock: no lookup begins while one waits, so
/// that threads looking up again and again (no runtime loaded: every call looks it up) do not
/// keep a fork waiting.
static FORKS_WAITING: AtomicUsize = AtomicUsize::new(0);

fn try_acquire() -> bool {
    LOOKING_UP
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

fn release() {
    LOOKING_UP.store(false, Ordering::Release);
}

/// Run `lookup`, a sequence of calls to the dynamic loader, where no fork can cut it.
pub fn lookup<T>(lookup: impl FnOnce() -> T) -> T {
    struct Held;
    impl Drop for Held {
        fn drop(&mut self) {
            release();
        }
    }
    loop {
        if FORKS_WAITING.load(Ordering::Acquire) == 0 && try_acquire() {
            if FORKS_WAITING.load(Ordering::Acquire) == 0 {
                break;
            }
            // A fork began to wait meanwhile: it goes first.
            release();
        }
        std::thread::yield_now();
    }
    let _held = Held;
    lookup()
}

/// A fork's prepare step: wait for a lookup under way, and hold off new ones until
/// [`after_fork_in_parent`] or [`after_fork_in_child`] (atomics and `sched_yield`, nothing
/// that allocates).
pub fn before_fork() {
    FORKS_WAITING.fetch_add(1, Ordering::AcqRel);
    while !try_acquire() {
        std::thread::yield_now();
    }
    FORKS_WAITING.fetch_sub(1, Ordering::AcqRel);
}

/// After a fork, in the parent: lookups may begin again.
pub fn after_fork_in_parent() {
    release();
}

/// After a fork, in the child: lookups may begin again, and no fork waits (the threads that
/// were waiting in the parent's prepare steps are not in the child).
pub fn after_fork_in_child() {
    FORKS_WAITING.store(0, Ordering::Release);
    release();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A lookup waits while a fork holds the lock, and runs once it is released; lookups of
    /// several threads never overlap.
    #[test]
    fn lookups_wait_for_a_fork_and_never_overlap() {
        before_fork();
        let ran = std::thread::spawn(|| lookup(|| 7));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!ran.is_finished(), "a lookup ran during a fork");
        after_fork_in_parent();
        assert_eq!(ran.join().unwrap(), 7);

        static INSIDE: AtomicUsize = AtomicUsize::new(0);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..1000 {
                        lookup(|| {
                            assert_eq!(INSIDE.fetch_add(1, Ordering::SeqCst), 0);
                            INSIDE.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
