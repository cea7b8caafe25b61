//! The real CUDA runtime's functions, found at run time.
//!
//! The library exports `cudaMalloc` and friends itself, so it must never call them by name:
//! through the PLT such a call would land in its own export. Every real function is looked up
//! once, lazily, and called through the pointer stored here.
//!
//! Lookup order (see the interposition reference, §2.3):
//! 1. `dlsym(RTLD_NEXT, name)` — the object after this library in the global search order; this
//!    is the runtime the program itself was linked against.
//! 2. `dlopen(soname, RTLD_NOW | RTLD_NOLOAD)` for `libcudart.so.13`, `.12`, `.11.0` and
//!    `libcudart.so`, then `dlsym(handle, name)`. `RTLD_NEXT` finds nothing when the runtime was
//!    loaded `RTLD_LOCAL` by a dlopened module (a Python extension, a ctypes library);
//!    `RTLD_NOLOAD` finds that already-loaded copy without loading a second one.
//!
//! A table is complete or absent: when a function is missing the runtime counts as not found
//! (except `cudaStreamGetDevice`, new in CUDA 12.8, and the less common forms of
//! `cudaStreamBeginCapture`, which are optional).
//! Success is cached for the life of the process; failure is not (a runtime may be loaded
//! later, e.g. by a Python import) but is reported only once.

use crate::pool::DeviceId;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// A `cudaError_t` value.
pub type CudaError = c_int;

/// The `cudaError_t` codes the library produces or recognises.
pub mod codes {
    use super::CudaError;
    pub const SUCCESS: CudaError = 0;
    pub const INVALID_VALUE: CudaError = 1;
    pub const MEMORY_ALLOCATION: CudaError = 2;
    pub const INITIALIZATION_ERROR: CudaError = 3;
    pub const INVALID_DEVICE: CudaError = 101;
    /// Also what `cudaEventRecord` answers for a stream of another device than the event's.
    pub const INVALID_RESOURCE_HANDLE: CudaError = 400;
    pub const NOT_READY: CudaError = 600;
    /// `cudaErrorPeerAccessAlreadyEnabled`.
    pub const PEER_ACCESS_ALREADY_ENABLED: CudaError = 704;
    pub const NOT_SUPPORTED: CudaError = 801;
    /// `cudaErrorStreamCaptureUnsupported`: the call is not permitted while a stream captures.
    pub const STREAM_CAPTURE_UNSUPPORTED: CudaError = 900;
    pub const UNKNOWN: CudaError = 999;
}

/// `cudaEventDisableTiming`: events used only for ordering are cheaper without timing.
pub const EVENT_DISABLE_TIMING: c_uint = 0x02;

/// `cudaStreamLegacy` (the handle value 0x1): the legacy default stream, whatever the caller's
/// default-stream mode.
pub const STREAM_LEGACY: usize = 0x1;

/// `cudaStreamPerThread` (the handle value 0x2): the calling thread's per-thread default stream.
pub const STREAM_PER_THREAD: usize = 0x2;

