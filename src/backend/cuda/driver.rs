//! The CUDA driver's virtual-memory calls (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! ...), found at run time in the `libcuda.so.1` the process already uses.
//!
//! The runtime loads the driver itself (`dlopen("libcuda.so.1")` at its first call), so by the
//! time a pool is made, after a runtime call on its device, `RTLD_NOLOAD` finds that copy; a
//! plain `dlopen` of the same soname is the fallback. The soname is the driver's, and no
//! search of other names is made: a toolkit's `stubs/libcuda.so` on the library path must not
//! be picked up in its place. The driver's symbols are looked up here rather than through a
//! binding crate, whose loader searches other names first and panics on a missing symbol.
//!
//! A table is complete or absent, and is published once like the runtime's (`runtime`).

use std::ffi::{CStr, c_int, c_uint, c_ulonglong, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A `CUresult` value.
pub type CuResult = c_int;
/// A `CUdevice` (the driver's handle of a device).
pub type CuDevice = c_int;
/// A `CUdeviceptr`.
pub type CuDevicePtr = c_ulonglong;
/// A `CUmemGenericAllocationHandle`.
pub type CuMemHandle = c_ulonglong;

/// The `CUresult` codes the library recognises.
pub mod results {
    use super::CuResult;
    pub const SUCCESS: CuResult = 0;
    pub const OUT_OF_MEMORY: CuResult = 2;
}

/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
pub const ATTRIBUTE_VMM_SUPPORTED: c_int = 102;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: `cuMemCreate` takes
/// `allocFlags.gpuDirectRDMACapable`.
pub const ATTRIBUTE_RDMA_WITH_VMM_SUPPORTED: c_int = 110;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const GRANULARITY_MINIMUM: c_int = 0;
const ALLOCATION_TYPE_PINNED: c_uint = 1;
const LOCATION_TYPE_DEVICE: c_uint = 1;
const ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemLocation {
    pub kind: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp.allocFlags`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocFlags {
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp` (CUDA 12 layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub requested_handle_types: c_uint,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: AllocFlags,
}

impl MemAllocationProp {
    /// Device memory on the device of ordinal `device`, with no shareable handle requested (no
    /// IPC); `rdma`: usable for GPUDirect RDMA (a network card may register it, as NCCL and
    /// UCX do with device buffers), which only a device that reports support accepts.
    pub fn pinned_on(device: c_int, rdma: bool) -> Self {
        Self {
            kind: ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: device,
            },
            win32_handle_meta_data: null_mut(),
            alloc_flags: AllocFlags {
                gpu_direct_rdma_capable: u8::from(rdma),
                ..AllocFlags::default()
            },
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: c_uint,
}

impl MemAccessDesc {
    /// Read and write access for the device of ordinal `device`.
    pub fn read_write_on(device: c_int) -> Self {
        Self {
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: ACCESS_FLAGS_PROT_READWRITE,
        }
    }
}

// The layouts of cuda.h (CUDA 12, x86-64 and aarch64 Linux).
const _: () = {
    assert!(std::mem::size_of::<MemLocation>() == 8);
    assert!(std::mem::size_of::<MemAllocationProp>() == 32);
    assert!(std::mem::offset_of!(MemAllocationProp, location) == 8);
    assert!(std::mem::offset_of!(MemAllocationProp, win32_handle_meta_data) == 16);
    assert!(std::mem::offset_of!(MemAllocationProp, alloc_flags) == 24);
    assert!(std::mem::size_of::<MemAccessDesc>() == 12);
    assert!(std::mem::offset_of!(MemAccessDesc, flags) == 8);
};

type DeviceGetFn = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult;
type GranularityFn = unsafe extern "C" fn(*mut usize, *const MemAllocationProp, c_int) -> CuResult;
type AddressReserveFn =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, c_ulonglong) -> CuResult;
type AddressFreeFn = unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult;
type MemCreateFn = unsafe extern "C" fn(
    *mut CuMemHandle,
    usize,
    *const MemAllocationProp,
    c_ulonglong,
) -> CuResult;
type MemReleaseFn = unsafe extern "C" fn(CuMemHandle) -> CuResult;
type MemMapFn =
    unsafe extern "C" fn(CuDevicePtr, usize, usize, CuMemHandle, c_ulonglong) -> CuResult;
type MemUnmapFn = unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult;
type MemSetAccessFn =
    unsafe extern "C" fn(CuDevicePtr, usize, *const MemAccessDesc, usize) -> CuResult;

/// The driver's entry points the library uses. Each field is the address of the named driver
/// function, with that function's C signature (cuda.h, CUDA 12).
#[derive(Debug)]
pub struct Driver {
    pub device_get: DeviceGetFn,
    pub device_get_attribute: DeviceGetAttributeFn,
    pub get_allocation_granularity: GranularityFn,
    pub address_reserve: AddressReserveFn,
    pub address_free: AddressFreeFn,
    pub create: MemCreateFn,
    pub release: MemReleaseFn,
    pub map: MemMapFn,
    pub unmap: MemUnmapFn,
    pub set_access: MemSetAccessFn,
}

const SONAME: &CStr = c"libcuda.so.1";

static DRIVER: AtomicPtr<Driver> = AtomicPtr::new(null_mut());

/// The driver, or why it cannot be used (the library is not there, or lacks a function).
pub fn driver() -> Result<&'static Driver, String> {
    let published = DRIVER.load(Ordering::Acquire);
    if !published.is_null() {
        // SAFETY: a non-null `DRIVER` comes from `Box::into_raw` below, was fully written
        // before it was published (release/acquire), and is never freed.
        return Ok(unsafe { &*published });
    }
    let fresh = Box::into_raw(Box::new(super::loader::lookup(Driver::resolve)?));
    match DRIVER.compare_exchange(null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` is now the published table, never freed.
        Ok(_) => Ok(unsafe { &*fresh }),
        Err(earlier) => {
            // SAFETY: `fresh` came from `Box::into_raw` just above and was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: `earlier` is the published table, never freed.
            Ok(unsafe { &*earlier })
        }
    }
}

impl Driver {
    fn resolve() -> Result<Driver, String> {
        let handle = open()?;
        let find = |name: &'static CStr| -> Result<*mut c_void, String> {
            // SAFETY: `handle` is a live dlopen handle (never closed); `name` is NUL-terminated.
            let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if f.is_null() {
                Err(format!(
                    "{} has no {}",
                    SONAME.to_string_lossy(),
                    name.to_string_lossy()
                ))
            } else {
                Ok(f)
            }
        };
        // SAFETY: each name below is the driver function whose C signature the target field
        // type spells out (cuda.h), so the transmuted pointer is called correctly.
        unsafe {
            Ok(Driver {
                device_get: std::mem::transmute::<*mut c_void, DeviceGetFn>(find(c"cuDeviceGet")?),
                device_get_attribute: std::mem::transmute::<*mut c_void, DeviceGetAttributeFn>(
                    find(c"cuDeviceGetAttribute")?,
                ),
                get_allocation_granularity: std::mem::transmute::<*mut c_void, GranularityFn>(
                    find(c"cuMemGetAllocationGranularity")?,
                ),
                address_reserve: std::mem::transmute::<*mut c_void, AddressReserveFn>(find(
                    c"cuMemAddressReserve",
                )?),
                address_free: std::mem::transmute::<*mut c_void, AddressFreeFn>(find(
                    c"cuMemAddressFree",
                )?),
                create: std::mem::transmute::<*mut c_void, MemCreateFn>(find(c"cuMemCreate")?),
                release: std::mem::transmute::<*mut c_void, MemReleaseFn>(find(c"cuMemRelease")?),
                map: std::mem::transmute::<*mut c_void, MemMapFn>(find(c"cuMemMap")?),
                unmap: std::mem::transmute::<*mut c_void, MemUnmapFn>(find(c"cuMemUnmap")?),
                set_access: std::mem::transmute::<*mut c_void, MemSetAccessFn>(find(
                    c"cuMemSetAccess",
                )?),
            })
        }
    }
}

/// The loaded driver, else the driver loaded now; never closed.
fn open() -> Result<*mut c_void, String> {
    for flags in [libc::RTLD_NOW | libc::RTLD_NOLOAD, libc::RTLD_NOW] {
        // SAFETY: `SONAME` is NUL-terminated. With RTLD_NOLOAD nothing new is loaded; without
        // it, the driver's constructors run, as they do when the runtime loads it.
        let handle = unsafe { libc::dlopen(SONAME.as_ptr(), flags) };
        if !handle.is_null() {
            return Ok(handle);
        }
    }
    Err(format!(
        "{} is not loaded nor found",
        SONAME.to_string_lossy()
    ))
}
