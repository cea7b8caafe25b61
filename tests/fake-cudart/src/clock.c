/*
 * clock.c — the simulated clock, stream ordering and the list of work that is not complete yet.
 *
 * Each stream keeps `tail`, the tick at which the last action issued on it completes. A new
 * action on stream s may start at stream_ready_locked(s):
 *   - non-blocking stream: after its own tail;
 *   - blocking stream (created without cudaStreamNonBlocking, or a thread's per-thread default
 *     stream): after its own tail and after the legacy default stream's tail (it waits for
 *     earlier legacy actions);
 *   - legacy default stream: after its own tail and the tails of every blocking stream of the
 *     device, destroyed ones included (it waits for earlier work of blocking streams).
 * Never before `now`. This is CUDA's legacy-default-stream rule
 * (docs.nvidia.com/cuda/cuda-runtime-api/stream-sync-behavior.html).
 */
#include <stdlib.h>

#include "state.h"

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Each thread's own default stream of each device (cudaStreamPerThread), with the device's
 * reset count when it was last valid, plus one (0: never used). A device reset ends its work. */
static __thread struct {
    struct CUstream_st stream;
    uint64_t resets;
} own_default[FAKE_MAX_DEVICES];

static struct CUstream_st *per_thread_stream_locked(int device) {
    uint64_t resets = fake.devices[device].resets + 1;
    struct CUstream_st *s = &own_default[device].stream;
    if (own_default[device].resets != resets) {
        *s = (struct CUstream_st){.device = device, .per_thread = 1};
        own_default[device].resets = resets;
    }
    return s;
}

struct CUstream_st *resolve_stream_locked(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy)
        return &fake.devices[fake_current_device].legacy;
    if (s == cudaStreamPerThread)
        return per_thread_stream_locked(fake_current_device);
    for (struct CUstream_st *it = fake.streams; it != NULL; it = it->next)
        if (it == s)
            return it;
    fake.counters.stale_stream_calls++;
    return NULL;
}

static int is_legacy(const struct CUstream_st *s) { return s == &fake.devices[s->device].legacy; }

static int is_blocking(const struct CUstream_st *s) {
    return (s->flags & cudaStreamNonBlocking) == 0;
}

uint64_t legacy_ready_locked(int device) {
    struct fake_device *d = &fake.devices[device];
    uint64_t t = max_u64(fake.now, d->legacy.tail);
    t = max_u64(t, d->per_thread_tail);
    t = max_u64(t, d->retired_blocking_tail);
    for (struct CUstream_st *it = fake.streams; it != NULL; it = it->next)
        if (it->device == device && is_blocking(it))
            t = max_u64(t, it->tail);
    return t;
}

uint64_t stream_ready_locked(struct CUstream_st *s) {
    if (is_legacy(s))
        return legacy_ready_locked(s->device);
    uint64_t t = max_u64(fake.now, s->tail);
    if (is_blocking(s))
        t = max_u64(t, fake.devices[s->device].legacy.tail);
    return t;
}

void issue_on_stream_locked(struct CUstream_st *s, uint64_t end) {
    s->tail = max_u64(s->tail, end);
    struct fake_device *d = &fake.devices[s->device];
    if (s->per_thread)
        d->per_thread_tail = max_u64(d->per_thread_tail, s->tail);
    d->max_tail = max_u64(d->max_tail, end);
}

void advance_to_locked(uint64_t tick) {
    if (tick <= fake.now)
        return;
    fake.now = tick;
    size_t kept = 0;
    for (size_t i = 0; i < fake.work_count; i++)
        if (fake.work[i].end > fake.now)
            fake.work[kept++] = fake.work[i];
    fake.work_count = kept;
}

void device_sync_locked(int device) { advance_to_locked(fake.devices[device].max_tail); }

void legacy_sync_locked(int device) {
    struct CUstream_st *legacy = &fake.devices[device].legacy;
    uint64_t t = legacy_ready_locked(device);
    issue_on_stream_locked(legacy, t);
    advance_to_locked(t);
}

void drop_device_work_locked(int device) {
    size_t kept = 0;
    for (size_t i = 0; i < fake.work_count; i++)
        if (fake.work[i].device != device)
            fake.work[kept++] = fake.work[i];
    fake.work_count = kept;
    struct fake_device *d = &fake.devices[device];
    d->legacy.tail = d->per_thread_tail = d->retired_blocking_tail = d->max_tail = 0;
    d->resets++;
}

cudaError_t fakecudart_launch(void *ptr, size_t bytes, cudaStream_t stream,
                              uint64_t duration_ticks) {
    fake_init_once();
    lock();
    cudaError_t rc = cudaSuccess;
    struct CUstream_st *s = resolve_stream_locked(stream);
    if (s == NULL)
        rc = cudaErrorInvalidResourceHandle;
    else if (bytes > 0) /* a bad range, or driver memory the stream's device has no access to */
        rc = check_device_range_locked((uintptr_t)ptr, bytes, s->device);
    if (rc == cudaSuccess && fake.work_count == fake.work_cap) {
        size_t cap = fake.work_cap == 0 ? 64 : fake.work_cap * 2;
        struct fake_work *grown = realloc(fake.work, cap * sizeof *grown);
        if (grown == NULL)
            rc = cudaErrorMemoryAllocation;
        else {
            fake.work = grown;
            fake.work_cap = cap;
        }
    }
    if (rc == cudaSuccess) {
        uint64_t start = stream_ready_locked(s);
        uint64_t end = duration_ticks > UINT64_MAX - start ? UINT64_MAX : start + duration_ticks;
        issue_on_stream_locked(s, end);
        if (end > fake.now)
            fake.work[fake.work_count++] =
                (struct fake_work){(uintptr_t)ptr, (uintptr_t)ptr + bytes, end, s->device};
        fake.counters.launches++;
    }
    unlock();
    return rc;
}

void fakecudart_advance(uint64_t ticks) {
    fake_init_once();
    lock();
    advance_to_locked(ticks > UINT64_MAX - fake.now ? UINT64_MAX : fake.now + ticks);
    unlock();
}

uint64_t fakecudart_now(void) {
    fake_init_once();
    lock();
    uint64_t now = fake.now;
    unlock();
    return now;
}

uint64_t range_busy_until_locked(uintptr_t lo, uintptr_t hi) {
    uint64_t until = 0;
    for (size_t i = 0; i < fake.work_count; i++) {
        const struct fake_work *w = &fake.work[i];
        if (w->end > fake.now && w->lo < hi && lo < w->hi)
            until = max_u64(until, w->end);
    }
    return until;
}

uint64_t fakecudart_range_busy_until(const void *ptr, size_t bytes) {
    fake_init_once();
    uintptr_t lo = (uintptr_t)ptr;
    lock();
    uint64_t until = range_busy_until_locked(lo, lo + bytes);
    unlock();
    return until;
}

int fakecudart_range_busy(const void *ptr, size_t bytes) {
    return fakecudart_range_busy_until(ptr, bytes) != 0;
}

uint64_t fakecudart_pending_work(void) {
    fake_init_once();
    lock();
    uint64_t n = 0;
    for (size_t i = 0; i < fake.work_count; i++)
        n += fake.work[i].end > fake.now;
    unlock();
    return n;
}