type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaError;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> CudaError;
type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CudaError;
type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> CudaError;
type GetDeviceCountFn = unsafe extern "C" fn(*mut c_int) -> CudaError;
type SetDeviceFn = unsafe extern "C" fn(c_int) -> CudaError;
/// A runtime function without arguments (`cudaDeviceSynchronize`, `cudaGetLastError`, ...).
pub type VoidFn = unsafe extern "C" fn() -> CudaError;
type EventCreateFn = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CudaError;
type EventRecordFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CudaError;
type EventFn = unsafe extern "C" fn(*mut c_void) -> CudaError;
type StreamGetDeviceFn = unsafe extern "C" fn(*mut c_void, *mut c_int) -> CudaError;
type StreamSynchronizeFn = unsafe extern "C" fn(*mut c_void) -> CudaError;
/// `cudaStreamDestroy(stream)`.
type StreamDestroyFn = unsafe extern "C" fn(*mut c_void) -> CudaError;
type EnablePeerAccessFn = unsafe extern "C" fn(c_int, c_uint) -> CudaError;
/// `cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)`; the handle is opaque here.
type IpcGetMemHandleFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CudaError;
/// `cudaStreamIsCapturing(stream, enum cudaStreamCaptureStatus *status)`.
type StreamIsCapturingFn = unsafe extern "C" fn(*mut c_void, *mut c_int) -> CudaError;
/// `cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)`.
type ExchangeCaptureModeFn = unsafe extern "C" fn(*mut c_int) -> CudaError;
/// `cudaFreeAsync(devPtr, stream)` (and its `_ptsz` form).
pub type FreeAsyncFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CudaError;
/// `cudaStreamBeginCapture(stream, enum cudaStreamCaptureMode mode)` (and its `_ptsz` form).
pub type BeginCaptureFn = unsafe extern "C" fn(*mut c_void, c_int) -> CudaError;
/// `cudaStreamBeginCaptureToGraph(stream, cudaGraph_t graph, const cudaGraphNode_t
/// *dependencies, const cudaGraphEdgeData *dependencyData, size_t numDependencies, enum
/// cudaStreamCaptureMode mode)` (and its `_ptsz` form); graph, nodes and edge data are opaque
/// here.
pub type BeginCaptureToGraphFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    *const c_void,
    *const c_void,
    usize,
    c_int,
) -> CudaError;

/// The real runtime's entry points the library uses. Each field is the address of the named
/// runtime function, with that function's C signature.
#[derive(Debug)]
pub struct Runtime {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub mem_get_info: MemGetInfoFn,
    pub get_device: GetDeviceFn,
    pub get_device_count: GetDeviceCountFn,
    pub set_device: SetDeviceFn,
    pub device_synchronize: VoidFn,
    pub device_reset: VoidFn,
    pub get_last_error: VoidFn,
    pub peek_at_last_error: VoidFn,
    pub event_create_with_flags: EventCreateFn,
    pub event_record: EventRecordFn,
    pub event_query: EventFn,
    pub event_destroy: EventFn,
    pub event_synchronize: EventFn,
    pub stream_synchronize: StreamSynchronizeFn,
    pub device_enable_peer_access: EnablePeerAccessFn,
    pub ipc_get_mem_handle: IpcGetMemHandleFn,
    pub stream_is_capturing: StreamIsCapturingFn,
    pub stream_begin_capture: BeginCaptureFn,
    pub stream_destroy: StreamDestroyFn,
    /// `cudaStreamGetDevice`, which runtimes before CUDA 12.8 do not have.
    pub stream_get_device: Option<StreamGetDeviceFn>,
    /// The per-thread-default-stream form of `cudaStreamBeginCapture`, and
    /// `cudaStreamBeginCaptureToGraph` in both forms (CUDA 12.3 on): the interposed functions
    /// forward to them, so a runtime has them whenever a program calls them.
    pub stream_begin_capture_ptsz: Option<BeginCaptureFn>,
    pub stream_begin_capture_to_graph: Option<BeginCaptureToGraphFn>,
    pub stream_begin_capture_to_graph_ptsz: Option<BeginCaptureToGraphFn>,
    /// `cudaFreeAsync` and its per-thread-default-stream form (CUDA 11.2 on), forwarded to for
    /// memory that is not the pools'.
    pub free_async: Option<FreeAsyncFn>,
    pub free_async_ptsz: Option<FreeAsyncFn>,
    /// `cudaThreadExchangeStreamCaptureMode` (CUDA 10.1 on), to relax the calling thread's
    /// capture mode around a C API request during a capture (`captures::RelaxedMode`).
    pub thread_exchange_stream_capture_mode: Option<ExchangeCaptureModeFn>,
}

/// Sonames tried with `RTLD_NOLOAD`, newest first.
const SONAMES: [&CStr; 4] = [
    c"libcudart.so.13",
    c"libcudart.so.12",
    c"libcudart.so.11.0",
    c"libcudart.so",
];

