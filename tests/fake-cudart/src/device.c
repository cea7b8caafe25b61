/*
 * device.c — device count, the per-thread current device, device-wide synchronization and reset.
 */
#include "state.h"

cudaError_t cudaGetDeviceCount(int *count) {
    fake_init_once();
    if (fake.fail_code != cudaSuccess) {
        if (count != NULL)
            *count = 0;
        return record(fake.fail_code);
    }
    if (count == NULL)
        return record(cudaErrorInvalidValue);
    *count = fake.device_count;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    ENTER();
    if (device == NULL)
        return record(cudaErrorInvalidValue);
    *device = fake_current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    ENTER();
    if (device < 0 || device >= fake.device_count)
        return record(cudaErrorInvalidDevice);
    fake_current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    ENTER();
    lock();
    fake.counters.device_syncs++;
    device_sync_locked(fake_current_device);
    unlock();
    return cudaSuccess;
}

/* Frees the current device's allocations, streams and events and drops its pending work. */
cudaError_t cudaDeviceReset(void) {
    ENTER();
    lock();
    fake.counters.device_resets++;
    if (fake.injected_reset_failures > 0) {
        fake.injected_reset_failures--;
        cudaError_t rc = fake.injected_reset_code;
        unlock();
        return record(rc);
    }
    free_device_allocs_locked(fake_current_device);
    drop_device_streams_locked(fake_current_device);
    drop_device_work_locked(fake_current_device);
    unlock();
    return cudaSuccess;
}
