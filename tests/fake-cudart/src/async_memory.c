/*
 * async_memory.c — the stream-ordered allocator's calls: cudaMallocAsync and cudaFreeAsync, each
 * also in its per-thread-default-stream form (_ptsz, what code built with
 * --default-stream per-thread calls; a NULL stream is then the thread's default stream).
 *
 * There is no pool behind them: cudaMallocAsync is a device allocation like cudaMalloc's
 * (counted in async_mallocs; no capture hazard, as the real one is none), and cudaFreeAsync gives
 * the memory back at once (counted in async_frees), since no simulated work reads memory. It takes
 * the start of any device allocation, cudaMalloc's included, so a test sees what such a free
 * would give back; an unknown or interior pointer answers cudaErrorInvalidValue (1) and counts in
 * free_failures, a NULL pointer succeeds, a stale stream answers 400. The fake builds no graphs,
 * so it makes no graph allocations: on a capturing stream both calls answer
 * cudaErrorNotSupported (801).
 */
#include <stdint.h>

#include "state.h"

/* The stream a call names: for the _ptsz forms a NULL stream is the per-thread stream. NULL and
 * cudaErrorInvalidResourceHandle for a stale handle; cudaErrorNotSupported for a capturing one. */
static cudaError_t ordering_stream_locked(cudaStream_t stream, int per_thread) {
    if (per_thread && stream == NULL)
        stream = cudaStreamPerThread;
    struct CUstream_st *s = resolve_stream_locked(stream);
    if (s == NULL)
        return cudaErrorInvalidResourceHandle;
    if (s->capture != cudaStreamCaptureStatusNone)
        return cudaErrorNotSupported;
    return cudaSuccess;
}

static cudaError_t malloc_async(void **devPtr, size_t size, cudaStream_t stream, int per_thread) {
    ENTER();
    if (devPtr == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    cudaError_t rc = ordering_stream_locked(stream, per_thread);
    unlock();
    if (rc != cudaSuccess)
        return record(rc);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    return record(device_alloc(devPtr, size, ALLOC_ASYNC));
}

static cudaError_t free_async(void *devPtr, cudaStream_t stream, int per_thread) {
    ENTER();
    lock();
    cudaError_t rc = ordering_stream_locked(stream, per_thread);
    if (rc == cudaSuccess && devPtr != NULL) {
        struct fake_alloc *a = find_alloc_locked((uintptr_t)devPtr);
        if (a == NULL || a->base != (uintptr_t)devPtr || a->kind == ALLOC_HOST) {
            rc = cudaErrorInvalidValue;
        } else {
            release_alloc_locked(a);
            fake.counters.async_frees++;
        }
    }
    if (rc != cudaSuccess)
        fake.counters.free_failures++;
    unlock();
    return record(rc);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
    return malloc_async(devPtr, size, hStream, 0);
}

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
    return malloc_async(devPtr, size, hStream, 1);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
    return free_async(devPtr, hStream, 0);
}

cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) {
    return free_async(devPtr, hStream, 1);
}
