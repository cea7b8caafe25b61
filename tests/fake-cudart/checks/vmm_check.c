/*
 * vmm_check.c — checks of the fake driver libcuda.so.1 (cuda.h: devices and virtual memory
 * management) and of how it shares state with the fake runtime, one scenario per argument, run
 * by tests/fake_cudart.rs. Linked with -l:libcuda.so.1 besides -lcudart. A scenario prints
 * "ok <name>" when every check held; the first failing check prints its line and expression on
 * stderr and exits with status 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <fakecudart.h>

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* A driver call and the CUresult it must answer. */
#define CHECK_CU(call, expected)                                                        \
    do {                                                                                \
        CUresult rc_ = (call);                                                          \
        if (rc_ != (expected)) {                                                        \
            const char *name_ = NULL;                                                   \
            cuGetErrorName(rc_, &name_);                                                \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__,      \
                    __LINE__, #call, (int)rc_, name_ ? name_ : "?", (int)(expected));   \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK_RC(call, expected)                                                        \
    do {                                                                                \
        cudaError_t rc_ = (call);                                                       \
        if (rc_ != (expected)) {                                                        \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__,      \
                    __LINE__, #call, (int)rc_, cudaGetErrorName(rc_), (int)(expected)); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define MiB ((size_t)1 << 20)
#define PAGE (2 * MiB)

static CUmemAllocationProp prop_on(int device) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

static CUmemAccessDesc read_write_on(int device) {
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return desc;
}

/* cuMemCreate + cuMemMap + cuMemSetAccess of one handle of `size` bytes at `at`. */
static CUmemGenericAllocationHandle map_new(CUdeviceptr at, size_t size, int device) {
    CUmemAllocationProp prop = prop_on(device);
    CUmemAccessDesc access = read_write_on(device);
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemCreate(&h, size, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(at, size, 0, h, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemSetAccess(at, size, &access, 1), CUDA_SUCCESS);
    return h;
}

static size_t free_bytes(void) {
    size_t free_b = 0, total = 0;
    CHECK_RC(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    return free_b;
}

/* The header's layouts are the real driver's (x86-64). */
static void layouts(void) {
    CHECK(sizeof(CUmemLocation) == 8);
    CHECK(sizeof(CUmemAllocationProp) == 32);
    CHECK(offsetof(CUmemAllocationProp, location) == 8);
    CHECK(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16);
    CHECK(offsetof(CUmemAllocationProp, allocFlags) == 24);
    CHECK(sizeof(CUmemAccessDesc) == 12);
    CHECK(sizeof(CUdeviceptr) == 8 && sizeof(CUmemGenericAllocationHandle) == 8);
}

/* Initialization, devices, attributes, granularity and error texts. */
static void basics(void) {
    int v = 0, n = 0;
    CUdevice dev = -1;
    layouts();
    /* Before cuInit and before any runtime call, only the version and error texts answer. */
    CHECK_CU(cuDriverGetVersion(&v), CUDA_SUCCESS);
    CHECK(v == 12080);
    CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CHECK_CU(cuDeviceGetCount(&n), CUDA_SUCCESS);
    CHECK(n == 2);
    CHECK_CU(cuDeviceGet(&dev, 1), CUDA_SUCCESS);
    CHECK(dev == 1);
    CHECK_CU(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK_CU(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
    CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK(v == 1);
    CHECK_CU(cuDeviceGetAttribute(&v, (CUdevice_attribute)1, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 5),
             CUDA_ERROR_INVALID_DEVICE);
    /* cudaDriverGetVersion agrees with the driver. */
    CHECK_RC(cudaDriverGetVersion(&v), cudaSuccess);
    CHECK(v == 12080);

    size_t g = 0;
    CUmemAllocationProp prop = prop_on(1);
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_SUCCESS);
    CHECK(g == PAGE);
    g = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             CUDA_SUCCESS);
    CHECK(g == PAGE);
    prop.location.id = 2;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_ERROR_INVALID_DEVICE);
    prop = prop_on(0);
    prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_ERROR_INVALID_VALUE);

    const char *s = NULL;
    CHECK_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    CHECK(strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    CHECK_CU(cuGetErrorString(CUDA_ERROR_NOT_SUPPORTED, &s), CUDA_SUCCESS);
    CHECK(strcmp(s, "operation not supported") == 0);
    CHECK_CU(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    CHECK(s == NULL);
    /* Every error answer above counts, and driver errors are not the runtime's last error. */
    CHECK(fakecudart_counter("driver_errors") == 9);
    CHECK_RC(cudaGetLastError(), cudaSuccess);
}

/* Reserve, create, map, access, copy, unmap, release, free: the expandable-segments cycle. */
static void cycle(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    size_t free0 = free_bytes();
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, 64 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK(base != 0 && base % PAGE == 0);
    CHECK(free_bytes() == free0); /* address space costs no device memory */
    char *p = (char *)(uintptr_t)base;

    /* One 2 MiB page: charged to device 0 like cudaMalloc. */
    CUmemAllocationProp prop = prop_on(0);
    CUmemAccessDesc access = read_write_on(0);
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 0), CUDA_SUCCESS);
    CHECK(h != 0);
    CHECK(free_bytes() == free0 - PAGE);
    CHECK(fakecudart_counter("bytes_in_use") == PAGE);
    CHECK(fakecudart_device_bytes_in_use(0) == PAGE);
    CHECK_CU(cuMemMap(base, PAGE, 0, h, 0), CUDA_SUCCESS);
    /* Mapped but not accessible yet: not device memory for the runtime. */
    CHECK_RC(cudaMemset(p, 0, 16), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_CU(cuMemSetAccess(base, PAGE, &access, 1), CUDA_SUCCESS);

    /* Real memory: the host writes and reads it, cudaMemcpy and cudaMemset reach it. */
    p[0] = 1;
    p[PAGE - 1] = 2;
    CHECK(p[0] == 1 && p[PAGE - 1] == 2);
    char host[256], back[256];
    for (int i = 0; i < 256; i++)
        host[i] = (char)(i * 3);
    CHECK_RC(cudaMemcpy(p + 100, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK(memcmp(p + 100, host, sizeof host) == 0);
    CHECK_RC(cudaMemcpy(back, p + 100, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(memcmp(back, host, sizeof host) == 0);
    CHECK_RC(cudaMemset(p + 1000, 0x7f, 10), cudaSuccess);
    CHECK((unsigned char)p[1009] == 0x7f);
    CHECK_RC(cudaMemcpy(p + PAGE - 10, host, 11, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    struct cudaPointerAttributes attr;
    CHECK_RC(cudaPointerGetAttributes(&attr, p + 5), cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 0 && attr.devicePointer == p + 5);
    CHECK_RC(cudaFree(p), cudaErrorInvalidValue); /* not cudaMalloc's */
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);

    /* An adjacent 20 MiB page: a copy may run across the two mappings. */
    CUmemGenericAllocationHandle big = map_new(base + PAGE, 10 * PAGE, 0);
    CHECK(fakecudart_device_bytes_in_use(0) == 11 * PAGE);
    CHECK_RC(cudaMemset(p, 0, 11 * PAGE), cudaSuccess);
    CHECK_RC(cudaMemset(p, 0, 11 * PAGE + 1), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_RC(cudaMemcpy(p + PAGE - 128, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK(memcmp(p + PAGE - 128, host, sizeof host) == 0);

    /* Access is set over whole mappings; several at once are fine. */
    CHECK_CU(cuMemSetAccess(base, 11 * PAGE, &access, 1), CUDA_SUCCESS);
    CHECK_CU(cuMemSetAccess(base, PAGE / 2, &access, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemSetAccess(base + 11 * PAGE, PAGE, &access, 1), CUDA_ERROR_INVALID_VALUE);

    /* Work still running on a page when it is unmapped is the caller's bug: counted. */
    cudaStream_t s;
    CHECK_RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_RC(fakecudart_launch(p + 10, 100, s, 50), cudaSuccess);
    CHECK_CU(cuMemUnmap(base, PAGE), CUDA_SUCCESS);
    CHECK(fakecudart_counter("vmm_busy_unmaps") == 1);
    CHECK_RC(cudaMemset(p, 0, 16), cudaErrorInvalidValue); /* gone for the runtime */
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);

    /* The handle's memory outlives its mapping: mapped again elsewhere, the bytes are there. */
    CHECK_CU(cuMemMap(base + 20 * PAGE, PAGE, 0, h, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemSetAccess(base + 20 * PAGE, PAGE, &access, 1), CUDA_SUCCESS);
    char *q = p + 20 * PAGE;
    CHECK(memcmp(q + PAGE - 128, host, 128) == 0);
    /* A synchronized caller unmaps without a busy count. */
    CHECK_RC(fakecudart_launch(q, PAGE, s, 50), cudaSuccess);
    CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_CU(cuMemUnmap(base + 20 * PAGE, PAGE), CUDA_SUCCESS);
    CHECK(fakecudart_counter("vmm_busy_unmaps") == 1);

    /* Released while mapped: the memory stays until its last mapping goes. */
    CHECK_CU(cuMemRelease(big), CUDA_SUCCESS);
    CHECK(fakecudart_device_bytes_in_use(0) == 11 * PAGE);
    CHECK_CU(cuMemRelease(big), CUDA_ERROR_INVALID_VALUE); /* already released */
    CHECK(p[PAGE + 1000] == 0);                             /* still mapped and usable */
    /* The reservation cannot go while something is mapped in it. */
    CHECK_CU(cuMemAddressFree(base, 64 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemUnmap(base + PAGE, 10 * PAGE), CUDA_SUCCESS);
    CHECK(fakecudart_device_bytes_in_use(0) == PAGE);
    /* Unmapped but not released: still charged; released: given back. */
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK(fakecudart_counter("peak_bytes") == 11 * PAGE);
    CHECK(free_bytes() == free0);
    CHECK_CU(cuMemMap(base, PAGE, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* released handle */

    CHECK_CU(cuMemAddressFree(base, 32 * MiB), CUDA_ERROR_INVALID_VALUE); /* not the whole range */
    CHECK_CU(cuMemAddressFree(base, 64 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(base, 64 * MiB), CUDA_ERROR_INVALID_VALUE);

    CHECK(fakecudart_counter("vmm_reserves") == 1);
    CHECK(fakecudart_counter("vmm_address_frees") == 1);
    CHECK(fakecudart_counter("vmm_creates") == 2);
    CHECK(fakecudart_counter("vmm_create_failures") == 0);
    CHECK(fakecudart_counter("vmm_maps") == 3);
    CHECK(fakecudart_counter("vmm_set_accesses") == 4);
    CHECK(fakecudart_counter("vmm_unmaps") == 3);
    CHECK(fakecudart_counter("vmm_releases") == 2);
    CHECK(fakecudart_counter("driver_errors") == 7);
    CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
}

/* Misuse answers CUDA_ERROR_INVALID_VALUE and changes nothing. */
static void misuse(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CUdeviceptr base = 0, other = 0;
    CHECK_CU(cuMemAddressReserve(&base, 3 * MiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressReserve(&base, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressReserve(&base, 8 * MiB, 3 * MiB, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressReserve(&base, 8 * MiB, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK(base == 0);
    /* A larger power-of-two alignment is honoured. */
    CHECK_CU(cuMemAddressReserve(&other, 8 * MiB, 64 * MiB, 0, 0), CUDA_SUCCESS);
    CHECK(other % (64 * MiB) == 0);
    CHECK_CU(cuMemAddressReserve(&base, 8 * MiB, 0, 0, 0), CUDA_SUCCESS);

    CUmemAllocationProp prop = prop_on(0);
    CUmemGenericAllocationHandle h = 0xdead;
    CHECK_CU(cuMemCreate(&h, MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);   /* not 2 MiB granular */
    CHECK_CU(cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemCreate(&h, PAGE, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 7;
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
    prop = prop_on(0);
    prop.location.type = CU_MEM_LOCATION_TYPE_INVALID;
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(h == 0xdead);
    CHECK(fakecudart_counter("vmm_create_failures") == 6);
    prop = prop_on(0);
    CHECK_CU(cuMemCreate(&h, 2 * PAGE, &prop, 0), CUDA_SUCCESS);

    /* Outside any reservation, over its end, at an offset, with the wrong size, unaligned. */
    void *plain;
    CHECK_RC(cudaMalloc(&plain, 16 * MiB), cudaSuccess);
    CUdeviceptr aligned_plain = ((CUdeviceptr)(uintptr_t)plain + PAGE - 1) / PAGE * PAGE;
    CHECK_CU(cuMemMap(aligned_plain, 2 * PAGE, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base + 3 * PAGE, 2 * PAGE, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base, 2 * PAGE, PAGE, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base, PAGE, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base + 4096, 2 * PAGE, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base, 2 * PAGE, 0, h + 1000, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base, 2 * PAGE, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
    /* Mapped once; the same place again, or overlapping it, is a double map. */
    CHECK_CU(cuMemMap(base, 2 * PAGE, 0, h, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(base, 2 * PAGE, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CUmemGenericAllocationHandle h2 = 0;
    CHECK_CU(cuMemCreate(&h2, 2 * PAGE, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(base + PAGE, 2 * PAGE, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base + 2 * PAGE, 2 * PAGE, 0, h2, 0), CUDA_SUCCESS);

    /* Access: only read-write for a device, over mapped memory. */
    CUmemAccessDesc access = read_write_on(0);
    CUmemAccessDesc read_only = access;
    read_only.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    CHECK_CU(cuMemSetAccess(base, 2 * PAGE, &read_only, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemSetAccess(base, 2 * PAGE, &access, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemSetAccess(base, 2 * PAGE, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemSetAccess(other, PAGE, &access, 1), CUDA_ERROR_INVALID_VALUE);
    CUmemAccessDesc both[2] = {read_write_on(0), read_write_on(1)};
    CHECK_CU(cuMemSetAccess(base, 4 * PAGE, both, 2), CUDA_SUCCESS);

    /* Unmap: whole mappings only. */
    CHECK_CU(cuMemUnmap(base, PAGE), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemUnmap(base + PAGE, 2 * PAGE), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemUnmap(other, PAGE), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemUnmap(base, 4 * PAGE), CUDA_SUCCESS); /* both at once */
    CHECK_CU(cuMemUnmap(base, 2 * PAGE), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h2), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressFree(base + PAGE, 8 * MiB - PAGE), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressFree(base, 8 * MiB), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(other, 8 * MiB), CUDA_SUCCESS);
    CHECK_RC(cudaFree(plain), cudaSuccess);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK(fakecudart_counter("vmm_busy_unmaps") == 0);
    CHECK(fakecudart_counter("driver_errors") == 30);
}

/* Run with FAKECUDART_CAPACITY=8MiB: the driver's memory and cudaMalloc's share the capacity. */
static void oom(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CUmemAllocationProp prop = prop_on(0);
    CUmemGenericAllocationHandle h[4], extra = 0xbeef;
    for (int i = 0; i < 3; i++)
        CHECK_CU(cuMemCreate(&h[i], PAGE, &prop, 0), CUDA_SUCCESS);
    CHECK(free_bytes() == PAGE);
    void *p = NULL;
    CHECK_RC(cudaMalloc(&p, PAGE + 1), cudaErrorMemoryAllocation);
    CHECK_RC(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_RC(cudaMalloc(&p, MiB), cudaSuccess);
    CHECK_CU(cuMemCreate(&extra, PAGE, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(extra == 0xbeef); /* untouched */
    CHECK_RC(cudaGetLastError(), cudaSuccess); /* the driver does not set the runtime's error */
    CHECK_RC(cudaFree(p), cudaSuccess);
    CHECK_CU(cuMemCreate(&h[3], PAGE, &prop, 0), CUDA_SUCCESS);
    CHECK(free_bytes() == 0);
    CHECK_CU(cuMemCreate(&extra, PAGE, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* Another device has its own capacity. */
    CUmemAllocationProp prop1 = prop_on(1);
    CHECK_CU(cuMemCreate(&extra, 10 * PAGE, &prop1, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CU(cuMemCreate(&extra, 4 * PAGE, &prop1, 0), CUDA_SUCCESS);
    CHECK(fakecudart_device_bytes_in_use(1) == 4 * PAGE);
    CHECK_CU(cuMemRelease(extra), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h[0]), CUDA_SUCCESS);
    CHECK(free_bytes() == PAGE);
    CHECK_CU(cuMemCreate(&h[0], PAGE, &prop, 0), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++)
        CHECK_CU(cuMemRelease(h[i]), CUDA_SUCCESS);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK(fakecudart_counter("peak_bytes") == 8 * PAGE); /* both devices full at once */
    CHECK(fakecudart_counter("vmm_create_failures") == 3);
    CHECK(fakecudart_counter("vmm_creates") == 6);
}

/* Run with FAKECUDART_DEVICES=3: memory of device 2, and a device reset that leaves it alone. */
static void devices(void) {
    CHECK_RC(cudaSetDevice(2), cudaSuccess); /* a runtime call initializes the driver */
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, 4 * PAGE, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = map_new(base, PAGE, 2);
    struct cudaPointerAttributes attr;
    CHECK_RC(cudaPointerGetAttributes(&attr, (void *)(uintptr_t)base), cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 2);
    CHECK(fakecudart_device_bytes_in_use(2) == PAGE);
    /* Adjacent mappings of different devices are not one device range. */
    CUmemGenericAllocationHandle h1 = map_new(base + PAGE, PAGE, 1);
    CHECK_RC(cudaMemset((void *)(uintptr_t)(base + PAGE - 1), 0, 2), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    /* The reset is the runtime's: the driver's mappings and memory stay. */
    CHECK_RC(cudaDeviceReset(), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(2) == PAGE);
    CHECK_RC(cudaMemset((void *)(uintptr_t)base, 1, PAGE), cudaSuccess);
    CHECK_CU(cuMemUnmap(base, 2 * PAGE), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h1), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(base, 4 * PAGE), CUDA_SUCCESS);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
}

/* Access is per device: memory that cuMemSetAccess gave device 0 only faults (700) when device 1
 * uses it, until device 1 is given access too; cudaMalloc memory is not checked that way. */
static void per_device_access(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, 4 * PAGE, 0, 0, 0), CUDA_SUCCESS);
    char *p = (char *)(uintptr_t)base;
    /* Two pages of device 0, accessible by device 0 only. */
    CUmemGenericAllocationHandle h0 = map_new(base, PAGE, 0);
    CUmemGenericAllocationHandle h1 = map_new(base + PAGE, PAGE, 0);
    cudaStream_t s1;
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaStreamCreate(&s1), cudaSuccess);
    CHECK_RC(cudaSetDevice(0), cudaSuccess);

    /* Device 1's work over it would fault: nothing enqueued. */
    CHECK_RC(fakecudart_launch(p, 2 * PAGE, s1, 10), cudaErrorIllegalAddress);
    CHECK(fakecudart_counter("vmm_access_faults") == 1);
    CHECK(fakecudart_counter("launches") == 0 && fakecudart_pending_work() == 0);
    CHECK_RC(cudaGetLastError(), cudaSuccess); /* a test entry point: no last error */
    CHECK_RC(fakecudart_launch(p, 2 * PAGE, 0, 10), cudaSuccess); /* device 0's stream */
    /* Copies and sets are the current device's: device 1's fault too, and record 700. */
    char host[64], back[64];
    for (int i = 0; i < 64; i++)
        host[i] = (char)(i + 1);
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaMemcpy(p, host, sizeof host, cudaMemcpyHostToDevice), cudaErrorIllegalAddress);
    CHECK_RC(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_RC(cudaMemset(p + PAGE, 0, 16), cudaErrorIllegalAddress);
    CHECK_RC(cudaMemcpy(back, p, sizeof back, cudaMemcpyDeviceToHost), cudaErrorIllegalAddress);
    CHECK(fakecudart_counter("vmm_access_faults") == 4);
    /* Bad ranges stay invalid values, whatever the access. */
    CHECK_RC(cudaMemset(p + 2 * PAGE - 8, 0, 16), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);

    /* Device 1 is given the first page: a range reaching into the second still faults. */
    CUmemAccessDesc on1 = read_write_on(1);
    CHECK_CU(cuMemSetAccess(base, PAGE, &on1, 1), CUDA_SUCCESS);
    CHECK_RC(fakecudart_launch(p, PAGE, s1, 10), cudaSuccess);
    CHECK_RC(fakecudart_launch(p + PAGE - 8, 16, s1, 10), cudaErrorIllegalAddress);
    CHECK_RC(cudaMemcpy(p + PAGE - 8, host, 16, cudaMemcpyHostToDevice), cudaErrorIllegalAddress);
    CHECK_RC(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK(fakecudart_counter("vmm_access_faults") == 6);
    /* And the second: device 1's work and copies succeed over both. */
    CHECK_CU(cuMemSetAccess(base + PAGE, PAGE, &on1, 1), CUDA_SUCCESS);
    CHECK_RC(fakecudart_launch(p, 2 * PAGE, s1, 10), cudaSuccess);
    CHECK_RC(cudaMemcpy(p + PAGE - 32, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_RC(cudaMemcpy(back, p + PAGE - 32, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(memcmp(back, host, sizeof host) == 0);
    /* Device 0 kept its access: access is added, not replaced. */
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaMemset(p, 0x11, 2 * PAGE), cudaSuccess);
    CHECK(p[2 * PAGE - 1] == 0x11);

    /* A third page, mapped without access: not device memory for anyone yet. Then two
     * descriptors at once give both devices access. */
    CUmemAllocationProp prop = prop_on(0);
    CUmemGenericAllocationHandle h2 = 0;
    CHECK_CU(cuMemCreate(&h2, PAGE, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(base + 2 * PAGE, PAGE, 0, h2, 0), CUDA_SUCCESS);
    CHECK_RC(fakecudart_launch(p + 2 * PAGE, 16, 0, 10), cudaErrorInvalidValue);
    CUmemAccessDesc both[2] = {read_write_on(1), read_write_on(0)};
    CUmemAccessDesc three[3] = {read_write_on(0), read_write_on(1), read_write_on(0)};
    CHECK_CU(cuMemSetAccess(base + 2 * PAGE, PAGE, three, 3), CUDA_ERROR_INVALID_VALUE);
    both[1].location.id = 2;
    CHECK_CU(cuMemSetAccess(base + 2 * PAGE, PAGE, both, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK_RC(fakecudart_launch(p + 2 * PAGE, 16, s1, 10), cudaErrorInvalidValue); /* unchanged */
    both[1].location.id = 0;
    CHECK_CU(cuMemSetAccess(base + 2 * PAGE, PAGE, both, 2), CUDA_SUCCESS);
    CHECK_RC(fakecudart_launch(p, 3 * PAGE, s1, 10), cudaSuccess);
    CHECK_RC(fakecudart_launch(p, 3 * PAGE, 0, 10), cudaSuccess);
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaMemset(p, 0x22, 3 * PAGE), cudaSuccess);
    CHECK((unsigned char)p[3 * PAGE - 1] == 0x22);

    /* cudaMalloc memory of device 0: device 1 uses it without any access being given. */
    void *plain = NULL;
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaMalloc(&plain, 4096), cudaSuccess);
    CHECK_RC(fakecudart_launch(plain, 4096, s1, 10), cudaSuccess);
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaMemset(plain, 0, 4096), cudaSuccess);
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaFree(plain), cudaSuccess);

    /* Unmapped and mapped again, a handle starts with no access. */
    CHECK_RC(cudaStreamSynchronize(s1), cudaSuccess);
    CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CU(cuMemUnmap(base, PAGE), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(base, PAGE, 0, h0, 0), CUDA_SUCCESS);
    CUmemAccessDesc on0 = read_write_on(0);
    CHECK_CU(cuMemSetAccess(base, PAGE, &on0, 1), CUDA_SUCCESS);
    CHECK_RC(fakecudart_launch(p, 16, s1, 10), cudaErrorIllegalAddress);
    CHECK(p[0] == 0x22); /* the bytes stayed with the handle */

    CHECK(fakecudart_counter("vmm_access_faults") == 7);
    CHECK(fakecudart_counter("vmm_busy_unmaps") == 0);
    CHECK(fakecudart_counter("vmm_set_accesses") == 6);
    CHECK_CU(cuMemUnmap(base, 3 * PAGE), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h0), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h1), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h2), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(base, 4 * PAGE), CUDA_SUCCESS);
    CHECK_RC(cudaStreamDestroy(s1), cudaSuccess);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
}

/* The GPUDirect RDMA flag of cuMemCreate: taken where the attribute says so (the default);
 * under FAKECUDART_VMM_RDMA=0 the attribute is 0 and the flag answers CUDA_ERROR_INVALID_VALUE. */
static void rdma(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    const char *env = getenv("FAKECUDART_VMM_RDMA");
    int expected = !(env != NULL && strcmp(env, "0") == 0);
    int v = -1;
    CHECK_CU(
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0),
        CUDA_SUCCESS);
    CHECK(v == expected);
    CUmemAllocationProp prop = prop_on(0);
    prop.allocFlags.gpuDirectRDMACapable = 1;
    CUmemGenericAllocationHandle h = 0;
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 0), expected ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
    if (expected)
        CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK(fakecudart_counter("vmm_rdma_creates") == (uint64_t)expected);
    prop.allocFlags.gpuDirectRDMACapable = 0;
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK(fakecudart_counter("vmm_rdma_creates") == (uint64_t)expected);
}

/* Run with FAKECUDART_VMM_GRANULARITY=64KiB and FAKECUDART_VMM_RDMA_GRANULARITY=4MiB: the
 * granularity is the answer for the properties asked about, and each handle's size and mapping
 * address must be multiples of the granularity of the properties it was made with. */
static void granularity(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    const size_t fine = 64 << 10, coarse = 4 * MiB;
    CUmemAllocationProp prop = prop_on(0), rdma_prop = prop_on(0);
    rdma_prop.allocFlags.gpuDirectRDMACapable = 1;
    size_t g = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_SUCCESS);
    CHECK(g == fine);
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             CUDA_SUCCESS);
    CHECK(g == fine);
    CHECK_CU(cuMemGetAllocationGranularity(&g, &rdma_prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_SUCCESS);
    CHECK(g == coarse);

    /* The default alignment of a reservation is the coarsest granularity. */
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, 16 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK(base % coarse == 0);
    CUmemGenericAllocationHandle h = 0, r = 0;
    CHECK_CU(cuMemCreate(&h, fine, &prop, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemCreate(&r, 2 * MiB, &rdma_prop, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemCreate(&r, coarse, &rdma_prop, 0), CUDA_SUCCESS);
    /* The fine handle maps at any multiple of 64 KiB, the RDMA one only at multiples of 4 MiB. */
    CHECK_CU(cuMemMap(base + fine, fine, 0, h, 0), CUDA_SUCCESS);
    CHECK_CU(cuMemMap(base + 2 * MiB, coarse, 0, r, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(base + coarse, coarse, 0, r, 0), CUDA_SUCCESS);
    CUmemAccessDesc access = read_write_on(0);
    CHECK_CU(cuMemSetAccess(base + fine, fine, &access, 1), CUDA_SUCCESS);
    CHECK_CU(cuMemSetAccess(base + coarse, coarse, &access, 1), CUDA_SUCCESS);
    memset((void *)(uintptr_t)(base + fine), 1, fine);
    CHECK_CU(cuMemUnmap(base + fine, fine), CUDA_SUCCESS);
    CHECK_CU(cuMemUnmap(base + coarse, coarse), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(r), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(base, 16 * MiB), CUDA_SUCCESS);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK(fakecudart_counter("driver_errors") == 2);
}

/* Run with FAKECUDART_VMM=0: a device without virtual memory management. */
static void vmm_off(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    int v = -1;
    CHECK_CU(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK(v == 0);
    CUmemAllocationProp prop = prop_on(0);
    CUmemGenericAllocationHandle h = 0xdead;
    CHECK_CU(cuMemCreate(&h, PAGE, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    CHECK(h == 0xdead);
    CHECK(fakecudart_counter("vmm_create_failures") == 1);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    void *p;
    CHECK_RC(cudaMalloc(&p, PAGE), cudaSuccess); /* the runtime is unaffected */
    CHECK_RC(cudaFree(p), cudaSuccess);
}

/* Run with FAKECUDART_FAIL set: the driver is not initialized, whatever is asked. */
static void fail(void) {
    int v = 0;
    CUdeviceptr base = 0;
    CHECK_CU(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuDriverGetVersion(&v), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuDeviceGetCount(&v), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuMemAddressReserve(&base, PAGE, 0, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
    const char *s = NULL;
    CHECK_CU(cuGetErrorString(CUDA_ERROR_NOT_INITIALIZED, &s), CUDA_SUCCESS);
    CHECK(strcmp(s, "initialization error") == 0);
    CHECK(fakecudart_counter("driver_errors") == 4);
}

/* Run with FAKECUDART_DEVICES=0. */
static void no_device(void) {
    int n = 5;
    CHECK_CU(cuInit(0), CUDA_ERROR_NO_DEVICE);
    CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NO_DEVICE);
    CHECK(n == 5);
}

#define THREADS 8
#define ROUNDS 50
#define PAGES 16

/* Each thread grows and shrinks a range of its own, page by page, with work on the pages. */
static void *vmm_worker(void *arg) {
    int device = (int)(intptr_t)arg % 2;
    CUdeviceptr base = 0;
    CUmemGenericAllocationHandle h[PAGES];
    cudaStream_t s;
    CHECK_RC(cudaSetDevice(device), cudaSuccess);
    CHECK_RC(cudaStreamCreate(&s), cudaSuccess);
    CHECK_CU(cuMemAddressReserve(&base, PAGES * PAGE, 0, 0, 0), CUDA_SUCCESS);
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < PAGES; i++) {
            h[i] = map_new(base + (CUdeviceptr)i * PAGE, PAGE, device);
            ((volatile char *)(uintptr_t)base)[(size_t)i * PAGE] = (char)r;
        }
        CHECK_RC(fakecudart_launch((void *)(uintptr_t)base, PAGES * PAGE, s, 5), cudaSuccess);
        CHECK_RC(cudaStreamSynchronize(s), cudaSuccess);
        for (int i = 0; i < PAGES; i++) {
            CHECK_CU(cuMemUnmap(base + (CUdeviceptr)i * PAGE, PAGE), CUDA_SUCCESS);
            CHECK_CU(cuMemRelease(h[i]), CUDA_SUCCESS);
        }
    }
    CHECK_CU(cuMemAddressFree(base, PAGES * PAGE), CUDA_SUCCESS);
    CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
    return NULL;
}

static void threads(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, vmm_worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(fakecudart_counter("vmm_creates") == THREADS * ROUNDS * PAGES);
    CHECK(fakecudart_counter("vmm_releases") == THREADS * ROUNDS * PAGES);
    CHECK(fakecudart_counter("vmm_unmaps") == THREADS * ROUNDS * PAGES);
    CHECK(fakecudart_counter("vmm_busy_unmaps") == 0);
    CHECK(fakecudart_counter("driver_errors") == 0);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK(fakecudart_counter("peak_bytes") <= THREADS * PAGES * PAGE);
}

/* Many live pages at once, more than the default open-file limit: one backing file serves all. */
static void many_pages(void) {
    enum { N = 2048 };
    static CUmemGenericAllocationHandle h[N];
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, (size_t)N * PAGE, 0, 0, 0), CUDA_SUCCESS);
    for (int i = 0; i < N; i++)
        h[i] = map_new(base + (CUdeviceptr)i * PAGE, PAGE, 0);
    CHECK(fakecudart_device_bytes_in_use(0) == (uint64_t)N * PAGE);
    CHECK_RC(cudaMemset((void *)(uintptr_t)(base + PAGE - 8), 3, 16), cudaSuccess);
    CHECK_CU(cuMemUnmap(base, (size_t)N * PAGE), CUDA_SUCCESS);
    for (int i = 0; i < N; i++)
        CHECK_CU(cuMemRelease(h[i]), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(base, (size_t)N * PAGE), CUDA_SUCCESS);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
}

/* A forked child can use the driver; its new memory never lands on the parent's, and releasing
 * what it inherited does not take the parent's bytes away. */
static void fork_child(void) {
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, 8 * PAGE, 0, 0, 0), CUDA_SUCCESS);
    char *p = (char *)(uintptr_t)base;
    CUmemGenericAllocationHandle a = map_new(base, PAGE, 0);
    memset(p, 'P', PAGE);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        CUmemGenericAllocationHandle b = map_new(base + PAGE, PAGE, 0);
        memset(p + PAGE, 'C', PAGE);
        CHECK_CU(cuMemUnmap(base, 2 * PAGE), CUDA_SUCCESS);
        CHECK_CU(cuMemRelease(a), CUDA_SUCCESS);
        CHECK_CU(cuMemRelease(b), CUDA_SUCCESS);
        CHECK(fakecudart_counter("bytes_in_use") == 0);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(p[0] == 'P' && p[PAGE - 1] == 'P');
    CUmemGenericAllocationHandle c = map_new(base + PAGE, PAGE, 0);
    CHECK(p[PAGE] == 0 && p[2 * PAGE - 1] == 0);
    CHECK(fakecudart_device_bytes_in_use(0) == 2 * PAGE);
    CHECK_CU(cuMemUnmap(base, 2 * PAGE), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(a), CUDA_SUCCESS);
    CHECK_CU(cuMemRelease(c), CUDA_SUCCESS);
    CHECK_CU(cuMemAddressFree(base, 8 * PAGE), CUDA_SUCCESS);
}

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"basics", basics},   {"cycle", cycle},     {"misuse", misuse},
    {"oom", oom},         {"devices", devices}, {"vmm-off", vmm_off},
    {"fail", fail},       {"no-device", no_device}, {"threads", threads},
    {"many-pages", many_pages}, {"fork", fork_child}, {"access", per_device_access},
    {"rdma", rdma},       {"granularity", granularity},
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        if (strcmp(scenarios[i].name, argv[1]) == 0) {
            scenarios[i].run();
            printf("ok %s\n", argv[1]);
            return 0;
        }
    }
    fprintf(stderr, "unknown scenario '%s'\n", argv[1]);
    return 2;
}
