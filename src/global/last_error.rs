//! The last error of the interposed calls that the library answers itself.
//!
//! The real runtime keeps a last error per thread: a failed call sets it, `cudaGetLastError()`
//! returns and clears it, `cudaPeekAtLastError()` returns it. An interposed `cudaMalloc` or
//! `cudaFree` that fails without the runtime failing (out of memory after the whole retry
//! ladder, whose failed real `cudaMalloc` calls were cleared; a double free; a bad configuration)
//! would leave no trace there. So the library keeps such a failure per thread, as the newest
//! unread error (`unread_error`, where an error of the program's that the library's own runtime
//! calls replaced is kept too), and answers the two interposed getters with it, after the
//! runtime's own error: when the library records a failure, it clears the runtime's older one
//! (the newer error is the last), so an error the runtime holds afterwards is newer than the
//! library's.

use super::forward;
use crate::backend::cuda::runtime::{CudaError, codes};
use crate::backend::cuda::unread_error;

/// The interposed call is answering `code` itself; returns it.
pub fn record(code: CudaError) -> CudaError {
    if code != codes::SUCCESS {
        let _older = forward::get_last_error();
        unread_error::keep(code);
    }
    code
}

/// `cudaGetLastError()`: the runtime's error if it holds one (newer), else the one kept; both
/// are cleared.
pub fn take() -> CudaError {
    let runtime = forward::get_last_error();
    let kept = unread_error::take();
    if runtime != codes::SUCCESS {
        runtime
    } else {
        kept
    }
}

/// `cudaPeekAtLastError()`: the same answer, nothing cleared.
pub fn peek() -> CudaError {
    let runtime = forward::peek_at_last_error();
    if runtime != codes::SUCCESS {
        runtime
    } else {
        unread_error::kept()
    }
}
