//! Expandable segments on a real device: address ranges reserved with the driver, and a
//! physical allocation (`cuMemCreate`) behind each mapped page, as PyTorch's
//! `ExpandableSegment` does.
//!
//! Each page has a handle of its own, so that any run of pages can be unmapped and released
//! later (`cuMemUnmap` takes only whole mappings). Access is granted to this device and to the
//! devices the program gave access to its memory (`cudaDeviceEnablePeerAccess`): unlike
//! `cudaMalloc` memory, mapped memory is reachable from another device only once granted.
//! Mapped pages get the grants in force when they are mapped; a later grant is applied to
//! the pages mapped before it (`grant`).

use super::driver::{
    ATTRIBUTE_RDMA_WITH_VMM_SUPPORTED, ATTRIBUTE_VMM_SUPPORTED, CuDevice, CuMemHandle, CuResult,
    Driver, GRANULARITY_MINIMUM, MemAccessDesc, MemAllocationProp, driver, results,
};
use crate::backend::BackendError;
use crate::pool::{DeviceId, DevicePtr};
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

/// The pool's page sizes (2 MiB and 20 MiB) are multiples of this, and ranges are aligned to
/// it; a device whose driver needs a coarser granularity gets fixed segments.
const PAGE_UNIT: u64 = 2 << 20;

/// `CUDA_ERROR_INVALID_VALUE` (`cudaErrorInvalidValue`): a call the pool should never make.
const INVALID_VALUE: CuResult = 1;

/// A reserved range: its size and page size.
#[derive(Clone, Copy, Debug)]
struct Range {
    size: u64,
    page: u64,
}

/// The driver's side of one device's expandable segments.
#[derive(Debug)]
pub struct Vmm {
    driver: &'static Driver,
    /// The device's ordinal: what `CUmemLocation.id` names.
    ordinal: c_int,
    /// Pages are created usable for GPUDirect RDMA (the device reports support), as PyTorch's.
    rdma: bool,
    /// Bit `d`: device `d` was given access to this device's memory.
    peers: &'static AtomicU64,
    /// Reserved ranges by start address.
    ranges: BTreeMap<u64, Range>,
    /// Mapped pages by address, with their physical allocation.
    pages: BTreeMap<u64, CuMemHandle>,
}

fn check(code: CuResult, call: &'static str) -> Result<(), BackendError> {
    match code {
        results::SUCCESS => Ok(()),
        results::OUT_OF_MEMORY => Err(BackendError::OutOfMemory),
        // The driver's codes are the runtime's numbers for the errors they share.
        code => Err(BackendError::Device { code, call }),
    }
}

impl Vmm {
    /// The driver's virtual-memory calls for `device` (made current by the caller), or why
    /// they cannot be used there.
    pub fn for_device(device: DeviceId, peers: &'static AtomicU64) -> Result<Vmm, String> {
        let driver = driver()?;
        let mut cu: CuDevice = 0;
        // SAFETY: `cu` is a valid out-pointer; the ordinal is the runtime's current device.
        let code = unsafe { (driver.device_get)(&mut cu, device.0) };
        if code != results::SUCCESS {
            return Err(format!("cuDeviceGet({}) answered {code}", device.0));
        }
        let mut supported = 0;
        // SAFETY: `supported` is a valid out-pointer; `cu` came from cuDeviceGet.
        let code =
            unsafe { (driver.device_get_attribute)(&mut supported, ATTRIBUTE_VMM_SUPPORTED, cu) };
        if code != results::SUCCESS {
            return Err(format!(
                "the driver could not say whether the device has virtual memory management \
                 (cuDeviceGetAttribute answered CUDA driver error {code})"
            ));
        }
        if supported == 0 {
            return Err("the device has no virtual memory management (its \
                 CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)"
                .to_string());
        }
        let mut rdma = 0;
        // SAFETY: `rdma` is a valid out-pointer; `cu` came from cuDeviceGet. A driver that does
        // not know the attribute answers an error: no RDMA flag then.
        let code = unsafe {
            (driver.device_get_attribute)(&mut rdma, ATTRIBUTE_RDMA_WITH_VMM_SUPPORTED, cu)
        };
        let rdma = code == results::SUCCESS && rdma != 0;
        // The granularity is the driver's answer for a set of properties: those every page is
        // created with (`map`), RDMA flag included.
        let prop = MemAllocationProp::pinned_on(device.0, rdma);
        let mut granularity = 0usize;
        // SAFETY: both pointers are valid for the call; `prop` describes device memory of `cu`.
        let code = unsafe {
            (driver.get_allocation_granularity)(&mut granularity, &prop, GRANULARITY_MINIMUM)
        };
        if code != results::SUCCESS
            || granularity == 0
            || !PAGE_UNIT.is_multiple_of(granularity as u64)
        {
            return Err(format!(
                "the device's allocation granularity ({granularity} bytes, \
                 cuMemGetAllocationGranularity answered {code}) does not divide 2 MiB pages"
            ));
        }
        Ok(Vmm {
            driver,
            ordinal: device.0,
            rdma,
            peers,
            ranges: BTreeMap::new(),
            pages: BTreeMap::new(),
        })
    }

