/*
 * fakecudart.h — test-only entry points of the fake libcudart.so.12 (see cuda_runtime_api.h for
 * the CUDA subset and the model behind it). None of these functions is affected by
 * FAKECUDART_FAIL, and none touches the calling thread's last error.
 *
 * Counters: every counter in FAKECUDART_COUNTER_LIST, read all at once with
 * fakecudart_get_counters or one by name with fakecudart_counter (handy from ctypes). Counters
 * count calls that reached the fake, so with an interposer in front they show what was forwarded.
 * fakecudart_reset_counters zeroes them (peak_bytes restarts at bytes_in_use, which is state and
 * is never reset). The driver's calls (cuda.h: libcuda.so.1, which forwards to this library) have
 * their counters here too (vmm_*, driver_errors), and its physical memory (cuMemCreate) counts in
 * bytes_in_use, peak_bytes and fakecudart_device_bytes_in_use like cudaMalloc's.
 *
 * Clock: fakecudart_launch enqueues simulated work of `duration_ticks` on a stream, touching
 * [ptr, ptr + bytes). It starts once the work it is ordered after is complete (earlier work on
 * the same stream; for the legacy default stream also earlier work on every blocking stream of
 * the device; for a blocking stream also earlier legacy-stream work) and ends `duration_ticks`
 * later. Until the clock reaches that end, fakecudart_range_busy reports the range as busy.
 * fakecudart_advance moves the clock; the synchronizing CUDA calls move it to the end of the work
 * they wait for.
 */
#ifndef FAKECUDART_H
#define FAKECUDART_H

#include <stdint.h>
#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, meaning): every counter, declared once. */
#define FAKECUDART_COUNTER_LIST(X)                                                          \
    X(mallocs, "successful cudaMalloc calls (size 0 included)")                            \
    X(pitch_mallocs, "successful cudaMallocPitch calls")                                   \
    X(managed_mallocs, "successful cudaMallocManaged calls")                               \
    X(malloc_failures, "failed cudaMalloc/cudaMallocPitch/cudaMallocManaged calls")        \
    X(frees, "successful cudaFree calls with a non-NULL pointer")                          \
    X(null_frees, "cudaFree(NULL) calls")                                                  \
    X(free_failures, "cudaFree calls that returned an error")                              \
    X(host_mallocs, "successful cudaMallocHost calls")                                     \
    X(host_frees, "successful cudaFreeHost calls with a non-NULL pointer")                 \
    X(bytes_in_use, "device bytes of allocations and cuMemCreate, all devices (state)")    \
    X(peak_bytes, "highest bytes_in_use since start or the last counter reset")            \
    X(mem_get_infos, "cudaMemGetInfo calls")                                               \
    X(device_syncs, "cudaDeviceSynchronize calls")                                         \
    X(implicit_syncs, "device synchronizations done inside cudaFree")                     \
    X(device_resets, "cudaDeviceReset calls")                                              \
    X(stream_creates, "streams created")                                                   \
    X(stream_destroys, "streams destroyed with cudaStreamDestroy")                         \
    X(stream_syncs, "cudaStreamSynchronize calls")                                         \
    X(stream_queries, "cudaStreamQuery calls")                                             \
    X(stream_waits, "cudaStreamWaitEvent calls")                                           \
    X(event_creates, "events created")                                                     \
    X(event_destroys, "events destroyed with cudaEventDestroy")                            \
    X(event_records, "cudaEventRecord calls")                                              \
    X(event_queries, "cudaEventQuery calls")                                               \
    X(event_syncs, "cudaEventSynchronize calls")                                           \
    X(stale_event_calls, "event calls naming no live event (destroyed, reset or made up)") \
    X(stale_stream_calls, "stream calls naming no live stream (destroyed, reset or made up)") \
    X(launches, "fakecudart_launch calls that enqueued work")                              \
    X(memcpys, "cudaMemcpy calls")                                                         \
    X(memsets, "cudaMemset calls")                                                         \
    X(get_last_errors, "cudaGetLastError calls")                                           \
    X(peek_last_errors, "cudaPeekAtLastError calls")                                       \
    X(vmm_reserves, "successful cuMemAddressReserve calls")                                \
    X(vmm_address_frees, "successful cuMemAddressFree calls")                              \
    X(vmm_creates, "successful cuMemCreate calls")                                         \
    X(vmm_create_failures, "failed cuMemCreate calls (any error)")                         \
    X(vmm_releases, "successful cuMemRelease calls")                                       \
    X(vmm_maps, "successful cuMemMap calls")                                               \
    X(vmm_unmaps, "successful cuMemUnmap calls")                                           \
    X(vmm_set_accesses, "successful cuMemSetAccess calls")                                 \
    X(vmm_busy_unmaps, "cuMemUnmap calls while unfinished simulated work used the range")  \
    X(driver_errors, "driver (cu*) calls that returned an error, whatever the error")      \
    X(peer_enables, "successful cudaDeviceEnablePeerAccess calls")                         \
    X(vmm_access_faults, "uses of driver memory by a device without access (700 answered)") \
    X(ipc_handles, "successful cudaIpcGetMemHandle calls")                                  \
    X(vmm_rdma_creates, "successful cuMemCreate calls with allocFlags.gpuDirectRDMACapable") \
    X(captures_begun, "successful cudaStreamBeginCapture calls")                              \
    X(captures_invalidated, "captures a capture-unsafe call invalidated")                     \
    X(capture_refusals, "calls refused with 900 because a capture was active")                \
    X(capture_queries, "cudaStreamIsCapturing calls")                                       \
    X(async_mallocs, "successful cudaMallocAsync calls with a size above 0")                  \
    X(async_frees, "successful cudaFreeAsync calls with a non-NULL pointer")