/// The runtime found, published once and never freed. An atomic pointer, not a `OnceLock`: a
/// child forked while another thread of the parent was publishing would wait forever on a
/// `OnceLock` left running; here it sees either nothing (and looks the runtime up itself) or
/// the published table.
static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(null_mut());
static REPORTED_MISSING: AtomicBool = AtomicBool::new(false);

/// The real runtime, or `None` when no loaded runtime provides every function (reported once
/// with a warning naming the missing function). Once found, this is one load and a branch,
/// inlined into every interposed call; the lookup itself stays out of line.
#[inline]
pub fn runtime() -> Option<&'static Runtime> {
    let published = RUNTIME.load(Ordering::Acquire);
    if published.is_null() {
        return resolve_runtime();
    }
    // SAFETY: a non-null `RUNTIME` comes from `Box::into_raw` in `resolve_runtime`, was fully
    // written before it was published (release/acquire), and is never freed.
    Some(unsafe { &*published })
}

#[cold]
#[inline(never)]
fn resolve_runtime() -> Option<&'static Runtime> {
    match super::loader::lookup(Runtime::resolve) {
        Ok(rt) => {
            let fresh = Box::into_raw(Box::new(rt));
            let published = match RUNTIME.compare_exchange(
                null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(earlier) => {
                    // Another thread published first: this lookup's table was never shared.
                    // SAFETY: `fresh` came from `Box::into_raw` just above and nothing else
                    // holds it.
                    drop(unsafe { Box::from_raw(fresh) });
                    earlier
                }
            };
            // SAFETY: `published` is the table in `RUNTIME`, never freed (see `runtime`).
            Some(unsafe { &*published })
        }
        Err(missing) => {
            if !REPORTED_MISSING.swap(true, Ordering::Relaxed) {
                let text = format!(
                    "no CUDA runtime found in this process ({missing} is not provided by the next \
                     library nor by a loaded libcudart.so.13/.12/.11.0); CUDA calls answer \
                     cudaErrorInitializationError (3)"
                );
                if tracing::dispatcher::has_been_set() {
                    log_event!(warn, "{text}");
                } else {
                    // With CACHEALLOC_DISABLE=1 no log is set up, yet the program cannot run:
                    // it is told, as of a configuration error.
                    crate::global::raw_stderr::write(&format!("cachealloc: {text}\n"));
                }
            }
            None
        }
    }
}

