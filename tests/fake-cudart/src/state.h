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

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda.h"
#include "fakecudart.h"

#define FAKE_MAX_DEVICES 64
#define FAKE_DEFAULT_DEVICES 2
#define FAKE_DEFAULT_CAPACITY (16ull << 30) /* bytes: 16 GiB per device */
#define FAKE_DEFAULT_GRANULARITY (2ull << 20) /* bytes: the driver's, minimum and recommended */
#define FAKE_RUNTIME_VERSION 12090          /* CUDA 12.9, like the nvidia-cuda-runtime-cu12 wheel */
#define FAKE_DRIVER_VERSION 12080          /* CUDA 12.8: cudaDriverGetVersion, cuDriverGetVersion */
#define FAKE_PITCH_ALIGNMENT 512            /* bytes */

/* A stream: a created one, a device's legacy default stream, or a thread's per-thread default
 * stream of a device (clock.c). */
struct CUstream_st {
    int device;
    int per_thread;           /* a thread's default stream (cudaStreamPerThread) */
    unsigned flags;           /* cudaStreamNonBlocking or 0 */
    int priority;
    uint64_t tail;            /* tick at which the last action issued on it completes */
    struct CUstream_st *next; /* live list of created streams */
    enum cudaStreamCaptureStatus capture; /* capture.c */
    enum cudaStreamCaptureMode capture_mode;
    pthread_t capture_thread; /* the thread that began the capture */
};

struct CUevent_st {
    int device;
    unsigned flags;
    int recorded;
    int captured;             /* last recorded on a capturing stream: queries answer 907 */
    uint64_t done_at;         /* tick at which the recorded work completes */
    struct CUevent_st *next;  /* live list */
};

struct fake_device {
    uint64_t capacity;        /* bytes */
    uint64_t context;         /* bytes the context holds (FAKECUDART_CONTEXT): never free */
    uint64_t used;            /* bytes charged by live allocations */
    struct CUstream_st legacy;
    uint64_t per_thread_tail; /* latest tail of every thread's per-thread default stream */
    uint64_t resets;          /* cudaDeviceReset calls that happened (they end per-thread work) */
    uint64_t retired_blocking_tail; /* latest tail of destroyed blocking streams */
    uint64_t max_tail;        /* latest completion of anything issued on the device */
};

/* The device's free bytes: its capacity less what the context holds and what is allocated. */
static inline uint64_t fake_free_bytes(const struct fake_device *d) {
    uint64_t held = d->context + d->used;
    return held < d->capacity ? d->capacity - held : 0;
}

enum fake_alloc_kind { ALLOC_DEVICE, ALLOC_PITCH, ALLOC_MANAGED, ALLOC_HOST, ALLOC_ASYNC };

struct fake_alloc {
    uintptr_t base;
    size_t size;              /* bytes asked for (after pitch rounding) */
    size_t map_len;           /* bytes mapped (at least 1 page) */
    int device;
    enum fake_alloc_kind kind;
};

/* Driver VMM (vmm.c). A reserved range of address space (cuMemAddressReserve). */
struct fake_vmm_reservation {
    uintptr_t base;
    size_t size;
};

/* Physical memory of cuMemCreate: bytes [offset, offset + size) of the memfd `fd`. */
struct fake_vmm_handle {
    uint64_t id;              /* the CUmemGenericAllocationHandle */
    int fd;
    uint64_t offset;
    size_t size;
    size_t granularity;       /* of its properties: its mappings' addresses are multiples of it */
    int device;
    unsigned map_count;       /* live cuMemMap mappings of it */
    int released;             /* cuMemRelease done; freed once map_count is 0 */
    int inherited;            /* made by the parent before a fork: its pages are the parent's too */
};

/* One cuMemMap: [base, base + size) shows handle `handle`. */
struct fake_vmm_mapping {
    uintptr_t base;
    size_t size;
    uint64_t handle;
    int device;
    uint64_t access;          /* bit d: cuMemSetAccess gave device d read-write access (the host
                               * may read and write it once any bit is set) */
};

/* Simulated work touching [lo, hi) until tick `end`. */
struct fake_work {
    uintptr_t lo, hi;
    uint64_t end;
    int device;
};

/* A driver call made to fail once, after it succeeds `after` more times
 * (fakecudart_inject_driver_failure). */
/* A runtime call's injected failures: the next `count` calls answer `code`. */
struct fake_call_injection {
    unsigned count;
    cudaError_t code;
};

struct fake_driver_injection {
    int armed;
    unsigned after;
    int code; /* a CUresult */
};