typedef struct fakecudart_counters {
#define FAKECUDART_COUNTER_FIELD(name, meaning) uint64_t name;
    FAKECUDART_COUNTER_LIST(FAKECUDART_COUNTER_FIELD)
#undef FAKECUDART_COUNTER_FIELD
} fakecudart_counters;

/* Copies every counter into *out. */
void fakecudart_get_counters(fakecudart_counters *out);
/* One counter by its name in FAKECUDART_COUNTER_LIST; UINT64_MAX for an unknown name. */
uint64_t fakecudart_counter(const char *name);
/* Zeroes every counter except bytes_in_use; peak_bytes restarts at bytes_in_use. */
void fakecudart_reset_counters(void);
/* Bytes of live allocations (cuMemCreate memory included) charged to `device` (0 for an ordinal
 * out of range). */
uint64_t fakecudart_device_bytes_in_use(int device);

/* The start of the allocation a handle from cudaIpcGetMemHandle names: where another process
 * would find the memory after cudaIpcOpenMemHandle. 0 for bytes that are no handle of this
 * process. */
uintptr_t fakecudart_ipc_handle_base(const cudaIpcMemHandle_t *handle);

/* Sets the capacity of `device` in bytes; cudaErrorInvalidDevice for an ordinal out of range.
 * Allocations already made stay; later ones must fit. */
cudaError_t fakecudart_set_capacity(int device, size_t bytes);
/* The next `count` device allocations (cudaMalloc, cudaMallocPitch, cudaMallocManaged) fail with
 * `code` (which should be nonzero), whatever the free memory. count 0 cancels an injection. */
void fakecudart_inject_malloc_failures(unsigned count, cudaError_t code);
/* The next `count` calls of `call` ("cudaEventQuery", "cudaDeviceReset", "cudaDeviceSynchronize",
 * "cudaStreamIsCapturing", "cudaEventRecord", or "cudaEventCreate", which covers
 * cudaEventCreateWithFlags) do nothing and answer `code` (nonzero), setting the last error;
 * cudaErrorInvalidValue for another name. count 0 cancels an injection. */
cudaError_t fakecudart_inject_call_failures(const char *call, unsigned count, cudaError_t code);

/* The driver call `call` ("cuMemUnmap", "cuMemSetAccess", "cuMemMap", "cuMemCreate" or
 * "cuMemAddressReserve") succeeds `after` more times (calls that fail their own checks do not
 * count), then fails once with the CUresult `code` (nonzero) and does nothing. Returns
 * cudaErrorInvalidValue for another name or code 0. */
int fakecudart_inject_driver_failure(const char *call, unsigned after, int code);

/* Enqueues simulated work on `stream` (0, cudaStreamLegacy, cudaStreamPerThread or a created
 * stream) that touches [ptr, ptr + bytes) for `duration_ticks`. The range must lie inside one
 * live device allocation, or in memory the driver mapped and made accessible, unless bytes is 0.
 * In driver-mapped memory the stream's device must have been given access (cuMemSetAccess) on
 * every mapping the range touches, else the work would fault: nothing is enqueued, the counter
 * vmm_access_faults counts it, and the answer is cudaErrorIllegalAddress. cudaMalloc memory has
 * no such check (any stream's device may use it). Returns cudaErrorInvalidValue for a bad range
 * and cudaErrorInvalidResourceHandle for an unknown stream. */
cudaError_t fakecudart_launch(void *ptr, size_t bytes, cudaStream_t stream,
                              uint64_t duration_ticks);
/* Moves the simulated clock forward by `ticks`. */
void fakecudart_advance(uint64_t ticks);
/* The simulated clock, in ticks since start. */
uint64_t fakecudart_now(void);
/* 1 when enqueued work that is not complete yet touches any byte of [ptr, ptr + bytes), else 0. */
int fakecudart_range_busy(const void *ptr, size_t bytes);
/* The tick at which the last incomplete work touching [ptr, ptr + bytes) completes; 0 if none. */
uint64_t fakecudart_range_busy_until(const void *ptr, size_t bytes);
/* Number of enqueued work items not complete yet, all devices. */
uint64_t fakecudart_pending_work(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDART_H */
