//! A warning for expandable segments that the program's peer access cannot reach.
//!
//! Mapped pages are reachable from another device only once granted (`cuMemSetAccess`), which
//! the library does when the program enables peer access through the interposed
//! `cudaDeviceEnablePeerAccess`. A library that is not preloaded (PyTorch's pluggable allocator
//! loads it with ctypes, `RTLD_LOCAL`) interposes nothing: the program's calls go straight to the
//! runtime, no page is ever opened to another device, and a copy or kernel of another device
//! that reads them faults (an illegal memory access, which ends the CUDA context), peer access
//! or not. Said once per process, at the first pool with expandable segments, where the process
//! has more than one device.

use super::api::device_count;
use crate::backend::cuda::runtime::{Runtime, program_calls_reach_here};
use crate::pool::DeviceId;
use std::sync::atomic::{AtomicBool, Ordering};

static SAID: AtomicBool = AtomicBool::new(false);

/// Warn (once) when `device`'s new pool maps pages that no other device will be given, though
/// the process has other devices. `source` names where the settings came from.
pub fn warn_once_if_unseen(rt: &Runtime, device: DeviceId, source: &str) {
    if SAID.load(Ordering::Relaxed) || program_calls_reach_here(c"cudaDeviceEnablePeerAccess") {
        return;
    }
    // 0 when the runtime cannot say.
    let devices = device_count(rt).unwrap_or(0);
    if devices < 2 || SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    log_event!(
        warn,
        "{source}: expandable_segments:True with {devices} devices, and cachealloc is not \
         preloaded: the program's cudaDeviceEnablePeerAccess goes to the runtime, not here, so \
         the pages mapped on device {} (and on every device) stay reachable from their own \
         device only, and a copy or kernel of another device that reads them fails with an \
         illegal memory access, peer access or not. Preload this same library too \
         (LD_PRELOAD=/path/to/libcachealloc.so: PyTorch's pluggable allocator then shares its \
         pools) or set expandable_segments:False",
        device.0
    );
}
