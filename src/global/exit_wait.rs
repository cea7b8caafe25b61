//! Taking a lock in the exit handler. `exit` stops none of the program's other threads: while
//! the handler runs they may still allocate, each holding a pool's lock, the trace file's or the
//! recording's event buffer's for a moment. So the handler waits for a lock it needs, but not
//! for ever: the thread holding it may be the one calling `exit` (from a signal handler that
//! interrupted it), or stuck in the runtime, and neither may keep the process from ending.

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// How long the exit handler waits for one lock.
pub const EXIT_LOCK_WAIT: Duration = Duration::from_secs(1);

/// `lock` once no other thread holds it (poisoned or not: the handler only reads, and a panic
/// there is caught), or `None` when it stays held for a second.
pub fn lock_at_exit<T>(lock: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    lock_within(lock, EXIT_LOCK_WAIT)
}

fn lock_within<T>(lock: &Mutex<T>, wait: Duration) -> Option<MutexGuard<'_, T>> {
    let start = Instant::now();
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if start.elapsed() < wait => std::thread::yield_now(),
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn a_lock_held_for_a_moment_is_waited_for() {
        let lock = Mutex::new(1);
        let held = Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut guard = lock.lock().unwrap();
                held.wait();
                std::thread::sleep(Duration::from_millis(50));
                *guard = 2;
            });
            held.wait();
            let guard = lock_within(&lock, Duration::from_secs(10)).expect("released in time");
            assert_eq!(*guard, 2, "taken after the other thread let go");
        });
    }

    #[test]
    fn a_lock_held_for_longer_is_given_up() {
        let lock = Mutex::new(());
        let _held = lock.lock().unwrap();
        let start = Instant::now();
        assert!(lock_within(&lock, Duration::from_millis(20)).is_none());
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
