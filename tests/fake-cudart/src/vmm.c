/*
 * vmm.c — the driver's virtual memory management (cuda.h): reservations of address space,
 * physical memory handles, mappings and access. Exported as fakecudart_driver_cuMem*; libcuda.so.1
 * forwards the real names here.
 *
 * How host memory plays the parts:
 *  - a reservation is an anonymous PROT_NONE mapping (MAP_NORESERVE: costs nothing), 2 MiB aligned;
 *  - physical memory is a stretch of one memfd shared by every handle (one file, not one per
 *    handle, so that thousands of 2 MiB pages do not run into the open-file limit). Stretches are
 *    handed out by a bump offset and never reused; a freed one has its pages punched out;
 *  - cuMemMap maps the handle's stretch MAP_SHARED over the reservation, PROT_NONE; cuMemSetAccess
 *    makes it readable and writable; cuMemUnmap puts an anonymous PROT_NONE mapping back.
 * So the memory behind a handle keeps its contents across unmap and map, and two mappings of one
 * handle show the same bytes, as on a GPU. One difference: after fork the child shares the
 * parent's pages (cudaMalloc memory is copied on write); the real driver does not work in a forked
 * child at all. The child's own handles come from a memfd of its own, so that parent and child
 * never hand out the same stretch, and the child never punches out an inherited handle's pages.
 *
 * Each mapping keeps the set of devices cuMemSetAccess gave access (a bit mask, only ever grown:
 * read-write is the only access modelled). The host's access is one for all: the pages become
 * readable and writable with the first device's. The runtime checks the accessing device
 * (check_device_range_locked in memory.c).
 *
 * The allocation granularity (FAKECUDART_VMM_GRANULARITY, 2 MiB by default) is the driver's
 * answer for a set of allocation properties: memory made with the GPUDirect RDMA flag has its own
 * (FAKECUDART_VMM_RDMA_GRANULARITY, by default the same), so a caller that sizes its pages by the
 * granularity of other properties than it creates them with is caught. A handle's size and the
 * addresses it is mapped at are multiples of its granularity. Reservations are made and aligned
 * in 2 MiB units (RESERVE_UNIT) whatever the granularity, or a coarser one.
 *
 * The physical memory is charged to its device's capacity like cudaMalloc's, from cuMemCreate
 * until the handle is both released and unmapped everywhere. cudaDeviceReset does not touch any
 * of this (the driver's VMM objects are not owned by the runtime's context).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "driver.h"
#include "state.h"

#define RESERVE_UNIT ((size_t)2 << 20) /* bytes: reservation sizes and their least alignment */

static int reserve_aligned(uintptr_t n) { return n % RESERVE_UNIT == 0; }

/* Makes room for one more element in a growable array; 0 on success. */
static int reserve_one(void **items, size_t *cap, size_t count, size_t item_size) {
    if (count < *cap)
        return 0;
    size_t grown_cap = *cap == 0 ? 16 : *cap * 2;
    void *grown = realloc(*items, grown_cap * item_size);
    if (grown == NULL)
        return -1;
    *items = grown;
    *cap = grown_cap;
    return 0;
}

