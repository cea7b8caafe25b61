/*
 * driver.h — the fake CUDA driver's entry points, listed once (not installed).
 *
 * The driver is implemented inside libcudart.so.12 (vmm.c), so that it shares the runtime's state,
 * and exported there as fakecudart_driver_<name> (the version script's fakecudart_* pattern).
 * libcuda.so.1 (driver/libcuda.c) defines each real <name> as a call of that export. Both expand
 * FAKECUDART_DRIVER_FUNCTIONS, so the two libraries cannot disagree on a signature, and the
 * compiler checks libcuda's definitions against the real prototypes of cuda.h.
 *
 * X(name, parameters, arguments)
 */
#ifndef FAKECUDART_DRIVER_H
#define FAKECUDART_DRIVER_H

#include "cuda.h"

#define FAKECUDART_DRIVER_FUNCTIONS(X)                                                          \
    X(cuInit, (unsigned int Flags), (Flags))                                                   \
    X(cuDriverGetVersion, (int *driverVersion), (driverVersion))                               \
    X(cuGetErrorName, (CUresult error, const char **pStr), (error, pStr))                      \
    X(cuGetErrorString, (CUresult error, const char **pStr), (error, pStr))                    \
    X(cuDeviceGet, (CUdevice *device, int ordinal), (device, ordinal))                         \
    X(cuDeviceGetCount, (int *count), (count))                                                 \
    X(cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev),                \
      (pi, attrib, dev))                                                                       \
    X(cuMemGetAllocationGranularity,                                                           \
      (size_t *granularity, const CUmemAllocationProp *prop,                                   \
       CUmemAllocationGranularity_flags option),                                               \
      (granularity, prop, option))                                                             \
    X(cuMemAddressReserve,                                                                     \
      (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,                      \
       unsigned long long flags),                                                              \
      (ptr, size, alignment, addr, flags))                                                     \
    X(cuMemAddressFree, (CUdeviceptr ptr, size_t size), (ptr, size))                           \
    X(cuMemCreate,                                                                             \
      (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,     \
       unsigned long long flags),                                                              \
      (handle, size, prop, flags))                                                             \
    X(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))                           \
    X(cuMemMap,                                                                                \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,       \
       unsigned long long flags),                                                              \
      (ptr, size, offset, handle, flags))                                                      \
    X(cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size))                                 \
    X(cuMemSetAccess,                                                                          \
      (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count),               \
      (ptr, size, desc, count))

#define FAKECUDART_DRIVER_DECLARE(name, params, args) CUresult fakecudart_driver_##name params;
FAKECUDART_DRIVER_FUNCTIONS(FAKECUDART_DRIVER_DECLARE)
#undef FAKECUDART_DRIVER_DECLARE

#endif /* FAKECUDART_DRIVER_H */
