/*
 * streams.c — streams and events over the simulated clock (ordering rules in clock.c).
 *
 * Handles are checked against the live lists, so a destroyed or made-up handle answers
 * cudaErrorInvalidResourceHandle instead of crashing (counted in stale_stream_calls and
 * stale_event_calls, since the real runtime may crash on one). A destroyed stream's work still
 * completes (as in CUDA) and still orders later legacy-stream actions if the stream was blocking.
 */
#include <stdlib.h>

#include "state.h"

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

static struct CUevent_st *resolve_event_locked(cudaEvent_t e) {
    for (struct CUevent_st *it = fake.events; it != NULL; it = it->next)
        if (it == e)
            return it;
    fake.counters.stale_event_calls++;
    return NULL;
}

static int is_created_stream(cudaStream_t s) {
    return s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
    ENTER();
    if (pStream == NULL || (flags & ~(unsigned)cudaStreamNonBlocking) != 0)
        return record(cudaErrorInvalidValue);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        return record(cudaErrorMemoryAllocation);
    s->device = fake_current_device;
    s->flags = flags;
    s->priority = priority;
    lock();
    s->next = fake.streams;
    fake.streams = s;
    fake.counters.stream_creates++;
    unlock();
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

/* A copy of the stream `h` names, read under the lock; cudaErrorInvalidResourceHandle (and
 * `copy` untouched) for an unknown handle. */
static cudaError_t read_stream(cudaStream_t h, struct CUstream_st *copy) {
    lock();
    struct CUstream_st *s = resolve_stream_locked(h);
    if (s != NULL)
        *copy = *s;
    unlock();
    return s != NULL ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags) {
    ENTER();
    if (flags == NULL)
        return record(cudaErrorInvalidValue);
    struct CUstream_st s;
    cudaError_t rc = read_stream(hStream, &s);
    if (rc == cudaSuccess)
        *flags = s.flags;
    return record(rc);
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device) {
    ENTER();
    if (device == NULL)
        return record(cudaErrorInvalidValue);
    struct CUstream_st s;
    cudaError_t rc = read_stream(hStream, &s);
    if (rc == cudaSuccess)
        *device = s.device;
    return record(rc);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    ENTER();
    if (!is_created_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    lock();
    struct CUstream_st **link = &fake.streams;
    while (*link != NULL && *link != stream)
        link = &(*link)->next;
    struct CUstream_st *s = *link;
    if (s != NULL) {
        *link = s->next;
        if ((s->flags & cudaStreamNonBlocking) == 0) {
            struct fake_device *d = &fake.devices[s->device];
            d->retired_blocking_tail = max_u64(d->retired_blocking_tail, s->tail);
        }
        fake.counters.stream_destroys++;
    }
    unlock();
    free(s);
    return record(s != NULL ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

/* When everything a synchronization of s waits for is complete. */
static uint64_t stream_done_at_locked(struct CUstream_st *s) {
    if (s == &fake.devices[s->device].legacy)
        return legacy_ready_locked(s->device);
    return max_u64(fake.now, s->tail);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    ENTER();
    lock();
    fake.counters.stream_syncs++;
    struct CUstream_st *s = resolve_stream_locked(stream);
    if (s != NULL)
        advance_to_locked(stream_done_at_locked(s));
    unlock();
    return record(s != NULL ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    ENTER();
    lock();
    fake.counters.stream_queries++;
    struct CUstream_st *s = resolve_stream_locked(stream);
    cudaError_t rc = cudaErrorInvalidResourceHandle;
    if (s != NULL)
        rc = stream_done_at_locked(s) > fake.now ? cudaErrorNotReady : cudaSuccess;
    unlock();
    return record(rc);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    ENTER();
    if (flags > 1) /* cudaEventWaitDefault or cudaEventWaitExternal */
        return record(cudaErrorInvalidValue);
    lock();
    fake.counters.stream_waits++;
    struct CUstream_st *s = resolve_stream_locked(stream);
    struct CUevent_st *e = resolve_event_locked(event);
    if (s != NULL && e != NULL && e->recorded) {
        s->tail = max_u64(s->tail, e->done_at);
        if (s->per_thread)
            fake.devices[s->device].per_thread_tail =
                max_u64(fake.devices[s->device].per_thread_tail, s->tail);
    }
    unlock();
    return record(s != NULL && e != NULL ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    ENTER();
    unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (event == NULL || (flags & ~known) != 0 ||
        ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)))
        return record(cudaErrorInvalidValue);
    lock();
    cudaError_t injected = take_call_failure_locked(&fake.injected_event_create);
    unlock();
    if (injected != cudaSuccess)
        return record(injected);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (e == NULL)
        return record(cudaErrorMemoryAllocation);
    e->device = fake_current_device;
    e->flags = flags;
    lock();
    e->next = fake.events;
    fake.events = e;
    fake.counters.event_creates++;
    unlock();
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    ENTER();
    lock();
    struct CUstream_st *s = resolve_stream_locked(stream);
    struct CUevent_st *e = resolve_event_locked(event);
    cudaError_t rc = take_call_failure_locked(&fake.injected_event_record);
    if (rc != cudaSuccess) {
        unlock();
        return record(rc);
    }
    rc = cudaErrorInvalidResourceHandle;
    if (s != NULL && e != NULL && s->device == e->device) {
        rc = s == &fake.devices[s->device].legacy ? capture_legacy_use_locked(s->device)
                                                  : cudaSuccess;
    }
    if (rc == cudaSuccess && s->capture != cudaStreamCaptureStatusNone) {
        /* Recorded into the capture: the event stands for no work that runs. */
        e->recorded = 1;
        e->captured = 1;
        fake.counters.event_records++;
    } else if (rc == cudaSuccess) {
        /* Recording is an action on the stream: it completes when what it is ordered after does. */
        uint64_t t = stream_ready_locked(s);
        issue_on_stream_locked(s, t);
        e->recorded = 1;
        e->captured = 0;
        e->done_at = t;
        fake.counters.event_records++;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    ENTER();
    lock();
    fake.counters.event_queries++;
    cudaError_t rc = take_call_failure_locked(&fake.injected_query);
    if (rc == cudaSuccess)
        rc = capture_check_locked(CAPTURE_UNSAFE);
    if (rc == cudaSuccess) {
        rc = cudaErrorInvalidResourceHandle;
        struct CUevent_st *e = resolve_event_locked(event);
        if (e != NULL && e->captured)
            rc = cudaErrorCapturedEvent;
        else if (e != NULL)
            rc = e->recorded && e->done_at > fake.now ? cudaErrorNotReady : cudaSuccess;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    ENTER();
    lock();
    fake.counters.event_syncs++;
    cudaError_t rc = capture_check_locked(CAPTURE_UNSAFE);
    struct CUevent_st *e = NULL;
    if (rc == cudaSuccess) {
        e = resolve_event_locked(event);
        if (e != NULL && e->recorded && !e->captured)
            advance_to_locked(e->done_at);
        rc = e == NULL     ? cudaErrorInvalidResourceHandle
             : e->captured ? cudaErrorCapturedEvent
                           : cudaSuccess;
    }
    unlock();
    return record(rc);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    ENTER();
    if (ms == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    struct CUevent_st *a = resolve_event_locked(start);
    struct CUevent_st *b = resolve_event_locked(end);
    cudaError_t rc = cudaSuccess;
    if (a == NULL || b == NULL || !a->recorded || !b->recorded ||
        ((a->flags | b->flags) & cudaEventDisableTiming))
        rc = cudaErrorInvalidResourceHandle;
    else if (a->done_at > fake.now || b->done_at > fake.now)
        rc = cudaErrorNotReady;
    else /* one tick is one microsecond */
        *ms = (float)((double)((int64_t)(b->done_at - a->done_at)) / 1000.0);
    unlock();
    return record(rc);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    ENTER();
    lock();
    struct CUevent_st **link = &fake.events;
    while (*link != NULL && *link != event)
        link = &(*link)->next;
    struct CUevent_st *e = *link;
    if (e != NULL) {
        *link = e->next;
        fake.counters.event_destroys++;
    }
    unlock();
    free(e);
    return record(e != NULL ? cudaSuccess : cudaErrorInvalidResourceHandle);
}

void drop_device_streams_locked(int device) {
    for (struct CUstream_st **link = &fake.streams; *link != NULL;) {
        struct CUstream_st *s = *link;
        if (s->device == device) {
            *link = s->next;
            free(s);
        } else {
            link = &s->next;
        }
    }
    for (struct CUevent_st **link = &fake.events; *link != NULL;) {
        struct CUevent_st *e = *link;
        if (e->device == device) {
            *link = e->next;
            free(e);
        } else {
            link = &e->next;
        }
    }
}