/* Index of the first mapping whose base is at or above addr. */
static size_t mapping_lower_bound_locked(uintptr_t addr) {
    size_t lo = 0, hi = fake.mapping_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fake.mappings[mid].base < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The mapping containing addr, or NULL. */
static struct fake_vmm_mapping *find_mapping_locked(uintptr_t addr) {
    size_t i = mapping_lower_bound_locked(addr);
    if (i < fake.mapping_count && fake.mappings[i].base == addr)
        return &fake.mappings[i];
    if (i == 0)
        return NULL;
    struct fake_vmm_mapping *m = &fake.mappings[i - 1];
    return addr - m->base < m->size ? m : NULL;
}

/* Whole mappings laid end to end from lo to exactly lo + size: their first index and count in
 * *first and *n. 0 on success, -1 when the range starts or ends inside a mapping or has a hole. */
static int whole_mappings_locked(uintptr_t lo, size_t size, size_t *first, size_t *n) {
    size_t i = mapping_lower_bound_locked(lo);
    uintptr_t at = lo, hi = lo + size;
    if (size == 0 || hi < lo)
        return -1;
    *first = i;
    while (at < hi) {
        if (i == fake.mapping_count || fake.mappings[i].base != at)
            return -1;
        at += fake.mappings[i].size;
        i++;
    }
    *n = i - *first;
    return at == hi ? 0 : -1;
}

int vmm_range_accessible_locked(uintptr_t lo, size_t bytes, int *device, uint64_t *access) {
    struct fake_vmm_mapping *m = find_mapping_locked(lo);
    if (m == NULL || m->access == 0 || lo + bytes < lo)
        return 0;
    int dev = m->device;
    uint64_t all = m->access; /* devices with access to every mapping so far */
    uintptr_t hi = lo + bytes, end = m->base + m->size;
    /* A range running past this mapping continues in the adjacent ones, of the same device. */
    for (size_t i = (size_t)(m - fake.mappings) + 1; end < hi; i++) {
        if (i == fake.mapping_count || fake.mappings[i].base != end ||
            fake.mappings[i].access == 0 || fake.mappings[i].device != dev)
            return 0;
        all &= fake.mappings[i].access;
        end += fake.mappings[i].size;
    }
    if (device != NULL)
        *device = dev;
    if (access != NULL)
        *access = all;
    return 1;
}

/* The reservation holding all of [lo, lo + size), or NULL. */
static struct fake_vmm_reservation *find_reservation_locked(uintptr_t lo, size_t size) {
    for (size_t i = 0; i < fake.reservation_count; i++) {
        struct fake_vmm_reservation *r = &fake.reservations[i];
        if (lo >= r->base && lo - r->base <= r->size && size <= r->size - (lo - r->base))
            return r;
    }
    return NULL;
}

/* The live (not released) handle `id`, or a released one too when `released_too`; else NULL. */
static struct fake_vmm_handle *find_handle_locked(uint64_t id, int released_too) {
    size_t lo = 0, hi = fake.handle_count;
    while (lo < hi) { /* sorted by id: ids only grow */
        size_t mid = lo + (hi - lo) / 2;
        if (fake.handles[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == fake.handle_count || fake.handles[lo].id != id)
        return NULL;
    return released_too || !fake.handles[lo].released ? &fake.handles[lo] : NULL;
}

/* Gives a released, unmapped handle's memory back to its device and forgets the handle. */
static void free_handle_locked(struct fake_vmm_handle *h) {
    /* Free the pages (the offsets are never reused, so the hole stays a hole). */
    if (!h->inherited)
        (void)fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->offset,
                        (off_t)h->size);
    charge_locked(h->device, -(int64_t)h->size);
    size_t i = (size_t)(h - fake.handles);
    memmove(&fake.handles[i], &fake.handles[i + 1], (fake.handle_count - i - 1) * sizeof *h);
    fake.handle_count--;
}

/* CUDA_SUCCESS for a valid allocation property: pinned memory on a device that exists. */
static CUresult check_prop(const CUmemAllocationProp *prop) {
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    return valid_device(prop->location.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* The minimum (and recommended) granularity of memory with valid properties `prop`. */
static size_t granularity_of(const CUmemAllocationProp *prop) {
    return prop->allocFlags.gpuDirectRDMACapable != 0 ? fake.vmm_rdma_granularity
                                                     : fake.vmm_granularity;
}

CUresult fakecudart_driver_cuMemGetAllocationGranularity(size_t *granularity,
                                                         const CUmemAllocationProp *prop,
                                                         CUmemAllocationGranularity_flags option) {
    CUresult rc = driver_enter(1);
    lock();
    int known_option = option == CU_MEM_ALLOC_GRANULARITY_MINIMUM ||
                       option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
    if (rc == CUDA_SUCCESS && (granularity == NULL || !known_option))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = check_prop(prop);
    if (rc == CUDA_SUCCESS)
        *granularity = granularity_of(prop);
    return driver_leave_locked(rc);
}

/* Reserves `size` bytes aligned to `align` (a power of two, at least the page size): maps more
 * and trims both ends. */
static CUresult reserve_locked(CUdeviceptr *ptr, size_t size, size_t align) {
    if (size > SIZE_MAX - align || reserve_one((void **)&fake.reservations, &fake.reservation_cap,
                                               fake.reservation_count, sizeof *fake.reservations))
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t span = size + align;
    char *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)raw + align - 1) / align * align;
    size_t head = base - (uintptr_t)raw;
    if (head > 0)
        munmap(raw, head);
    if (span - head - size > 0)
        munmap((char *)base + size, span - head - size);
    fake.reservations[fake.reservation_count++] = (struct fake_vmm_reservation){base, size};
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

/* The address hint `addr` is ignored (the real driver may ignore it too). */
CUresult fakecudart_driver_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                               CUdeviceptr addr, unsigned long long flags) {
    (void)addr;
    CUresult rc = driver_enter(1);
    lock();
    if (rc == CUDA_SUCCESS && (ptr == NULL || size == 0 || !reserve_aligned(size) || flags != 0 ||
                               (alignment & (alignment - 1)) != 0))
        rc = CUDA_ERROR_INVALID_VALUE;
    /* The default alignment is the coarsest granularity, and never under 2 MiB. */
    size_t least = RESERVE_UNIT;
    if (fake.vmm_granularity > least)
        least = fake.vmm_granularity;
    if (fake.vmm_rdma_granularity > least)
        least = fake.vmm_rdma_granularity;
    if (rc == CUDA_SUCCESS)
        rc = take_injection_locked(&fake.injected_reserve);
    if (rc == CUDA_SUCCESS)
        rc = reserve_locked(ptr, size, alignment > least ? alignment : least);
    if (rc == CUDA_SUCCESS)
        fake.counters.vmm_reserves++;
    return driver_leave_locked(rc);
}

/* Exactly one whole reservation, with nothing mapped in it. */
CUresult fakecudart_driver_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CUresult rc = driver_enter(1);
    lock();
    size_t i = 0;
    while (rc == CUDA_SUCCESS && i < fake.reservation_count &&
           (fake.reservations[i].base != ptr || fake.reservations[i].size != size))
        i++;
    if (rc == CUDA_SUCCESS && i == fake.reservation_count)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        size_t m = mapping_lower_bound_locked((uintptr_t)ptr);
        if (m < fake.mapping_count && fake.mappings[m].base - (uintptr_t)ptr < size)
            rc = CUDA_ERROR_INVALID_VALUE; /* still mapped inside */
    }
    if (rc == CUDA_SUCCESS) {
        munmap((void *)(uintptr_t)ptr, size);
        fake.reservations[i] = fake.reservations[--fake.reservation_count];
        fake.counters.vmm_address_frees++;
    }
    return driver_leave_locked(rc);
}

