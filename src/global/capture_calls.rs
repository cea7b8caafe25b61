//! The interposed stream calls that CUDA graph captures depend on: a capture's start
//! (`cudaStreamBeginCapture`, `cudaStreamBeginCaptureToGraph`, each also in its `_ptsz` form)
//! and `cudaStreamDestroy`. Each goes to the real runtime unchanged; a capture that began is
//! noted, and a stream forgotten before it is destroyed (`backend::cuda::captures`). Without a
//! runtime they answer as `forward`'s calls do.

use super::forward::{real, without_runtime};
use super::interpose;
use super::last_error;
use super::pools;
use super::reentry;
use crate::backend::cuda::captures;
use crate::backend::cuda::runtime::{CudaError, Runtime, STREAM_PER_THREAD, codes};
use crate::backend::cuda::stream_events;
use crate::pool::StreamId;
use std::ffi::{c_int, c_void};

/// Which form of a stream call the program called (a capture's start, `cudaFreeAsync`): the
/// per-thread-default-stream form (`_ptsz`, of programs built with `--default-stream
/// per-thread`) reads a null stream as that thread's default stream.
#[derive(Clone, Copy, Debug)]
pub enum StreamForm {
    Legacy,
    PerThread,
}

impl StreamForm {
    /// The stream a call of this form names with `stream`.
    pub fn stream(self, stream: *mut c_void) -> usize {
        match self {
            StreamForm::PerThread if stream.is_null() => STREAM_PER_THREAD,
            _ => stream as usize,
        }
    }
}

/// Start a capture of `stream` with `begin`, which answers `None` when the runtime lacks the
/// form the program called (801, as the program's last error); frees still waiting for the
/// device are completed first (`interpose::complete_pending_before_capture`), and when the
/// capture began, its stream is noted.
fn begin_noted(
    stream: *mut c_void,
    form: StreamForm,
    begin: impl FnOnce(&'static Runtime) -> Option<CudaError>,
) -> CudaError {
    let Some(rt) = real() else {
        return without_runtime();
    };
    interpose::complete_pending_before_capture();
    let Some(code) = begin(rt) else {
        return last_error::record(codes::NOT_SUPPORTED);
    };
    if code == codes::SUCCESS {
        captures::begun(rt, form.stream(stream));
    }
    code
}

/// The real `cudaStreamBeginCapture(stream, mode)`, or its `_ptsz` form; when the capture
/// began, its stream is noted (`captures::begun`).
///
/// # Safety
/// The arguments are the program's, passed on as they came: the runtime checks them.
pub unsafe fn stream_begin_capture(
    stream: *mut c_void,
    mode: c_int,
    form: StreamForm,
) -> CudaError {
    begin_noted(stream, form, |rt| {
        let begin = match form {
            StreamForm::Legacy => Some(rt.stream_begin_capture),
            StreamForm::PerThread => rt.stream_begin_capture_ptsz,
        }?;
        // SAFETY: the caller's stream and mode go to the real function, which checks them.
        Some(unsafe { begin(stream, mode) })
    })
}

/// The real `cudaStreamBeginCaptureToGraph(stream, graph, dependencies, dependency_data,
/// count, mode)`, or its `_ptsz` form; when the capture began, its stream is noted.
///
/// # Safety
/// The arguments are the program's, passed on as they came: the runtime checks them.
pub unsafe fn stream_begin_capture_to_graph(
    stream: *mut c_void,
    graph: *mut c_void,
    dependencies: *const c_void,
    dependency_data: *const c_void,
    count: usize,
    mode: c_int,
    form: StreamForm,
) -> CudaError {
    begin_noted(stream, form, |rt| {
        let begin = match form {
            StreamForm::Legacy => rt.stream_begin_capture_to_graph,
            StreamForm::PerThread => rt.stream_begin_capture_to_graph_ptsz,
        }?;
        // SAFETY: the caller's arguments go to the real function, which checks them.
        Some(unsafe { begin(stream, graph, dependencies, dependency_data, count, mode) })
    })
}

/// The real `cudaStreamDestroy(stream)`; a stream noted for a capture is forgotten first
/// (`captures::destroying`), and noted again if the runtime refuses to destroy it. Frees made
/// during a capture that wait for an event on the stream get it first (`events_before_destroy`).
///
/// # Safety
/// The stream is the program's, passed on as it came (the program's own contract with the
/// runtime).
pub unsafe fn stream_destroy(stream: *mut c_void) -> CudaError {
    let Some(rt) = real() else {
        return without_runtime();
    };
    events_before_destroy(stream as usize);
    let noted = captures::destroying(stream as usize);
    // SAFETY: the caller's stream goes to the real function unchanged.
    let code = unsafe { (rt.stream_destroy)(stream) };
    if code != codes::SUCCESS && noted {
        captures::begun(rt, stream as usize);
    }
    code
}

/// Before `stream` is destroyed: the frees made during a capture that wait for an event on it
/// (a `cudaFreeAsync` on it, or a block recorded on it) get that event now, on every device's
/// pool (`CudaBackend::stream_destroying`); CUDA lets a destroyed stream's work run on, and the
/// frees wait for it. One atomic load while no free waits so.
fn events_before_destroy(stream: usize) {
    if !stream_events::any_deferred() {
        return;
    }
    let Some(_inside) = reentry::enter() else {
        return;
    };
    for device in pools::used_devices() {
        let _ = pools::with_pool(device, |pool| {
            pool.backend_mut()
                .stream_destroying(StreamId(stream as u64))
        });
    }
}
