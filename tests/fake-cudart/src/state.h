/*
 * state.h — the fake runtime's process-wide state, shared by its source files (not installed).
 *
 * Every exported CUDA function follows one shape:
 *
 *     cudaError_t cudaX(...) {
 *         ENTER();                        // first-call init, FAKECUDART_FAIL / no-device answer
 *         lock();  ... work on `fake` ...  unlock();
 *         return record(rc);              // an error becomes the thread's last error
 *     }
 *
 * Helpers whose name ends in `_locked` expect the lock to be held.
 */
#ifndef FAKECUDART_STATE_H
#define FAKECUDART_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "fakecudart.h"

#define FAKE_MAX_DEVICES 64
#define FAKE_DEFAULT_DEVICES 2
#define FAKE_DEFAULT_CAPACITY (16ull << 30) /* bytes: 16 GiB per device */
#define FAKE_RUNTIME_VERSION 12090          /* CUDA 12.9, like the nvidia-cuda-runtime-cu12 wheel */
#define FAKE_DRIVER_VERSION 12090
#define FAKE_PITCH_ALIGNMENT 512            /* bytes */

/* A stream: a created one, or a device's legacy default stream or per-thread default stream. */
struct CUstream_st {
    int device;
    unsigned flags;           /* cudaStreamNonBlocking or 0 */
    int priority;
    uint64_t tail;            /* tick at which the last action issued on it completes */
    struct CUstream_st *next; /* live list of created streams */
};

struct CUevent_st {
    int device;
    unsigned flags;
    int recorded;
    uint64_t done_at;         /* tick at which the recorded work completes */
    struct CUevent_st *next;  /* live list */
};

struct fake_device {
    uint64_t capacity;        /* bytes */
    uint64_t used;            /* bytes charged by live allocations */
    struct CUstream_st legacy;
    struct CUstream_st per_thread;
    uint64_t retired_blocking_tail; /* latest tail of destroyed blocking streams */
    uint64_t max_tail;        /* latest completion of anything issued on the device */
};

enum fake_alloc_kind { ALLOC_DEVICE, ALLOC_PITCH, ALLOC_MANAGED, ALLOC_HOST };

struct fake_alloc {
    uintptr_t base;
    size_t size;              /* bytes asked for (after pitch rounding) */
    size_t map_len;           /* bytes mapped (at least 1 page) */
    int device;
    enum fake_alloc_kind kind;
};

/* Simulated work touching [lo, hi) until tick `end`. */
struct fake_work {
    uintptr_t lo, hi;
    uint64_t end;
    int device;
};

struct fake_state {
    int device_count;
    cudaError_t fail_code;    /* nonzero: every call answers this */
    struct fake_device devices[FAKE_MAX_DEVICES];
    /* Live allocations sorted by base address. */
    struct fake_alloc *allocs;
    size_t alloc_count, alloc_cap;
    struct fake_work *work;
    size_t work_count, work_cap;
    struct CUstream_st *streams;
    struct CUevent_st *events;
    uint64_t now;             /* ticks */
    unsigned injected_failures;
    cudaError_t injected_code;
    unsigned injected_query_failures; /* of cudaEventQuery */
    cudaError_t injected_query_code;
    unsigned injected_reset_failures; /* of cudaDeviceReset */
    cudaError_t injected_reset_code;
    fakecudart_counters counters;
};

extern struct fake_state fake;
extern __thread int fake_current_device;

void fake_init_once(void);
void lock(void);
void unlock(void);
/* Records a returned error as the thread's last error and returns it. */
cudaError_t record(cudaError_t rc);

/* First call: read the environment. Then answer FAKECUDART_FAIL / no-device if configured. */
#define ENTER()                                   \
    do {                                          \
        fake_init_once();                         \
        if (fake.fail_code != cudaSuccess)        \
            return record(fake.fail_code);        \
    } while (0)

/* Memory (memory.c). */
struct fake_alloc *find_alloc_locked(uintptr_t addr); /* allocation containing addr, or NULL */
int range_in_device_alloc_locked(uintptr_t lo, size_t bytes);
void free_device_allocs_locked(int device);
void note_bytes_locked(void);

/* Streams, events and the clock (clock.c, streams.c). */
struct CUstream_st *resolve_stream_locked(cudaStream_t s); /* NULL for an unknown handle */
uint64_t legacy_ready_locked(int device); /* when an action on the legacy stream may start */
uint64_t stream_ready_locked(struct CUstream_st *s); /* when a new action on s may start */
void issue_on_stream_locked(struct CUstream_st *s, uint64_t end);
void advance_to_locked(uint64_t tick);
void device_sync_locked(int device);
void legacy_sync_locked(int device);
void drop_device_streams_locked(int device);
void drop_device_work_locked(int device);

#endif /* FAKECUDART_STATE_H */