/* Physical memory of `size` bytes on prop's device, charged like cudaMalloc. */
static CUresult create_locked(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop) {
    int device = prop->location.id;
    struct fake_device *d = &fake.devices[device];
    if (!fake.vmm_supported)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (size > fake_free_bytes(d))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (reserve_one((void **)&fake.handles, &fake.handle_cap, fake.handle_count,
                    sizeof *fake.handles))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (fake.vmm_fd < 0 && (fake.vmm_fd = memfd_create("fakecudart-vmm", MFD_CLOEXEC)) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t offset = fake.vmm_file_end;
    if (size > (uint64_t)INT64_MAX - offset || ftruncate(fake.vmm_fd, (off_t)(offset + size)) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake.vmm_file_end = offset + size;
    uint64_t id = ++fake.vmm_next_handle;
    fake.handles[fake.handle_count++] =
        (struct fake_vmm_handle){id, fake.vmm_fd, offset, size, granularity_of(prop), device,
                                 0, 0, 0};
    charge_locked(device, (int64_t)size);
    *handle = id;
    return CUDA_SUCCESS;
}

CUresult fakecudart_driver_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                       const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult rc = driver_enter(1);
    lock();
    if (rc == CUDA_SUCCESS && (handle == NULL || size == 0 || flags != 0))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = check_prop(prop);
    /* A multiple of the granularity of these very properties. */
    if (rc == CUDA_SUCCESS && size % granularity_of(prop) != 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    int rdma = rc == CUDA_SUCCESS && prop->allocFlags.gpuDirectRDMACapable != 0;
    if (rdma && fake.vmm_supported && !fake.vmm_rdma_supported)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = take_injection_locked(&fake.injected_create);
    if (rc == CUDA_SUCCESS)
        rc = create_locked(handle, size, prop);
    if (rc == CUDA_SUCCESS) {
        fake.counters.vmm_creates++;
        fake.counters.vmm_rdma_creates += rdma;
    }
    else
        fake.counters.vmm_create_failures++;
    return driver_leave_locked(rc);
}

/* The memory goes back to the device now, or when the handle's last mapping goes. */
CUresult fakecudart_driver_cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult rc = driver_enter(1);
    lock();
    struct fake_vmm_handle *h = rc == CUDA_SUCCESS ? find_handle_locked(handle, 0) : NULL;
    if (rc == CUDA_SUCCESS && h == NULL)
        rc = CUDA_ERROR_INVALID_VALUE; /* unknown or already released */
    if (rc == CUDA_SUCCESS) {
        h->released = 1;
        if (h->map_count == 0)
            free_handle_locked(h);
        fake.counters.vmm_releases++;
    }
    return driver_leave_locked(rc);
}

/* CUDA_SUCCESS when all of handle `id` may be mapped at [ptr, ptr + size): a multiple of its
 * granularity, inside one reservation, over no other mapping; *at is then the index the new
 * mapping takes. */
static CUresult check_map_locked(uintptr_t ptr, size_t size, uint64_t id, size_t *at) {
    struct fake_vmm_handle *h = find_handle_locked(id, 0);
    if (h == NULL || size != h->size || ptr % h->granularity != 0 ||
        find_reservation_locked(ptr, size) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    size_t i = mapping_lower_bound_locked(ptr);
    if ((i < fake.mapping_count && fake.mappings[i].base < ptr + size) ||
        (i > 0 && fake.mappings[i - 1].base + fake.mappings[i - 1].size > ptr))
        return CUDA_ERROR_INVALID_VALUE; /* overlaps a mapping */
    *at = i;
    return CUDA_SUCCESS;
}

/* Maps all of handle `id` at [ptr, ptr + size) as mapping number `i` (check_map_locked). */
static CUresult map_locked(uintptr_t ptr, size_t size, uint64_t id, size_t i) {
    struct fake_vmm_handle *h = find_handle_locked(id, 0);
    if (reserve_one((void **)&fake.mappings, &fake.mapping_cap, fake.mapping_count,
                    sizeof *fake.mappings))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)h->offset) ==
        MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memmove(&fake.mappings[i + 1], &fake.mappings[i],
            (fake.mapping_count - i) * sizeof *fake.mappings);
    fake.mappings[i] = (struct fake_vmm_mapping){ptr, size, id, h->device, 0};
    fake.mapping_count++;
    h->map_count++;
    return CUDA_SUCCESS;
}