    /// `cuMemAddressReserve` of `size` bytes, 2 MiB aligned, to be mapped in pages of `page`
    /// bytes (a multiple of 2 MiB that divides `size`).
    pub fn reserve(&mut self, size: u64, page: u64) -> Result<DevicePtr, BackendError> {
        if page == 0 || !page.is_multiple_of(PAGE_UNIT) || !size.is_multiple_of(page) {
            return Err(BackendError::Device {
                code: INVALID_VALUE,
                call: "expandable segments (a range not of whole 2 MiB-multiple pages)",
            });
        }
        let len = usize::try_from(size).map_err(|_| BackendError::OutOfMemory)?;
        let mut addr = 0;
        // SAFETY: `addr` is a valid out-pointer; no fixed address is asked for.
        let code =
            unsafe { (self.driver.address_reserve)(&mut addr, len, PAGE_UNIT as usize, 0, 0) };
        check(code, "cuMemAddressReserve")?;
        if addr.checked_add(size).is_none() {
            // SAFETY: the range was just reserved here and nothing is mapped in it.
            unsafe { (self.driver.address_free)(addr, len) };
            return Err(BackendError::OutOfMemory);
        }
        let ptr = DevicePtr::new(addr).ok_or(BackendError::Device {
            code: INVALID_VALUE,
            call: "cuMemAddressReserve (returned 0)",
        })?;
        self.ranges.insert(addr, Range { size, page });
        Ok(ptr)
    }

    /// The page size of the range holding `addr`.
    fn page_at(&self, addr: u64) -> Result<u64, BackendError> {
        match self.ranges.range(..=addr).next_back() {
            Some((&start, r)) if addr < start + r.size => Ok(r.page),
            _ => Err(BackendError::Device {
                code: INVALID_VALUE,
                call: "expandable segments (an address outside every reserved range)",
            }),
        }
    }

    /// Map pages over `[ptr, ptr + size)` and give this device access; on an error nothing
    /// stays mapped or allocated.
    pub fn map(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let page = self.page_at(ptr.addr())?;
        let prop = MemAllocationProp::pinned_on(self.ordinal, self.rdma);
        let mut mapped = Vec::new();
        let result = (|| {
            for addr in (ptr.addr()..ptr.addr() + size).step_by(page as usize) {
                let mut handle = 0;
                // SAFETY: `handle` is a valid out-pointer and `prop` a valid description.
                let code = unsafe { (self.driver.create)(&mut handle, page as usize, &prop, 0) };
                check(code, "cuMemCreate")?;
                // SAFETY: `addr` is a page of a range reserved here and not mapped (the pool
                // maps only unmapped pages); `handle` was just created with the page's size.
                let code = unsafe { (self.driver.map)(addr, page as usize, 0, handle, 0) };
                if let Err(e) = check(code, "cuMemMap") {
                    // SAFETY: `handle` was created above and is mapped nowhere.
                    unsafe { (self.driver.release)(handle) };
                    return Err(e);
                }
                mapped.push((addr, handle));
            }
            let access = self.access();
            // SAFETY: the whole range was mapped above; `access` holds `access.len()` valid
            // descriptors.
            let code = unsafe {
                (self.driver.set_access)(ptr.addr(), size as usize, access.as_ptr(), access.len())
            };
            check(code, "cuMemSetAccess")
        })();
        match result {
            Ok(()) => {
                self.pages.extend(mapped);
                Ok(())
            }
            Err(e) => {
                for (addr, handle) in mapped {
                    self.unmap_page(addr, page, handle);
                }
                Err(e)
            }
        }
    }

