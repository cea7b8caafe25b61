/*
 * driver.c — the fake driver's initialization, version, devices and error texts (cuda.h), and the
 * entry and exit shared by every driver call. Exported as fakecudart_driver_<name>; libcuda.so.1
 * forwards the real names here (see driver.h). The memory calls live in vmm.c.
 *
 * The driver shares the runtime's state: its devices are the runtime's (FAKECUDART_DEVICES), and
 * it is initialized by cuInit or by the runtime's first call, as the real runtime initializes the
 * driver at its start.
 */
#include "driver.h"
#include "state.h"

CUresult driver_enter(int needs_init) {
    fake_config_once();
    if (fake.fail_code == cudaErrorNoDevice && fake.device_count == 0)
        return CUDA_ERROR_NO_DEVICE;
    if (fake.fail_code != cudaSuccess)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (needs_init && !__atomic_load_n(&fake.driver_initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

CUresult driver_leave_locked(CUresult rc) {
    if (rc != CUDA_SUCCESS)
        fake.counters.driver_errors++;
    unlock();
    return rc;
}

CUresult take_injection_locked(struct fake_driver_injection *inj) {
    if (!inj->armed)
        return CUDA_SUCCESS;
    if (inj->after > 0) {
        inj->after--;
        return CUDA_SUCCESS;
    }
    inj->armed = 0;
    return (CUresult)inj->code;
}

int valid_device(int device) { return device >= 0 && device < fake.device_count; }

CUresult fakecudart_driver_cuInit(unsigned int Flags) {
    CUresult rc = driver_enter(0);
    lock();
    if (rc == CUDA_SUCCESS && Flags != 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        __atomic_store_n(&fake.driver_initialized, 1, __ATOMIC_RELEASE);
    return driver_leave_locked(rc);
}

CUresult fakecudart_driver_cuDriverGetVersion(int *driverVersion) {
    CUresult rc = driver_enter(0);
    lock();
    if (rc == CUDA_SUCCESS && driverVersion == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *driverVersion = FAKE_DRIVER_VERSION;
    return driver_leave_locked(rc);
}

CUresult fakecudart_driver_cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult rc = driver_enter(1);
    lock();
    if (rc == CUDA_SUCCESS && device == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (rc == CUDA_SUCCESS && !valid_device(ordinal))
        rc = CUDA_ERROR_INVALID_DEVICE;
    if (rc == CUDA_SUCCESS)
        *device = ordinal;
    return driver_leave_locked(rc);
}

CUresult fakecudart_driver_cuDeviceGetCount(int *count) {
    CUresult rc = driver_enter(1);
    lock();
    if (rc == CUDA_SUCCESS && count == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *count = fake.device_count;
    return driver_leave_locked(rc);
}

/* Only CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (FAKECUDART_VMM) and
 * CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (FAKECUDART_VMM_RDMA) are known. */
CUresult fakecudart_driver_cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    CUresult rc = driver_enter(1);
    lock();
    if (rc == CUDA_SUCCESS && pi == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (rc == CUDA_SUCCESS && !valid_device(dev))
        rc = CUDA_ERROR_INVALID_DEVICE;
    else if (rc == CUDA_SUCCESS &&
             attrib == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        *pi = fake.vmm_supported;
    else if (rc == CUDA_SUCCESS &&
             attrib == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)
        *pi = fake.vmm_rdma_supported;
    else if (rc == CUDA_SUCCESS)
        rc = CUDA_ERROR_INVALID_VALUE;
    return driver_leave_locked(rc);
}

/* Names and descriptions, with the texts of the real driver. */
static const struct {
    CUresult code;
    const char *name;
    const char *text;
} error_texts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* Like the real driver: an unknown code answers CUDA_ERROR_INVALID_VALUE and *pStr = NULL. These
 * work before cuInit and whatever FAKECUDART_FAIL says. */
static CUresult error_text(CUresult error, const char **pStr, int want_name) {
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    lock();
    if (pStr != NULL) {
        *pStr = NULL;
        for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++) {
            if (error_texts[i].code == error) {
                *pStr = want_name ? error_texts[i].name : error_texts[i].text;
                rc = CUDA_SUCCESS;
            }
        }
    }
    return driver_leave_locked(rc);
}

CUresult fakecudart_driver_cuGetErrorName(CUresult error, const char **pStr) {
    return error_text(error, pStr, 1);
}

CUresult fakecudart_driver_cuGetErrorString(CUresult error, const char **pStr) {
    return error_text(error, pStr, 0);
}
