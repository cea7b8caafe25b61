/*
 * device.c — device count, the per-thread current device, device-wide synchronization and reset,
 * and peer access.
 *
 * Peer access is bookkeeping: every pair of distinct devices can access each other, and
 * cudaDeviceEnablePeerAccess / cudaDeviceDisablePeerAccess keep, per device, the set of peers it
 * enabled, with the real runtime's answers. Nothing else looks at it: cudaMalloc memory is usable
 * from any device anyway, and driver-mapped memory only by the devices cuMemSetAccess named (as
 * on a real GPU, where peer access does not extend to such memory).
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
    cudaError_t rc = take_call_failure_locked(&fake.injected_sync);
    if (rc == cudaSuccess)
        rc = capture_check_locked(CAPTURE_SYNC);
    if (rc != cudaSuccess) {
        unlock();
        return record(rc);
    }
    device_sync_locked(fake_current_device);
    unlock();
    return cudaSuccess;
}

/* Forgets peer access from `device` to others and from others to it, as the real cudaDeviceReset
 * of either device of a pair ends the pair's access. */
static void drop_peer_access_locked(int device) {
    fake.peer_access[device] = 0;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        fake.peer_access[d] &= ~((uint64_t)1 << device);
}

/* Frees the current device's allocations, streams and events and drops its pending work and its
 * peer access, both ways. */
cudaError_t cudaDeviceReset(void) {
    ENTER();
    lock();
    fake.counters.device_resets++;
    cudaError_t rc = take_call_failure_locked(&fake.injected_reset);
    if (rc != cudaSuccess) {
        unlock();
        return record(rc);
    }
    free_device_allocs_locked(fake_current_device);
    drop_device_streams_locked(fake_current_device);
    drop_device_work_locked(fake_current_device);
    drop_peer_access_locked(fake_current_device);
    unlock();
    return cudaSuccess;
}

/* Any two distinct devices can; a device is not its own peer. */
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
    ENTER();
    if (canAccessPeer == NULL)
        return record(cudaErrorInvalidValue);
    if (!valid_device(device) || !valid_device(peerDevice))
        return record(cudaErrorInvalidDevice);
    *canAccessPeer = device != peerDevice;
    return cudaSuccess;
}

/* The current device gains access to peerDevice's memory (one way). As documented: a peer the
 * current device cannot access (itself included) is cudaErrorInvalidDevice, flags other than 0
 * cudaErrorInvalidValue, a second enable cudaErrorPeerAccessAlreadyEnabled. */
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
    ENTER();
    int device = fake_current_device;
    if (flags != 0)
        return record(cudaErrorInvalidValue);
    if (!valid_device(peerDevice) || peerDevice == device)
        return record(cudaErrorInvalidDevice);
    uint64_t bit = (uint64_t)1 << peerDevice;
    cudaError_t rc = cudaErrorPeerAccessAlreadyEnabled;
    lock();
    if ((fake.peer_access[device] & bit) == 0) {
        fake.peer_access[device] |= bit;
        fake.counters.peer_enables++;
        rc = cudaSuccess;
    }
    unlock();
    return record(rc);
}

/* A peer the current device has not enabled (itself included) is cudaErrorPeerAccessNotEnabled;
 * an ordinal out of range cudaErrorInvalidDevice. */
cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
    ENTER();
    int device = fake_current_device;
    if (!valid_device(peerDevice))
        return record(cudaErrorInvalidDevice);
    uint64_t bit = (uint64_t)1 << peerDevice;
    cudaError_t rc = cudaErrorPeerAccessNotEnabled;
    lock();
    if ((fake.peer_access[device] & bit) != 0) {
        fake.peer_access[device] &= ~bit;
        rc = cudaSuccess;
    }
    unlock();
    return record(rc);
}
