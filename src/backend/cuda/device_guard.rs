//! Running runtime calls on a chosen device: switch the calling thread's current device when it
//! differs, and switch back afterwards, so the program never sees its current device change.

use super::runtime::{CudaError, Runtime, codes};
use super::unread_error;
use crate::pool::DeviceId;
use std::ffi::c_int;

/// The calling thread's current device (`cudaGetDevice`).
pub fn current_device(rt: &Runtime) -> Result<DeviceId, CudaError> {
    let mut device: c_int = 0;
    // SAFETY: `device` is a valid out-pointer for the duration of the call.
    let code = unsafe { (rt.get_device)(&mut device) };
    if code == codes::SUCCESS {
        Ok(DeviceId(device))
    } else {
        Err(code)
    }
}

/// While alive, `device` is current on this thread; dropping it restores the previous device.
pub struct DeviceGuard<'rt> {
    rt: &'rt Runtime,
    /// The device to restore, when a switch happened.
    previous: Option<c_int>,
}

impl<'rt> DeviceGuard<'rt> {
    /// Make `device` current; `Err` with the runtime's code when it cannot be made current.
    /// Every runtime call of the library's own on a device starts here, so here the error the
    /// program has not read is kept (`unread_error`) before those calls may replace it.
    pub fn enter(rt: &'rt Runtime, device: DeviceId) -> Result<Self, CudaError> {
        unread_error::keep_unread(rt);
        let current = current_device(rt)?;
        if current == device {
            return Ok(Self { rt, previous: None });
        }
        // SAFETY: cudaSetDevice takes a plain ordinal; an invalid one is an error return.
        let code = unsafe { (rt.set_device)(device.0) };
        if code != codes::SUCCESS {
            return Err(code);
        }
        Ok(Self {
            rt,
            previous: Some(current.0),
        })
    }
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: `previous` was the current device a moment ago, so it is a valid ordinal.
            let _ = unsafe { (self.rt.set_device)(previous) };
        }
    }
}