CUresult fakecudart_driver_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                    CUmemGenericAllocationHandle handle, unsigned long long flags) {
    CUresult rc = driver_enter(1);
    lock();
    if (rc == CUDA_SUCCESS && (offset != 0 || flags != 0 || size == 0 || ptr + size < ptr))
        rc = CUDA_ERROR_INVALID_VALUE;
    size_t at = 0;
    if (rc == CUDA_SUCCESS)
        rc = check_map_locked((uintptr_t)ptr, size, handle, &at);
    if (rc == CUDA_SUCCESS)
        rc = take_injection_locked(&fake.injected_map);
    if (rc == CUDA_SUCCESS)
        rc = map_locked((uintptr_t)ptr, size, handle, at);
    if (rc == CUDA_SUCCESS)
        fake.counters.vmm_maps++;
    return driver_leave_locked(rc);
}

/* 1 to device_count descriptors, each naming a device and read-write access (the only access the
 * fake models); the devices they name, as a bit mask, in *devices. */
static CUresult check_access(const CUmemAccessDesc *desc, size_t count, uint64_t *devices) {
    if (desc == NULL || count == 0 || count > (size_t)fake.device_count)
        return CUDA_ERROR_INVALID_VALUE;
    *devices = 0;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        if (!valid_device(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        *devices |= (uint64_t)1 << desc[i].location.id;
    }
    return CUDA_SUCCESS;
}

/* The range must consist of whole mappings, end to end. Each descriptor's device gains access to
 * every mapping of the range; devices given access before keep it. */
CUresult fakecudart_driver_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                          size_t count) {
    CUresult rc = driver_enter(1);
    lock();
    uint64_t devices = 0;
    if (rc == CUDA_SUCCESS)
        rc = check_access(desc, count, &devices);
    size_t first = 0, n = 0;
    if (rc == CUDA_SUCCESS && whole_mappings_locked((uintptr_t)ptr, size, &first, &n) != 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = take_injection_locked(&fake.injected_set_access);
    if (rc == CUDA_SUCCESS && mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) != 0)
        rc = CUDA_ERROR_UNKNOWN;
    if (rc == CUDA_SUCCESS) {
        for (size_t i = first; i < first + n; i++)
            fake.mappings[i].access |= devices;
        fake.counters.vmm_set_accesses++;
    }
    return driver_leave_locked(rc);
}