impl Runtime {
    /// Look every function up; `Err` names the first one not found.
    fn resolve() -> Result<Runtime, &'static str> {
        let finder = Finder::new();
        let route = finder.route(c"cudaMalloc");
        // SAFETY: each name below is the runtime function whose C signature the target field
        // type spells out (cuda_runtime_api.h), so the transmuted pointer is called correctly.
        let table = unsafe {
            Runtime {
                malloc: std::mem::transmute::<*mut c_void, MallocFn>(finder.find(c"cudaMalloc")?),
                free: std::mem::transmute::<*mut c_void, FreeFn>(finder.find(c"cudaFree")?),
                mem_get_info: std::mem::transmute::<*mut c_void, MemGetInfoFn>(
                    finder.find(c"cudaMemGetInfo")?,
                ),
                get_device: std::mem::transmute::<*mut c_void, GetDeviceFn>(
                    finder.find(c"cudaGetDevice")?,
                ),
                get_device_count: std::mem::transmute::<*mut c_void, GetDeviceCountFn>(
                    finder.find(c"cudaGetDeviceCount")?,
                ),
                set_device: std::mem::transmute::<*mut c_void, SetDeviceFn>(
                    finder.find(c"cudaSetDevice")?,
                ),
                device_synchronize: std::mem::transmute::<*mut c_void, VoidFn>(
                    finder.find(c"cudaDeviceSynchronize")?,
                ),
                device_reset: std::mem::transmute::<*mut c_void, VoidFn>(
                    finder.find(c"cudaDeviceReset")?,
                ),
                get_last_error: std::mem::transmute::<*mut c_void, VoidFn>(
                    finder.find(c"cudaGetLastError")?,
                ),
                peek_at_last_error: std::mem::transmute::<*mut c_void, VoidFn>(
                    finder.find(c"cudaPeekAtLastError")?,
                ),
                event_create_with_flags: std::mem::transmute::<*mut c_void, EventCreateFn>(
                    finder.find(c"cudaEventCreateWithFlags")?,
                ),
                event_record: std::mem::transmute::<*mut c_void, EventRecordFn>(
                    finder.find(c"cudaEventRecord")?,
                ),
                event_query: std::mem::transmute::<*mut c_void, EventFn>(
                    finder.find(c"cudaEventQuery")?,
                ),
                event_destroy: std::mem::transmute::<*mut c_void, EventFn>(
                    finder.find(c"cudaEventDestroy")?,
                ),
                event_synchronize: std::mem::transmute::<*mut c_void, EventFn>(
                    finder.find(c"cudaEventSynchronize")?,
                ),
                stream_synchronize: std::mem::transmute::<*mut c_void, StreamSynchronizeFn>(
                    finder.find(c"cudaStreamSynchronize")?,
                ),
                device_enable_peer_access: std::mem::transmute::<*mut c_void, EnablePeerAccessFn>(
                    finder.find(c"cudaDeviceEnablePeerAccess")?,
                ),
                ipc_get_mem_handle: std::mem::transmute::<*mut c_void, IpcGetMemHandleFn>(
                    finder.find(c"cudaIpcGetMemHandle")?,
                ),
                stream_is_capturing: std::mem::transmute::<*mut c_void, StreamIsCapturingFn>(
                    finder.find(c"cudaStreamIsCapturing")?,
                ),
                stream_begin_capture: std::mem::transmute::<*mut c_void, BeginCaptureFn>(
                    finder.find(c"cudaStreamBeginCapture")?,
                ),
                stream_destroy: std::mem::transmute::<*mut c_void, StreamDestroyFn>(
                    finder.find(c"cudaStreamDestroy")?,
                ),
                stream_get_device: finder
                    .find(c"cudaStreamGetDevice")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, StreamGetDeviceFn>(f)),
                stream_begin_capture_ptsz: finder
                    .find(c"cudaStreamBeginCapture_ptsz")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, BeginCaptureFn>(f)),
                stream_begin_capture_to_graph: finder
                    .find(c"cudaStreamBeginCaptureToGraph")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, BeginCaptureToGraphFn>(f)),
                stream_begin_capture_to_graph_ptsz: finder
                    .find(c"cudaStreamBeginCaptureToGraph_ptsz")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, BeginCaptureToGraphFn>(f)),
                free_async: finder
                    .find(c"cudaFreeAsync")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, FreeAsyncFn>(f)),
                free_async_ptsz: finder
                    .find(c"cudaFreeAsync_ptsz")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, FreeAsyncFn>(f)),
                thread_exchange_stream_capture_mode: finder
                    .find(c"cudaThreadExchangeStreamCaptureMode")
                    .ok()
                    .map(|f| std::mem::transmute::<*mut c_void, ExchangeCaptureModeFn>(f)),
            }
        };
        log_event!(debug, "found the CUDA runtime through {route}");
        Ok(table)
    }
}

/// Looks names up with `RTLD_NEXT`, else in the first already-loaded runtime by soname.
struct Finder {
    /// Handle of an already-loaded runtime (from `RTLD_NOLOAD`), or null.
    loaded: *mut c_void,
    /// Its soname.
    soname: Option<&'static CStr>,
}

impl Finder {
    fn new() -> Self {
        for soname in SONAMES {
            // SAFETY: `soname` is a NUL-terminated C string; RTLD_NOLOAD never loads a new
            // object (so no constructor runs) and only returns a handle to one already mapped.
            let handle =
                unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
            if !handle.is_null() {
                return Self {
                    loaded: handle,
                    soname: Some(soname),
                };
            }
        }
        Self {
            loaded: std::ptr::null_mut(),
            soname: None,
        }
    }