struct fake_state {
    int device_count;
    cudaError_t fail_code;    /* nonzero: every call answers this */
    struct fake_device devices[FAKE_MAX_DEVICES];
    uint64_t peer_access[FAKE_MAX_DEVICES]; /* bit p of [d]: d enabled access to p's memory */
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
    /* cudaEventQuery, cudaDeviceReset, cudaDeviceSynchronize, cudaEventCreate(WithFlags),
     * cudaEventRecord, cudaStreamIsCapturing */
    struct fake_call_injection injected_query, injected_reset, injected_sync, injected_event_create,
        injected_event_record, injected_is_capturing;
    struct fake_driver_injection injected_unmap, injected_set_access, injected_map,
        injected_create, injected_reserve; /* cuMemUnmap, cuMemSetAccess, cuMemMap, cuMemCreate,
                                            * cuMemAddressReserve */
    fakecudart_counters counters;
    /* Driver (vmm.c). */
    int vmm_supported;        /* FAKECUDART_VMM: 1 (default) or 0 */
    int vmm_rdma_supported;   /* FAKECUDART_VMM_RDMA (and VMM itself): 1 (default) or 0 */
    size_t vmm_granularity;   /* FAKECUDART_VMM_GRANULARITY: bytes, default 2 MiB */
    size_t vmm_rdma_granularity; /* FAKECUDART_VMM_RDMA_GRANULARITY: default the one above */
    int driver_initialized;   /* cuInit or a runtime call has run (atomic) */
    int vmm_fd;               /* memfd behind this process's handles; -1 before the first */
    uint64_t vmm_file_end;    /* next unused offset of vmm_fd (offsets are never reused) */
    uint64_t vmm_next_handle;
    /* Each sorted: reservations and mappings by base, handles by id. */
    struct fake_vmm_reservation *reservations;
    size_t reservation_count, reservation_cap;
    struct fake_vmm_handle *handles;
    size_t handle_count, handle_cap;
    struct fake_vmm_mapping *mappings;
    size_t mapping_count, mapping_cap;
};

extern struct fake_state fake;
extern __thread int fake_current_device;

/* First call of a runtime or test entry point: fake_config_once, then the runtime's own start
 * (initializes the driver and dlopens libcuda.so.1, as the real runtime does). */
void fake_init_once(void);
/* Reads the environment once; all that a driver entry point needs. */
void fake_config_once(void);
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

/* Stream capture (capture.c). */
enum fake_capture_hazard {
    CAPTURE_SYNC,   /* waits for the device: refused during any active capture */
    CAPTURE_UNSAFE, /* potentially unsafe: refused unless the calling thread is relaxed */
};
/* cudaSuccess when no active capture forbids a call of kind `hazard` by the calling thread;
 * else invalidates the captures it endangers, counts the refusal and answers
 * cudaErrorStreamCaptureUnsupported. */
cudaError_t capture_check_locked(enum fake_capture_hazard hazard);
/* cudaSuccess when no blocking stream of `device` captures; else an action on its legacy stream
 * would join those captures: they are invalidated, the refusal counted, and the answer is
 * cudaErrorStreamCaptureImplicit. */
cudaError_t capture_legacy_use_locked(int device);

/* Memory (memory.c). */
struct fake_alloc *find_alloc_locked(uintptr_t addr); /* allocation containing addr, or NULL */
/* Whether device `accessor` may use [lo, lo + bytes) as device memory: cudaSuccess inside one
 * live device allocation (any device may use it) or inside driver-mapped memory that `accessor`
 * has access to; cudaErrorIllegalAddress, counted in vmm_access_faults, for driver-mapped memory
 * without that access; else cudaErrorInvalidValue. */
cudaError_t check_device_range_locked(uintptr_t lo, size_t bytes, int accessor);
void free_device_allocs_locked(int device);
/* A device-side allocation of `size` > 0 bytes on the current device (takes the lock). */
cudaError_t device_alloc(void **out, size_t size, enum fake_alloc_kind kind);
/* Gives a live allocation's memory back to its device and drops it from the table. */
void release_alloc_locked(struct fake_alloc *a);
void note_bytes_locked(void);
void charge_locked(int device, int64_t delta); /* device bytes in use, bytes_in_use, peak_bytes */

/* Driver (driver.c). Every driver entry point has the shape
 *
 *     CUresult rc = driver_enter(1);      // config; FAKECUDART_FAIL / no device / not initialized
 *     lock();  if (rc == CUDA_SUCCESS) rc = ...work on `fake`...;
 *     return driver_leave_locked(rc);     // counts an error in driver_errors, unlocks
 *
 * driver_enter(0) for the calls that work before cuInit. */
CUresult driver_enter(int needs_init);
CUresult driver_leave_locked(CUresult rc);
/* The injected failure's code when `inj` fires on this call, else CUDA_SUCCESS. */
CUresult take_injection_locked(struct fake_driver_injection *inj);
/* cudaSuccess, or the injected code when a failure of the call is due (it is then used up). */
cudaError_t take_call_failure_locked(struct fake_call_injection *inj);
int valid_device(int device);

/* Driver VMM (vmm.c). 1 when [lo, lo + bytes) lies in mapped, access-enabled memory of one
 * device (one mapping, or adjacent ones); stores that device in *device and the devices that
 * have access to every mapping of the range (a bit mask) in *access, each unless NULL. */
int vmm_range_accessible_locked(uintptr_t lo, size_t bytes, int *device, uint64_t *access);
/* In a forked child: new handles get a backing file of their own, and the inherited ones, whose
 * pages the parent shares, are never punched out by the child. */
void vmm_after_fork_child_locked(void);

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
/* The tick at which the last incomplete work touching [lo, hi) completes; 0 if none. */
uint64_t range_busy_until_locked(uintptr_t lo, uintptr_t hi);

#endif /* FAKECUDART_STATE_H */
