/*
 * testing.c — the fakecudart_* entry points for counters, capacity and failure injection
 * (the clock's entry points live in clock.c).
 */
#include <stddef.h>
#include <string.h>

#include "state.h"

void fakecudart_get_counters(fakecudart_counters *out) {
    fake_init_once();
    lock();
    *out = fake.counters;
    unlock();
}

uint64_t fakecudart_counter(const char *name) {
    static const struct { const char *name; size_t offset; } fields[] = {
#define FIELD(field, meaning) {#field, offsetof(fakecudart_counters, field)},
        FAKECUDART_COUNTER_LIST(FIELD)
#undef FIELD
    };
    fakecudart_counters c;
    fakecudart_get_counters(&c);
    for (size_t i = 0; name != NULL && i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].name, name) == 0)
            return *(const uint64_t *)((const char *)&c + fields[i].offset);
    return UINT64_MAX;
}

void fakecudart_reset_counters(void) {
    fake_init_once();
    lock();
    uint64_t in_use = fake.counters.bytes_in_use;
    memset(&fake.counters, 0, sizeof fake.counters);
    fake.counters.bytes_in_use = in_use;
    fake.counters.peak_bytes = in_use;
    unlock();
}

uint64_t fakecudart_device_bytes_in_use(int device) {
    fake_init_once();
    if (device < 0 || device >= fake.device_count)
        return 0;
    lock();
    uint64_t used = fake.devices[device].used;
    unlock();
    return used;
}

cudaError_t fakecudart_set_capacity(int device, size_t bytes) {
    fake_init_once();
    if (device < 0 || device >= fake.device_count)
        return cudaErrorInvalidDevice;
    lock();
    fake.devices[device].capacity = bytes;
    unlock();
    return cudaSuccess;
}

cudaError_t fakecudart_inject_call_failures(const char *call, unsigned count, cudaError_t code) {
    fake_init_once();
    cudaError_t rc = cudaSuccess;
    lock();
    struct fake_call_injection *inj = NULL;
    if (call != NULL && strcmp(call, "cudaEventQuery") == 0)
        inj = &fake.injected_query;
    else if (call != NULL && strcmp(call, "cudaDeviceReset") == 0)
        inj = &fake.injected_reset;
    else if (call != NULL && strcmp(call, "cudaDeviceSynchronize") == 0)
        inj = &fake.injected_sync;
    else if (call != NULL && (strcmp(call, "cudaEventCreate") == 0 ||
                              strcmp(call, "cudaEventCreateWithFlags") == 0))
        inj = &fake.injected_event_create;
    else if (call != NULL && strcmp(call, "cudaEventRecord") == 0)
        inj = &fake.injected_event_record;
    else if (call != NULL && strcmp(call, "cudaStreamIsCapturing") == 0)
        inj = &fake.injected_is_capturing;
    if (inj != NULL) {
        inj->count = count;
        inj->code = code;
    } else {
        rc = cudaErrorInvalidValue;
    }
    unlock();
    return rc;
}

cudaError_t take_call_failure_locked(struct fake_call_injection *inj) {
    if (inj->count == 0)
        return cudaSuccess;
    inj->count--;
    return inj->code;
}

int fakecudart_inject_driver_failure(const char *call, unsigned after, int code) {
    fake_init_once();
    struct fake_driver_injection *inj = NULL;
    if (call != NULL && strcmp(call, "cuMemUnmap") == 0)
        inj = &fake.injected_unmap;
    else if (call != NULL && strcmp(call, "cuMemSetAccess") == 0)
        inj = &fake.injected_set_access;
    else if (call != NULL && strcmp(call, "cuMemMap") == 0)
        inj = &fake.injected_map;
    else if (call != NULL && strcmp(call, "cuMemCreate") == 0)
        inj = &fake.injected_create;
    else if (call != NULL && strcmp(call, "cuMemAddressReserve") == 0)
        inj = &fake.injected_reserve;
    if (inj == NULL || code == 0)
        return cudaErrorInvalidValue;
    lock();
    inj->armed = 1;
    inj->after = after;
    inj->code = code;
    unlock();
    return cudaSuccess;
}

void fakecudart_inject_malloc_failures(unsigned count, cudaError_t code) {
    fake_init_once();
    lock();
    fake.injected_failures = count;
    fake.injected_code = code;
    unlock();
}
