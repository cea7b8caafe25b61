//! The calling thread's error that the program has not read yet, kept where the runtime no
//! longer holds it.
//!
//! The real runtime keeps one last error per thread: the newest failure replaces an older one
//! that nobody read. The library's own runtime calls (a `cudaMalloc` that finds the device full,
//! an event on a stream that is gone) fail and are cleared, as the program never made them; but
//! their failure has already replaced the program's unread error, and clearing would lose it.
//! So before such calls the library peeks at the runtime's error and keeps it here
//! (`keep_unread`), and the interposed `cudaGetLastError`/`cudaPeekAtLastError` answer with the
//! runtime's error when it holds one (it is newer), else with this one. The library's own answer
//! to an interposed call that it fails itself is kept here too (`global::last_error`).

use super::runtime::{CudaError, Runtime, codes};
use std::cell::Cell;

thread_local! {
    static UNREAD: Cell<CudaError> = const { Cell::new(codes::SUCCESS) };
}

/// Before a runtime call of the library's own that may fail: keep the error the runtime holds
/// for the program, if any (it is newer than one kept before).
pub fn keep_unread(rt: &Runtime) {
    // SAFETY: cudaPeekAtLastError takes no arguments and only reads the calling thread's error.
    let code = unsafe { (rt.peek_at_last_error)() };
    if code != codes::SUCCESS {
        keep(code);
    }
}

/// Keep `code` as the newest error the program has not read.
pub fn keep(code: CudaError) {
    UNREAD.with(|unread| unread.set(code));
}

/// The error kept, left kept.
pub fn kept() -> CudaError {
    UNREAD.with(Cell::get)
}

/// The error kept, no longer kept.
pub fn take() -> CudaError {
    UNREAD.with(|unread| unread.replace(codes::SUCCESS))
}
