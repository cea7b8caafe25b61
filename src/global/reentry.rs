//! The thread-local "inside cachealloc" flag. Every interposed entry takes it; a call that
//! arrives while this thread is already inside the library (a runtime that calls back into
//! `cudaMalloc`, a logging path that touches CUDA) is forwarded straight to the real function
//! instead of reaching the pool again.

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Held while this thread runs cachealloc code; dropping it (also while unwinding) clears the flag.
pub struct Inside(());

/// `None` when this thread is already inside cachealloc.
pub fn enter() -> Option<Inside> {
    INSIDE
        .try_with(|inside| {
            if inside.get() {
                None
            } else {
                inside.set(true);
                Some(Inside(()))
            }
        })
        // A thread whose thread-locals are already destroyed (late in thread exit) is treated as
        // re-entered: it gets the real function.
        .unwrap_or(None)
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.set(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_entry_is_refused_until_the_outer_one_ends() {
        let outer = enter().expect("first entry");
        assert!(enter().is_none());
        drop(outer);
        assert!(enter().is_some());
    }
}
