/*
 * memory.c — device, managed and pinned host memory backed by host pages, the table of live
 * allocations, cudaMemGetInfo, cudaMemcpy, cudaMemset and cudaPointerGetAttributes.
 *
 * Every allocation is its own anonymous mapping (MAP_NORESERVE, so a large capacity costs
 * nothing until pages are touched): page aligned, which is more than the 256 bytes callers may
 * assume, and zero filled. The table is sorted by base address so that an interior pointer finds
 * its allocation by binary search.
 *
 * Memory that the driver mapped and made accessible (vmm.c) counts as live device memory of its
 * device too, for the range checks of cudaMemcpy, cudaMemset and fakecudart_launch and for
 * cudaPointerGetAttributes; cudaFree does not take it. Unlike an allocation, which any device may
 * use, it is usable only by the devices cuMemSetAccess gave access: another device's use is an
 * illegal address (700), as a real GPU would fault on it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "state.h"

/* Index of the first allocation whose base is greater than addr. */
static size_t upper_bound_locked(uintptr_t addr) {
    size_t lo = 0, hi = fake.alloc_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fake.allocs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

struct fake_alloc *find_alloc_locked(uintptr_t addr) {
    size_t i = upper_bound_locked(addr);
    if (i == 0)
        return NULL;
    struct fake_alloc *a = &fake.allocs[i - 1];
    return addr - a->base < a->size ? a : NULL;
}

static int is_device_kind(enum fake_alloc_kind kind) { return kind != ALLOC_HOST; }

cudaError_t check_device_range_locked(uintptr_t lo, size_t bytes, int accessor) {
    struct fake_alloc *a = find_alloc_locked(lo);
    if (a != NULL)
        return is_device_kind(a->kind) && bytes <= a->size - (lo - a->base) ? cudaSuccess
                                                                            : cudaErrorInvalidValue;
    uint64_t access = 0;
    if (!vmm_range_accessible_locked(lo, bytes, NULL, &access))
        return cudaErrorInvalidValue;
    if ((access >> accessor & 1) == 0) {
        fake.counters.vmm_access_faults++;
        return cudaErrorIllegalAddress;
    }
    return cudaSuccess;
}

void charge_locked(int device, int64_t delta) {
    fake.devices[device].used += (uint64_t)delta;
    fake.counters.bytes_in_use += (uint64_t)delta;
    if (fake.counters.bytes_in_use > fake.counters.peak_bytes)
        fake.counters.peak_bytes = fake.counters.bytes_in_use;
}

/* Maps `size` bytes and enters them in the table. cudaErrorMemoryAllocation when out of host
 * address space or table space. */
static cudaError_t map_alloc_locked(void **out, size_t size, int device,
                                    enum fake_alloc_kind kind) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page)
        return cudaErrorMemoryAllocation;
    size_t map_len = (size + page - 1) / page * page;
    if (fake.alloc_count == fake.alloc_cap) {
        size_t cap = fake.alloc_cap == 0 ? 64 : fake.alloc_cap * 2;
        struct fake_alloc *grown = realloc(fake.allocs, cap * sizeof *grown);
        if (grown == NULL)
            return cudaErrorMemoryAllocation;
        fake.allocs = grown;
        fake.alloc_cap = cap;
    }
    void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    size_t i = upper_bound_locked((uintptr_t)p);
    memmove(&fake.allocs[i + 1], &fake.allocs[i], (fake.alloc_count - i) * sizeof fake.allocs[0]);
    fake.allocs[i] = (struct fake_alloc){(uintptr_t)p, size, map_len, device, kind};
    fake.alloc_count++;
    *out = p;
    return cudaSuccess;
}

static void unmap_alloc_locked(struct fake_alloc *a) {
    munmap((void *)a->base, a->map_len);
    size_t i = (size_t)(a - fake.allocs);
    memmove(&fake.allocs[i], &fake.allocs[i + 1],
            (fake.alloc_count - i - 1) * sizeof fake.allocs[0]);
    fake.alloc_count--;
}

/* A device-side allocation of `size` > 0 bytes charged to the current device. The stream-ordered
 * kind (async_memory.c) is no capture hazard: a capture may allocate that way. */
