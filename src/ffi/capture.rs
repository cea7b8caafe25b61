//! The interposed starts of CUDA graph captures: `cudaStreamBeginCapture`,
//! `cudaStreamBeginCaptureToGraph` and their per-thread-default-stream (`_ptsz`) forms; and
//! `cudaStreamDestroy`. Each is forwarded unchanged; a capture that began is noted, so that the
//! pools make no call that would end it (`backend::cuda::captures`), and a stream is forgotten
//! before it is destroyed, so that the runtime is not asked about a handle it let go. The
//! runtime's answer is returned as it came.

use super::status::boundary;
use crate::backend::cuda::runtime::{CudaError, codes};
use crate::global::capture_calls::{self, StreamForm};
use std::ffi::{c_int, c_void};

/// `cudaStreamBeginCapture(stream, mode)`.
///
/// # Safety
/// The runtime's own contract: the arguments are passed on unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaStreamBeginCapture(stream: *mut c_void, mode: c_int) -> CudaError {
    boundary("cudaStreamBeginCapture", codes::UNKNOWN, || {
        // SAFETY: the program's own arguments, forwarded unchanged.
        unsafe { capture_calls::stream_begin_capture(stream, mode, StreamForm::Legacy) }
    })
}

/// `cudaStreamBeginCapture_ptsz(stream, mode)`: a null stream is the thread's default stream.
///
/// # Safety
/// The runtime's own contract: the arguments are passed on unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaStreamBeginCapture_ptsz(
    stream: *mut c_void,
    mode: c_int,
) -> CudaError {
    boundary("cudaStreamBeginCapture_ptsz", codes::UNKNOWN, || {
        // SAFETY: the program's own arguments, forwarded unchanged.
        unsafe { capture_calls::stream_begin_capture(stream, mode, StreamForm::PerThread) }
    })
}

/// `cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependencyData,
/// numDependencies, mode)` (CUDA 12.3 on).
///
/// # Safety
/// The runtime's own contract: the arguments are passed on unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph(
    stream: *mut c_void,
    graph: *mut c_void,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    num_dependencies: usize,
    mode: c_int,
) -> CudaError {
    boundary("cudaStreamBeginCaptureToGraph", codes::UNKNOWN, || {
        // SAFETY: the program's own arguments, forwarded unchanged.
        unsafe {
            capture_calls::stream_begin_capture_to_graph(
                stream,
                graph,
                dependencies,
                dependency_data,
                num_dependencies,
                mode,
                StreamForm::Legacy,
            )
        }
    })
}

/// `cudaStreamBeginCaptureToGraph_ptsz(...)`: a null stream is the thread's default stream.
///
/// # Safety
/// The runtime's own contract: the arguments are passed on unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaStreamBeginCaptureToGraph_ptsz(
    stream: *mut c_void,
    graph: *mut c_void,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    num_dependencies: usize,
    mode: c_int,
) -> CudaError {
    boundary("cudaStreamBeginCaptureToGraph_ptsz", codes::UNKNOWN, || {
        // SAFETY: the program's own arguments, forwarded unchanged.
        unsafe {
            capture_calls::stream_begin_capture_to_graph(
                stream,
                graph,
                dependencies,
                dependency_data,
                num_dependencies,
                mode,
                StreamForm::PerThread,
            )
        }
    })
}

/// `cudaStreamDestroy(stream)`: the stream is forgotten by the capture table, then destroyed.
///
/// # Safety
/// The runtime's own contract: the argument is passed on unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaStreamDestroy(stream: *mut c_void) -> CudaError {
    boundary("cudaStreamDestroy", codes::UNKNOWN, || {
        // SAFETY: the program's own argument, forwarded unchanged.
        unsafe { capture_calls::stream_destroy(stream) }
    })
}