    /// Unmap the pages of `[ptr, ptr + size)` and release their memory. The caller has waited
    /// for the work that may use them (`cuMemUnmap` does not). On an error nothing changes:
    /// pages unmapped before a `cuMemUnmap` failed are mapped again with their own memory (and
    /// contents). A `cuMemRelease` that fails after its page was unmapped leaves the memory
    /// allocated in the driver, and the page counts as unmapped.
    pub fn unmap(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let page = self.page_at(ptr.addr())?;
        let pages: Vec<(u64, CuMemHandle)> = (ptr.addr()..ptr.addr() + size)
            .step_by(page as usize)
            .filter_map(|addr| self.pages.get(&addr).map(|&h| (addr, h)))
            .collect();
        for (done, &(addr, _)) in pages.iter().enumerate() {
            // SAFETY: `addr` is a page mapped here with a handle of `page` bytes.
            let code = unsafe { (self.driver.unmap)(addr, page as usize) };
            if let Err(e) = check(code, "cuMemUnmap") {
                self.map_again(&pages[..done], page);
                return Err(e);
            }
        }
        for (addr, handle) in pages {
            self.pages.remove(&addr);
            // SAFETY: the handle's only mapping was just removed.
            let _ = unsafe { (self.driver.release)(handle) };
        }
        Ok(())
    }

    /// After a failed unmap: map `pages` again with their handles and give access back.
    fn map_again(&self, pages: &[(u64, CuMemHandle)], page: u64) {
        let access = self.access();
        for &(addr, handle) in pages {
            // SAFETY: `addr` was mapped with `handle` until this call unmapped it; the handle
            // is still allocated (not released), so mapping it back restores the page;
            // `access` holds `access.len()` valid descriptors.
            unsafe {
                (self.driver.map)(addr, page as usize, 0, handle, 0);
                (self.driver.set_access)(addr, page as usize, access.as_ptr(), access.len());
            }
        }
    }

    /// Read and write access for this device and every device given access to its memory.
    fn access(&self) -> Vec<MemAccessDesc> {
        let peers = self.peers.load(Ordering::Acquire);
        std::iter::once(self.ordinal)
            .chain((0..64).filter(|&d| peers & (1u64 << d) != 0 && d != self.ordinal))
            .map(MemAccessDesc::read_write_on)
            .collect()
    }

    /// Give `device` access to every page mapped so far (later maps include it through
    /// `peers`), with one `cuMemSetAccess` per run of adjacent mapped pages of a range, as
    /// PyTorch's `forEachAllocatedRange` does: a large pool is granted in a few calls, not one
    /// per page. Stops at the first error.
    pub fn grant(&self, device: DeviceId) -> Result<(), BackendError> {
        let access = MemAccessDesc::read_write_on(device.0);
        let open = |start: u64, len: u64| {
            // SAFETY: `[start, start + len)` is whole pages mapped here end to end; one valid
            // descriptor.
            let code = unsafe { (self.driver.set_access)(start, len as usize, &access, 1) };
            check(code, "cuMemSetAccess")
        };
        for (&first, range) in &self.ranges {
            // The run being gathered: (start, bytes).
            let mut run: Option<(u64, u64)> = None;
            let mapped = self.pages.range(first..first + range.size).map(|(&a, _)| a);
            for addr in mapped.map(Some).chain([None]) {
                match (run, addr) {
                    (Some((start, len)), Some(a)) if start + len == a => {
                        run = Some((start, len + range.page));
                    }
                    _ => {
                        if let Some((start, len)) = run {
                            open(start, len)?;
                        }
                        run = addr.map(|a| (a, range.page));
                    }
                }
            }
        }
        Ok(())
    }

    /// Best-effort cleanup of a page mapped by a `map` that failed later.
    fn unmap_page(&self, addr: u64, page: u64, handle: CuMemHandle) {
        // SAFETY: `addr` was mapped with `handle` in the failed call and nothing used it.
        unsafe {
            (self.driver.unmap)(addr, page as usize);
            (self.driver.release)(handle);
        }
    }

    /// `cuMemAddressFree` of a reserved range with nothing mapped in it.
    pub fn release_range(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        // SAFETY: the pool gives back only a range it reserved here, whole, with no page mapped.
        let code = unsafe { (self.driver.address_free)(ptr.addr(), size as usize) };
        check(code, "cuMemAddressFree")?;
        self.ranges.remove(&ptr.addr());
        Ok(())
    }

    /// Unmap and release everything, and give every range back (before a device reset, which
    /// does not free what the driver's virtual-memory calls made). The caller synchronized the
    /// device. Errors are skipped: the reset goes ahead.
    pub fn release_everything(&mut self) {
        for (addr, handle) in std::mem::take(&mut self.pages) {
            let page = self.page_at(addr).unwrap_or(PAGE_UNIT);
            self.unmap_page(addr, page, handle);
        }
        for (addr, range) in std::mem::take(&mut self.ranges) {
            // SAFETY: a range reserved here, with every page of it unmapped just above (or, if
            // an unmap failed, still mapped: the driver then refuses, which is harmless).
            unsafe { (self.driver.address_free)(addr, range.size as usize) };
        }
    }
}