cudaError_t device_alloc(void **out, size_t size, enum fake_alloc_kind kind) {
    int device = fake_current_device;
    cudaError_t rc;
    lock();
    struct fake_device *d = &fake.devices[device];
    if (kind != ALLOC_ASYNC && (rc = capture_check_locked(CAPTURE_UNSAFE)) != cudaSuccess) {
        /* refused: a capture forbids it */
    } else if (fake.injected_failures > 0) {
        fake.injected_failures--;
        rc = fake.injected_code;
    } else if (size > fake_free_bytes(d)) {
        rc = cudaErrorMemoryAllocation;
    } else {
        rc = map_alloc_locked(out, size, device, kind);
    }
    if (rc == cudaSuccess) {
        charge_locked(device, (int64_t)size);
        if (kind == ALLOC_DEVICE)
            fake.counters.mallocs++;
        else if (kind == ALLOC_PITCH)
            fake.counters.pitch_mallocs++;
        else if (kind == ALLOC_ASYNC)
            fake.counters.async_mallocs++;
        else
            fake.counters.managed_mallocs++;
    } else {
        fake.counters.malloc_failures++;
    }
    unlock();
    return rc;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    ENTER();
    if (devPtr == NULL)
        return record(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        lock();
        fake.counters.mallocs++;
        unlock();
        return cudaSuccess;
    }
    return record(device_alloc(devPtr, size, ALLOC_DEVICE));
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    ENTER();
    if (devPtr == NULL || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return record(cudaErrorInvalidValue);
    return record(device_alloc(devPtr, size, ALLOC_MANAGED));
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    ENTER();
    if (devPtr == NULL || pitch == NULL)
        return record(cudaErrorInvalidValue);
    size_t row = (width + FAKE_PITCH_ALIGNMENT - 1) / FAKE_PITCH_ALIGNMENT * FAKE_PITCH_ALIGNMENT;
    if (width > SIZE_MAX - FAKE_PITCH_ALIGNMENT || (height != 0 && row > SIZE_MAX / height))
        return record(cudaErrorMemoryAllocation);
    *pitch = row;
    if (row * height == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    return record(device_alloc(devPtr, row * height, ALLOC_PITCH));
}

cudaError_t cudaFree(void *devPtr) {
    ENTER();
    lock();
    if (devPtr == NULL) {
        fake.counters.null_frees++;
        unlock();
        return cudaSuccess;
    }
    struct fake_alloc *a = find_alloc_locked((uintptr_t)devPtr);
    if (a == NULL || a->base != (uintptr_t)devPtr || !is_device_kind(a->kind)) {
        fake.counters.free_failures++;
        unlock();
        return record(cudaErrorInvalidValue);
    }
    cudaError_t refused = capture_check_locked(CAPTURE_SYNC);
    if (refused != cudaSuccess) {
        fake.counters.free_failures++;
        unlock();
        return record(refused);
    }
    /* Like the real cudaFree: wait for the device before the memory goes away. */
    device_sync_locked(a->device);
    fake.counters.implicit_syncs++;
    release_alloc_locked(a);
    fake.counters.frees++;
    unlock();
    return cudaSuccess;
}

void release_alloc_locked(struct fake_alloc *a) {
    charge_locked(a->device, -(int64_t)a->size);
    unmap_alloc_locked(a);
}

void free_device_allocs_locked(int device) {
    for (size_t i = fake.alloc_count; i-- > 0;) {
        struct fake_alloc *a = &fake.allocs[i];
        if (a->device == device && is_device_kind(a->kind))
            release_alloc_locked(a);
    }
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    ENTER();
    if (ptr == NULL)
        return record(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    lock();
    cudaError_t rc = map_alloc_locked(ptr, size, fake_current_device, ALLOC_HOST);
    if (rc == cudaSuccess)
        fake.counters.host_mallocs++;
    unlock();
    return record(rc);
}

cudaError_t cudaFreeHost(void *ptr) {
    ENTER();
    if (ptr == NULL)
        return cudaSuccess;
    lock();
    struct fake_alloc *a = find_alloc_locked((uintptr_t)ptr);
    cudaError_t rc = cudaErrorInvalidValue;
    if (a != NULL && a->base == (uintptr_t)ptr && a->kind == ALLOC_HOST) {
        unmap_alloc_locked(a);
        fake.counters.host_frees++;
        rc = cudaSuccess;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    ENTER();
    if (free == NULL || total == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    struct fake_device *d = &fake.devices[fake_current_device];
    *total = d->capacity;
    *free = fake_free_bytes(d);
    fake.counters.mem_get_infos++;
    unlock();
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    ENTER();
    if ((unsigned)kind > cudaMemcpyDefault)
        return record(cudaErrorInvalidValue);
    lock();
    fake.counters.memcpys++;
    int dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    int accessor = fake_current_device; /* the device that does the copy */
    cudaError_t rc = cudaSuccess;
    if (count > 0 && (dst == NULL || src == NULL))
        rc = cudaErrorInvalidValue;
    if (rc == cudaSuccess && count > 0 && dst_device)
        rc = check_device_range_locked((uintptr_t)dst, count, accessor);
    if (rc == cudaSuccess && count > 0 && src_device)
        rc = check_device_range_locked((uintptr_t)src, count, accessor);
    if (rc == cudaSuccess && count > 0) {
        legacy_sync_locked(fake_current_device);
        memmove(dst, src, count);
    }
    unlock();
    return record(rc);
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    ENTER();
    lock();
    fake.counters.memsets++;
    cudaError_t rc = cudaSuccess;
    if (count > 0)
        rc = check_device_range_locked((uintptr_t)devPtr, count, fake_current_device);
    if (rc == cudaSuccess && count > 0) {
        legacy_sync_locked(fake_current_device);
        memset(devPtr, value, count);
    }
    unlock();
    return record(rc);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    ENTER();
    if (attributes == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    struct fake_alloc *a = find_alloc_locked((uintptr_t)ptr);
    struct cudaPointerAttributes out = {cudaMemoryTypeUnregistered, -2, NULL, (void *)ptr};
    int vmm_device;
    if (a == NULL && vmm_range_accessible_locked((uintptr_t)ptr, 1, &vmm_device, NULL)) {
        out = (struct cudaPointerAttributes){cudaMemoryTypeDevice, vmm_device, (void *)ptr, NULL};
    } else if (a != NULL) {
        out.device = a->device;
        out.devicePointer = (void *)ptr;
        switch (a->kind) {
        case ALLOC_DEVICE:
        case ALLOC_PITCH:
        case ALLOC_ASYNC:
            out.type = cudaMemoryTypeDevice;
            out.hostPointer = NULL;
            break;
        case ALLOC_MANAGED:
            out.type = cudaMemoryTypeManaged;
            break;
        case ALLOC_HOST:
            out.type = cudaMemoryTypeHost;
            break;
        }
    }
    unlock();
    *attributes = out;
    return cudaSuccess;
}