/* The range must consist of whole mappings, end to end. Does not wait for work on the memory,
 * like the real one; such work is counted as misuse in vmm_busy_unmaps. */
CUresult fakecudart_driver_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult rc = driver_enter(1);
    lock();
    uintptr_t lo = (uintptr_t)ptr;
    size_t first = 0, n = 0;
    if (rc == CUDA_SUCCESS && whole_mappings_locked(lo, size, &first, &n) != 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = take_injection_locked(&fake.injected_unmap);
    /* The reservation's PROT_NONE pages come back over the whole range at once. */
    if (rc == CUDA_SUCCESS &&
        mmap((void *)lo, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0) == MAP_FAILED)
        rc = CUDA_ERROR_UNKNOWN;
    if (rc == CUDA_SUCCESS) {
        if (range_busy_until_locked(lo, lo + size) != 0)
            fake.counters.vmm_busy_unmaps++;
        for (size_t i = first; i < first + n; i++) {
            struct fake_vmm_handle *h = find_handle_locked(fake.mappings[i].handle, 1);
            if (--h->map_count == 0 && h->released)
                free_handle_locked(h);
        }
        memmove(&fake.mappings[first], &fake.mappings[first + n],
                (fake.mapping_count - first - n) * sizeof *fake.mappings);
        fake.mapping_count -= n;
        fake.counters.vmm_unmaps++;
    }
    return driver_leave_locked(rc);
}

void vmm_after_fork_child_locked(void) {
    fake.vmm_fd = -1; /* the parent's stays open: the inherited handles use it */
    fake.vmm_file_end = 0;
    for (size_t i = 0; i < fake.handle_count; i++)
        fake.handles[i].inherited = 1;
}
