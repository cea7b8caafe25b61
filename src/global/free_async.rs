//! `cudaFreeAsync(ptr, stream)` of memory a pool handed out (from the interposed `cudaMalloc`):
//! the block goes back to its pool, reusable once the work issued to `stream` before the free has
//! completed — the stream-ordered free the program asked for, under every `free_sync` policy
//! (which is about `cudaFree`, whose streams are unknown). The program's contract is that no
//! work uses the memory once `stream` reaches the free, so an event recorded there is all the
//! block waits for, besides the streams recorded for it (`stream_uses`).
//!
//! Forwarded to the runtime, a pool pointer would release the whole segment at its start while
//! the pool still serves the rest, or be refused as an interior pointer. Other memory (the
//! driver's pool: `cudaMallocAsync`) and NULL are forwarded untouched.
//!
//! A capturing stream makes the free a graph node, which only a graph allocation may be: a pool
//! pointer is refused there with 1 (`cudaErrorInvalidValue`) and stays allocated. A stream the
//! runtime does not take (its answer to `cudaStreamIsCapturing`) is refused with that answer.

use super::error::ShimError;
use super::init::{Mode, mode};
use super::interpose::Routed;
use super::pools;
use super::reentry;
use super::stream_uses;
use crate::backend::cuda::runtime::{Runtime, codes, runtime};
use crate::pool::{DevicePtr, StreamId};
use std::ffi::{c_int, c_void};

/// What `cudaStreamIsCapturing` answers for a stream that is not capturing.
const CAPTURE_STATUS_NONE: c_int = 0;

/// `cudaFreeAsync` of `addr` ordered on `stream` (already resolved from the call's form).
pub fn cuda_free_async(addr: u64, stream: usize) -> Result<Routed<()>, ShimError> {
    let Some(_inside) = reentry::enter() else {
        return Ok(Routed::Forward);
    };
    let rt = match mode() {
        Mode::Active(_) => runtime().ok_or(ShimError::NoRuntime)?,
        Mode::PassThrough | Mode::ConfigFailed => return Ok(Routed::Forward),
    };
    let Some(ptr) = DevicePtr::new(addr) else {
        return Ok(Routed::Forward);
    };
    if pools::with_owner(addr, |_| ())?.is_none() {
        return Ok(if pools::is_retired(addr) {
            // Memory of a pool dropped for a reset that failed: still in use around it.
            Routed::Pool(())
        } else {
            Routed::Forward
        });
    }
    ordering_stream_taken(rt, stream)?;
    let recorded = stream_uses::take(addr).unwrap_or_default();
    let freed = stream_uses::free_recorded(ptr, recorded, |pool, recorded| {
        let ordering = StreamId(stream as u64);
        let mut streams = recorded.to_vec();
        if !streams.contains(&ordering) {
            streams.push(ordering);
        }
        pool.free_after_streams(ptr, &streams)
    });
    match freed? {
        Some(result) => Ok(Routed::Pool(result?)),
        // Its pool dropped since it was found, for a reset that failed: still in use around it.
        None if pools::is_retired(addr) => Ok(Routed::Pool(())),
        // Freed by another thread since it was found (the program's double free).
        None => Ok(Routed::Forward),
    }
}

/// Whether the free may be ordered on `stream`: the runtime takes the stream, and it is not
/// capturing.
fn ordering_stream_taken(rt: &Runtime, stream: usize) -> Result<(), ShimError> {
    let mut status: c_int = CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is the program's own handle (or one of the runtime's special values), and
    // `status` is a live local the runtime writes one enum value into.
    let code = unsafe { (rt.stream_is_capturing)(stream as *mut c_void, &mut status) };
    if code != codes::SUCCESS {
        return Err(ShimError::Runtime {
            code,
            call: "cudaStreamIsCapturing",
        });
    }
    if status != CAPTURE_STATUS_NONE {
        return Err(ShimError::InvalidArgument(
            "cudaFreeAsync on a capturing stream makes a graph node, which only a graph \
             allocation may be; this is cachealloc's memory (from cudaMalloc) and stays \
             allocated: free it after the capture",
        ));
    }
    Ok(())
}