    /// How `name` is found, for the log: "dlsym(RTLD_NEXT)" or the soname opened with NOLOAD.
    fn route(&self, name: &CStr) -> String {
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT lookups have no other precondition.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        if !next.is_null() {
            return "dlsym(RTLD_NEXT)".to_string();
        }
        match self.soname {
            Some(soname) => format!("dlopen({}, RTLD_NOLOAD)", soname.to_string_lossy()),
            None => "nothing".to_string(),
        }
    }

    fn find(&self, name: &'static CStr) -> Result<*mut c_void, &'static str> {
        let label = name.to_str().unwrap_or("?");
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT lookups have no other precondition.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        if !next.is_null() && !is_own_symbol(next, name) {
            return Ok(next);
        }
        if self.loaded.is_null() {
            return Err(label);
        }
        // SAFETY: `loaded` is a live handle from dlopen (never closed: NOLOAD handles only bump
        // the reference count of an object that stays loaded); `name` is NUL-terminated.
        let found = unsafe { libc::dlsym(self.loaded, name.as_ptr()) };
        if found.is_null() || is_own_symbol(found, name) {
            Err(label)
        } else {
            Ok(found)
        }
    }
}

/// Whether the program's calls to `name` come to this library: the process's first definition
/// of it (`dlsym(RTLD_DEFAULT)`, where the program's references bind) is this library's own. Not
/// so when the library was loaded without being preloaded or linked (`dlopen` with
/// `RTLD_LOCAL`, as ctypes and PyTorch's pluggable allocator load it), or when another copy of
/// it comes first.
pub fn program_calls_reach_here(name: &CStr) -> bool {
    // SAFETY: `name` is NUL-terminated; RTLD_DEFAULT lookups have no other precondition.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    !found.is_null() && is_own_symbol(found, name)
}

/// True when `addr` is this library's own definition of `name` (which would call itself).
fn is_own_symbol(addr: *mut c_void, name: &CStr) -> bool {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info` when it returns nonzero.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) } != 0;
    if !found {
        return false;
    }
    // SAFETY: dladdr returned nonzero, so `info` was filled.
    let info = unsafe { info.assume_init() };
    let own = own_base();
    !own.is_null() && info.dli_fbase == own && symbol_is(info.dli_sname, name)
}

fn symbol_is(sname: *const c_char, name: &CStr) -> bool {
    if sname.is_null() {
        return false;
    }
    // SAFETY: dladdr's dli_sname, when non-null, points at a NUL-terminated symbol name that
    // lives as long as the object is loaded.
    unsafe { CStr::from_ptr(sname) == name }
}

/// Load base of the object this code is in.
fn own_base() -> *mut c_void {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let here = own_base as *const () as *const c_void;
    // SAFETY: `here` is an address inside this object; `info` is filled when dladdr succeeds.
    if unsafe { libc::dladdr(here, info.as_mut_ptr()) } == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: dladdr returned nonzero, so `info` was filled.
    unsafe { info.assume_init() }.dli_fbase
}

/// The real runtime's last-error state is per thread; read and clear it: the failure of one of
/// the library's own calls (an error the program had not read was kept before it: `unread_error`).
pub fn clear_last_error(rt: &Runtime) {
    // SAFETY: cudaGetLastError takes no arguments and only resets the calling thread's error.
    let _ = unsafe { (rt.get_last_error)() };
}

/// The device of `stream`, a stream handle's value (`cudaStreamGetDevice`), or `None` when the
/// runtime lacks the call or cannot say; the failure of the query is cleared (an error the
/// program had not read was kept before it: `unread_error`).
pub fn stream_device(rt: &Runtime, stream: usize) -> Option<DeviceId> {
    let get_device = rt.stream_get_device?;
    let mut device: c_int = -1;
    // SAFETY: `device` is a valid out-pointer; the stream handle is one the program passed to
    // the library and has not destroyed (each caller says why): the runtime does not check
    // that a handle is live.
    let code = unsafe { get_device(stream as *mut c_void, &mut device) };
    if code != codes::SUCCESS {
        clear_last_error(rt);
        return None;
    }
    Some(DeviceId(device))
}
