/*
 * cuda.h — the subset of the CUDA driver API that the fake `libcuda.so.1` of the cachealloc test
 * suite implements: initialization, devices, and virtual memory management (VMM), the calls
 * behind PyTorch's "expandable segments". Type names, layouts, enum values, error codes and
 * prototypes are those of the real CUDA 12 cuda.h, so a program written against the real header
 * compiles against this one (as far as it stays inside the subset) and links against either
 * library.
 *
 * The fake driver lives inside the fake runtime (libcudart.so.12 exports fakecudart_driver_cu*;
 * libcuda.so.1 only forwards to them), so both share one state: devices, capacity, the bytes in
 * use that cudaMemGetInfo reports, the counters and the simulated clock (fakecudart.h).
 *
 *  - Initialization. Calls other than cuInit, cuDriverGetVersion, cuGetErrorName and
 *    cuGetErrorString answer CUDA_ERROR_NOT_INITIALIZED until cuInit(0) or any runtime call has
 *    run (the real runtime initializes the driver at its first call, and loads libcuda.so.1 then
 *    with dlopen, through its own RUNPATH). FAKECUDART_FAIL set: every driver call answers
 *    CUDA_ERROR_NOT_INITIALIZED; FAKECUDART_DEVICES=0: CUDA_ERROR_NO_DEVICE.
 *  - Granularity: 2 MiB (minimum and recommended; FAKECUDART_VMM_GRANULARITY), or
 *    FAKECUDART_VMM_RDMA_GRANULARITY for properties with allocFlags.gpuDirectRDMACapable. A
 *    handle's size and the addresses it is mapped at must be multiples of the granularity of its
 *    properties, and reservation sizes multiples of 2 MiB, else CUDA_ERROR_INVALID_VALUE. Every
 *    `flags` argument must be 0.
 *  - cuMemAddressReserve reserves host address space (PROT_NONE, no memory behind it, not charged
 *    to any device), aligned to 2 MiB, the coarsest granularity or the requested power-of-two
 *    alignment; the address hint is ignored. cuMemAddressFree takes back exactly one whole
 *    reservation with nothing mapped in it.
 *  - cuMemCreate makes physical memory of one device (CU_MEM_ALLOCATION_TYPE_PINNED,
 *    CU_MEM_LOCATION_TYPE_DEVICE): charged to that device's capacity exactly like cudaMalloc
 *    (over capacity: CUDA_ERROR_OUT_OF_MEMORY, *handle untouched), so cudaMemGetInfo's free bytes
 *    fall. FAKECUDART_VMM=0 mimics a device without VMM: attribute
 *    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0 and cuMemCreate answers
 *    CUDA_ERROR_NOT_SUPPORTED. allocFlags.gpuDirectRDMACapable is accepted where attribute
 *    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 1 (FAKECUDART_VMM_RDMA, default
 *    1) and counted in vmm_rdma_creates; elsewhere cuMemCreate with it answers
 *    CUDA_ERROR_INVALID_VALUE. cuMemRelease drops the handle; the memory goes back to the device
 *    when the handle is released and no longer mapped anywhere (as in the real driver).
 *  - cuMemMap maps a whole handle (offset 0, size = the handle's size) into a reserved range, not
 *    over another mapping; the memory is not accessible until cuMemSetAccess gives the range
 *    CU_MEM_ACCESS_FLAGS_PROT_READWRITE for a device. cuMemSetAccess takes 1 to device-count
 *    descriptors (CU_MEM_LOCATION_TYPE_DEVICE, read-write; else CUDA_ERROR_INVALID_VALUE, or
 *    CUDA_ERROR_INVALID_DEVICE for a device that does not exist) and adds each device to the
 *    devices with access to every mapping of the range. Mapped and access-enabled memory is live
 *    device memory of the handle's device for cudaMemcpy, cudaMemset, cudaPointerGetAttributes and
 *    fakecudart_launch, for the devices with access only (another device's use answers
 *    cudaErrorIllegalAddress, counted in vmm_access_faults; peer access opens nothing here), and
 *    the host can read and write it once any device has access (tests inspect it).
 *  - cuMemUnmap takes back whole mappings (the range must cover each of them exactly). Like the
 *    real one it does not wait for work still using the memory; when simulated work that is not
 *    complete yet touches the range, the counter vmm_busy_unmaps counts the misuse (a correct
 *    caller synchronizes first).
 *  - cudaDeviceReset leaves VMM reservations, handles and mappings alone: they belong to the
 *    driver, not to the runtime's context.
 */
#ifndef FAKECUDART_CUDA_H
#define FAKECUDART_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_VERSION 12090 /* the header of CUDA 12.9, like the fake runtime */

/* Error codes: the numeric values of the real driver. */
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110
} CUdevice_attribute;

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
    CU_MEM_ALLOCATION_TYPE_MAX = 0x7FFFFFFF
} CUmemAllocationType;

typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
    CU_MEM_HANDLE_TYPE_WIN32 = 0x2,
    CU_MEM_HANDLE_TYPE_WIN32_KMT = 0x4,
    CU_MEM_HANDLE_TYPE_MAX = 0x7FFFFFFF
} CUmemAllocationHandleType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    CU_MEM_LOCATION_TYPE_MAX = 0x7FFFFFFF
} CUmemLocationType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
    CU_MEM_ACCESS_FLAGS_PROT_MAX = 0x7FFFFFFF
} CUmemAccess_flags;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* Initialization, versions, errors */
CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);

/* Devices */
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);

/* Virtual memory management */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDART_CUDA_H */
