/*
 * capture_check.c — CUDA graph captures with libcachealloc.so preloaded in front of the fake
 * runtime, whose captures fail as the real runtime's do (a device synchronization or a cudaFree
 * during one ends it as invalidated). The program allocates as PyTorch's caching allocator does
 * during `torch.cuda.graph`: it begins a capture on a non-blocking stream and calls cudaMalloc
 * with the thread's capture mode relaxed. Run by tests/preload_capture.rs as
 * `capture_check SCENARIO`; prints "ok SCENARIO" when every check held.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define MIB ((size_t)1 << 20)

#include "check.h"

/* cudaMalloc as PyTorch's cudaMallocMaybeCapturing makes it during a capture. */
static cudaError_t malloc_relaxed(void **p, size_t size) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t rc = cudaMalloc(p, size);
    cudaThreadExchangeStreamCaptureMode(&mode);
    return rc;
}

/* End the capture of `s`: it gives a graph (destroyed here), and no capture ended invalidated. */
static void end_capture_whole(cudaStream_t s) {
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK(graph != NULL);
    CHECK(fakecudart_counter("captures_invalidated") == 0);
    if (graph != NULL)
        CHECK_CODE(cudaGraphDestroy(graph), cudaSuccess);
}

/* A block freed during a capture stays pending (free_sync:device or event) and is not waited
 * for: the request takes new memory, the capture completes, and after it the block is reused.
 * (The free is the library's: the runtime's own cudaFree is not called.) */
static void scenario_pending_free(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, 10 * MIB, s, 1000), cudaSuccess);
    uint64_t syncs = fakecudart_counter("device_syncs");
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q, 10 * MIB), cudaSuccess);
    CHECK(q != p);
    end_capture_whole(s);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    /* After the capture, the next request that misses waits for the device and reuses p. */
    CHECK_CODE(cudaMalloc(&r, 10 * MIB), cudaSuccess);
    CHECK(r == p);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* The same with a blocking stream capturing, which makes the legacy stream unusable (an action
 * there would join the capture): the free's fence under free_sync:event, an event on the legacy
 * stream, is recorded only once the capture has ended. */
static void scenario_pending_free_blocking(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreate(&s), cudaSuccess);
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, 10 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q, 10 * MIB), cudaSuccess);
    CHECK(q != p);
    end_capture_whole(s);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    /* After the capture, the next request that misses waits for p's fence and reuses it. */
    CHECK_CODE(cudaMalloc(&r, 10 * MIB), cudaSuccess);
    CHECK(r == p);
    CHECK(!fakecudart_range_busy(p, 10 * MIB));
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A block freed just before a capture begins (torch.cuda.graph gives PyTorch's cache back with
 * empty_cache() right before it) is completed as the capture begins, while a synchronization
 * (free_sync:device; under event, one only when its event is not done) is still allowed: the
 * capture's request reuses it. Not while another capture is underway, which that
 * synchronization, or an event query, would end: the block then stays pending. */
static void scenario_freed_before(void) {
    cudaStream_t s, t;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, 10 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    uint64_t syncs = fakecudart_counter("device_syncs");
    cudaGraph_t graph = NULL, other = NULL;
    CHECK_CODE(cudaStreamBeginCapture(t, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK(fakecudart_counter("device_syncs") <= syncs + 1);
    CHECK_CODE(malloc_relaxed(&q, 10 * MIB), cudaSuccess);
    CHECK(q == p);
    CHECK_CODE(cudaStreamEndCapture(t, &other), cudaSuccess);
    CHECK(other != NULL);
    CHECK_CODE(cudaGraphDestroy(other), cudaSuccess);
    /* q freed while t captures: still pending when s's capture begins, and left so. */
    syncs = fakecudart_counter("device_syncs");
    uint64_t queries = fakecudart_counter("event_queries");
    CHECK_CODE(cudaStreamBeginCapture(t, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    CHECK(fakecudart_counter("event_queries") == queries);
    CHECK_CODE(malloc_relaxed(&r, 10 * MIB), cudaSuccess);
    CHECK(r != p);
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK_CODE(cudaStreamEndCapture(t, &other), cudaSuccess);
    CHECK(graph != NULL && other != NULL);
    CHECK(fakecudart_counter("captures_invalidated") == 0);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(t), cudaSuccess);
}

/* A synchronization that fails as a capture begins is the library's own call: the block stays
 * pending, the capture begins, and the program's own unread error (101 from cudaSetDevice) is
 * still the one it reads. */
static void scenario_sync_fails_at_capture(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaSetDevice(99), cudaErrorInvalidDevice);
    CHECK_CODE(fakecudart_inject_call_failures("cudaDeviceSynchronize", 1, cudaErrorUnknown),
               cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q, 10 * MIB), cudaSuccess);
    CHECK(q != p);
    end_capture_whole(s);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A request that fits only once cached memory is given back fails with 2 during a capture,
 * which goes on; after the capture the same request gives the cache back and succeeds. Run
 * with FAKECUDART_CAPACITY=64MiB and free_sync:none (the freed segment is cached at once). */
static void scenario_oom(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q, 50 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK(fakecudart_counter("captures_invalidated") == 0);
    CHECK(fakecudart_counter("frees") == 0);
    CHECK_CODE(cudaMalloc(&q, 50 * MIB), cudaSuccess);
    CHECK(fakecudart_counter("frees") == 1);
    CHECK_CODE(cudaFree(q), cudaSuccess);
}

/* A block freed during a capture stays pending, and a request that fits only once it completes
 * fails with 2 during the capture, which goes on; after the capture the same request reuses the
 * block. Run with FAKECUDART_CAPACITY=64MiB and free_sync:device. */
static void scenario_oom_pending(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q, 40 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    end_capture_whole(s);
    CHECK_CODE(cudaMalloc(&q, 40 * MIB), cudaSuccess);
    CHECK(q == p);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* cachealloc_empty_cache (torch.cuda.empty_cache() through the pluggable allocator's hook)
 * during a capture does nothing and succeeds, as PyTorch's leaves its default pools alone then:
 * no synchronization for the free pending since the capture began, no cudaFree of the cached
 * segment, the capture goes on. After it, the same call gives both back. Run with
 * free_sync:device (the preloaded library's C API is found with dlsym). */
static void scenario_empty_cache(void) {
    int (*empty_cache)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachealloc_empty_cache");
    CHECK(empty_cache != NULL);
    if (empty_cache == NULL)
        return;
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *cached = NULL, *pending = NULL;
    CHECK_CODE(cudaMalloc(&cached, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&pending, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(cached), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(fakecudart_launch(pending, 10 * MIB, s, 1000), cudaSuccess);
    uint64_t syncs = fakecudart_counter("device_syncs");
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(pending), cudaSuccess);
    CHECK(empty_cache(0) == cudaSuccess);
    end_capture_whole(s);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    CHECK(fakecudart_counter("frees") == 0);
    CHECK(empty_cache(0) == cudaSuccess);
    CHECK(fakecudart_counter("frees") == 2);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A run to record (trace:PATH) and replay: during a capture, a miss takes new memory while a
 * free made in the capture is still pending, empty_cache() does nothing, and a request that
 * only the cached segment given back would serve fails; after the capture the pending block
 * serves a request and empty_cache() gives the cached segment back. Run with
 * FAKECUDART_CAPACITY=100MiB and free_sync:device. */
static void scenario_recorded(void) {
    int (*empty_cache)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachealloc_empty_cache");
    CHECK(empty_cache != NULL);
    if (empty_cache == NULL)
        return;
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *cached = NULL, *pending = NULL, *grown = NULL, *failed = NULL, *reused = NULL;
    CHECK_CODE(cudaMalloc(&cached, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(cached), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&pending, 40 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(pending, 40 * MIB, s, 1000), cudaSuccess);
    uint64_t syncs = fakecudart_counter("device_syncs");
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(pending), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&grown, 40 * MIB), cudaSuccess);
    CHECK(grown != pending);
    CHECK(empty_cache(0) == cudaSuccess);
    /* 10 + 40 + 40 MiB held: 16 MiB more do not fit in 100 unless the cache is given back. */
    CHECK_CODE(malloc_relaxed(&failed, 15 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    end_capture_whole(s);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    CHECK(fakecudart_counter("mallocs") == 3);
    CHECK(fakecudart_counter("frees") == 0);
    CHECK_CODE(cudaMalloc(&reused, 30 * MIB), cudaSuccess);
    CHECK(reused == pending);
    CHECK(empty_cache(0) == cudaSuccess);
    CHECK(fakecudart_counter("frees") == 1);
    CHECK_CODE(cudaFree(grown), cudaSuccess);
    CHECK_CODE(cudaFree(reused), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A run to record (trace:PATH) and replay: two frees still pending as a capture begins, one of
 * a block recorded on another stream (cachealloc_record_stream), are completed as it begins, so
 * the capture's requests reuse both blocks; a block freed during the capture stays pending, and
 * the capture's next request takes new memory. Run with free_sync:device or event. */
static void scenario_recorded_before(void) {
    int (*record_stream)(void *, void *) =
        (int (*)(void *, void *))dlsym(RTLD_DEFAULT, "cachealloc_record_stream");
    CHECK(record_stream != NULL);
    if (record_stream == NULL)
        return;
    cudaStream_t s, t;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
    CHECK_CODE(cudaMalloc(&a, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 20 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(a, 10 * MIB, s, 1000), cudaSuccess);
    CHECK(record_stream(b, t) == cudaSuccess);
    CHECK_CODE(fakecudart_launch(b, 20 * MIB, t, 1000), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&c, 10 * MIB), cudaSuccess);
    CHECK(c == a);
    CHECK_CODE(malloc_relaxed(&d, 20 * MIB), cudaSuccess);
    CHECK(d == b);
    CHECK_CODE(cudaFree(c), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&e, 10 * MIB), cudaSuccess);
    CHECK(e != a);
    end_capture_whole(s);
    CHECK(fakecudart_counter("mallocs") == 3);
    CHECK_CODE(cudaFree(d), cudaSuccess);
    CHECK_CODE(cudaFree(e), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(t), cudaSuccess);
}

/* The C API and the pluggable allocator's hooks, found in the preloaded library. */
struct direct_api {
    int (*malloc)(void **, size_t, int, void *);
    int (*free)(void *);
    int (*record_stream)(void *, void *);
    void (*torch_free)(void *, size_t, int, void *);
};

static int find_direct_api(struct direct_api *api) {
    api->malloc = (int (*)(void **, size_t, int, void *))dlsym(RTLD_DEFAULT, "cachealloc_malloc");
    api->free = (int (*)(void *))dlsym(RTLD_DEFAULT, "cachealloc_free");
    api->record_stream =
        (int (*)(void *, void *))dlsym(RTLD_DEFAULT, "cachealloc_record_stream");
    api->torch_free =
        (void (*)(void *, size_t, int, void *))dlsym(RTLD_DEFAULT, "cachealloc_torch_free");
    return api->malloc != NULL && api->free != NULL && api->record_stream != NULL &&
           api->torch_free != NULL;
}

/* Blocks of the C API recorded on other streams (cachealloc_record_stream), freed during a
 * capture of a blocking stream with cachealloc_free and with the pluggable allocator's free
 * hook: one recorded on the capturing stream, one on the legacy stream. An event recorded on the
 * capturing stream would be a captured event, which no query may ask about, even after the
 * capture; one recorded on the legacy stream, unusable while a blocking stream captures, would
 * end the capture. So no event is recorded or queried during the capture, which completes;
 * after it, the blocks wait for the work their streams had before the free, and are then
 * reused (as PyTorch records such events once no capture is underway). */
static void scenario_recorded_free(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t a, s;
    CHECK_CODE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreate(&s), cudaSuccess);
    void *x = NULL, *y = NULL, *z = NULL, *v = NULL, *w = NULL;
    CHECK_CODE(api.malloc(&x, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(api.malloc(&y, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(api.record_stream(x, s), cudaSuccess);
    CHECK_CODE(api.record_stream(y, NULL), cudaSuccess);
    CHECK_CODE(fakecudart_launch(x, 10 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(fakecudart_launch(y, 10 * MIB, NULL, 1000), cudaSuccess);
    uint64_t records = fakecudart_counter("event_records");
    uint64_t queries = fakecudart_counter("event_queries");
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(api.free(x), cudaSuccess);
    api.torch_free(y, 10 * MIB, 0, a);
    CHECK(fakecudart_counter("event_records") == records);
    CHECK(fakecudart_counter("event_queries") == queries);
    end_capture_whole(s);
    /* Both blocks wait for their streams' work, still running: the request takes new memory. */
    CHECK_CODE(api.malloc(&z, 10 * MIB, 0, a), cudaSuccess);
    CHECK(z != x && z != y);
    CHECK(!fakecudart_range_busy(z, 10 * MIB));
    CHECK_CODE(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_CODE(cudaStreamSynchronize(NULL), cudaSuccess);
    CHECK_CODE(api.malloc(&v, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(api.malloc(&w, 10 * MIB, 0, a), cudaSuccess);
    CHECK((v == x && w == y) || (v == y && w == x));
    CHECK(fakecudart_counter("captures_invalidated") == 0);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(api.free(z), cudaSuccess);
    CHECK_CODE(api.free(v), cudaSuccess);
    CHECK_CODE(api.free(w), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(a), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* The events of frees made during a capture cannot be created when the capture has ended (the
 * runtime out of resources): the request that finds them waiting is served all the same, with
 * new memory, and no error is left for the program to read; the frees keep waiting until a later
 * request records their events. Here the event of a C API free recorded on the legacy stream,
 * deferred while the blocking stream s captures. */
static void scenario_deferred_create_fails(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreate(&s), cudaSuccess);
    void *x = NULL, *z = NULL, *v = NULL;
    CHECK_CODE(api.malloc(&x, 10 * MIB, 0, s), cudaSuccess);
    CHECK_CODE(api.record_stream(x, NULL), cudaSuccess);
    CHECK_CODE(fakecudart_launch(x, 10 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(api.free(x), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_CODE(fakecudart_inject_call_failures("cudaEventCreate", 1, cudaErrorMemoryAllocation),
               cudaSuccess);
    CHECK_CODE(api.malloc(&z, 10 * MIB, 0, s), cudaSuccess);
    CHECK(z != x);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    /* The next request records the events, which find the work done, and reuses the block. */
    CHECK_CODE(api.malloc(&v, 10 * MIB, 0, s), cudaSuccess);
    CHECK(v == x);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(api.free(z), cudaSuccess);
    CHECK_CODE(api.free(v), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* The same with the fence of an interposed cudaFree under free_sync:event, an event on the
 * legacy stream deferred while the blocking stream s captures: the request is served. */
static void scenario_deferred_fence_create_fails(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreate(&s), cudaSuccess);
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, 10 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_CODE(fakecudart_inject_call_failures("cudaEventCreate", 1, cudaErrorMemoryAllocation),
               cudaSuccess);
    /* The miss synchronizes the device before growing, since a free is pending; that completes
     * p's fence, and the request takes p. */
    CHECK_CODE(cudaMalloc(&q, 10 * MIB), cudaSuccess);
    CHECK(q == p);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&r, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* The same failing at every request, with a recorded free of the C API waiting meanwhile for
 * its stream's event (recorded after the capture, its work not done): the requests, served
 * from the cache, are served, and the warning is given once (tests/preload_capture.rs counts
 * it), though the polls of the recorded free have no event left to record. */
static void scenario_deferred_fence_create_fails_again(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t s, b, c;
    CHECK_CODE(cudaStreamCreate(&s), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *x = NULL, *h = NULL;
    CHECK_CODE(api.malloc(&h, MIB, 0, c), cudaSuccess);
    CHECK_CODE(api.free(h), cudaSuccess);
    CHECK_CODE(api.malloc(&x, MIB, 0, c), cudaSuccess);
    CHECK_CODE(api.record_stream(x, b), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(fakecudart_launch(x, MIB, b, 1000000), cudaSuccess);
    CHECK_CODE(api.free(x), cudaSuccess);
    CHECK_CODE(fakecudart_inject_call_failures("cudaEventCreate", 100, cudaErrorMemoryAllocation),
               cudaSuccess);
    for (int i = 0; i < 3; i++) {
        CHECK_CODE(api.malloc(&h, MIB, 0, c), cudaSuccess);
        CHECK_CODE(api.free(h), cudaSuccess);
        CHECK_CODE(cudaGetLastError(), cudaSuccess);
    }
    CHECK_CODE(fakecudart_inject_call_failures("cudaEventCreate", 0, cudaSuccess), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(b), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(c), cudaSuccess);
}

/* A recorded stream the runtime refuses an event on when the capture has ended: the free cannot
 * wait for its work, and a warning says so (tests/preload_capture.rs reads it); the request goes
 * on, and no error is left for the program to read. */
static void scenario_deferred_refused(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t a, s;
    CHECK_CODE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *x = NULL, *z = NULL;
    CHECK_CODE(api.malloc(&x, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(api.record_stream(x, s), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(api.free(x), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(fakecudart_inject_call_failures("cudaEventRecord", 1, cudaErrorUnknown),
               cudaSuccess);
    CHECK_CODE(api.malloc(&z, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(api.free(z), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(a), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A block recorded on the capturing stream and on a stream of device 1, freed during the
 * capture and given back by cachealloc_empty_cache right after it: the synchronization made
 * before the release records the free's events, so it waits for the other device's stream too
 * (which a synchronization of device 0 does not cover), and the segment goes back to the device
 * once no work uses it. Needs two devices (the fake's default). */
static void scenario_recorded_free_emptied(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    int (*empty_cache)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachealloc_empty_cache");
    CHECK(empty_cache != NULL);
    cudaStream_t a, s, t1;
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&t1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreate(&s), cudaSuccess);
    void *x = NULL;
    CHECK_CODE(api.malloc(&x, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(api.record_stream(x, s), cudaSuccess);
    CHECK_CODE(api.record_stream(x, t1), cudaSuccess);
    CHECK_CODE(fakecudart_launch(x, 10 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(fakecudart_launch(x, 10 * MIB, t1, 5000), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(api.free(x), cudaSuccess);
    end_capture_whole(s);
    CHECK(fakecudart_counter("frees") == 0);
    CHECK(empty_cache(0) == cudaSuccess);
    CHECK(fakecudart_counter("frees") == 1);
    CHECK(!fakecudart_range_busy(x, 10 * MIB));
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(a), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(t1), cudaSuccess);
}

/* The two-device setting of the reset scenarios: streams a and s of device 0, t1 of device 1,
 * and a block x that the C API allocated on a, recorded as used on t1 by work still running
 * there. */
struct recorded_elsewhere {
    struct direct_api api;
    cudaStream_t a, s, t1;
    void *x;
};

static void record_on_device_1(struct recorded_elsewhere *r) {
    CHECK(find_direct_api(&r->api));
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&r->t1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&r->a, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(r->api.malloc(&r->x, 10 * MIB, 0, r->a), cudaSuccess);
    CHECK_CODE(r->api.record_stream(r->x, r->t1), cudaSuccess);
    CHECK_CODE(fakecudart_launch(r->x, 10 * MIB, r->t1, 5000), cudaSuccess);
}

/* A block recorded on a stream of device 1 and freed during a capture on device 0, whose
 * device 1 is reset after the capture, before device 0's next request: the free's event is
 * recorded before the reset, on the stream the reset then destroys (not after it, on a handle
 * the runtime let go: the real runtime does not check one), and the reset completes it. Needs
 * two devices (the fake's default). */
/* The body of both reset scenarios: device 1 is reset after the capture, or while it is still
 * underway (relaxed, which lets the reset be made). */
static void recorded_free_reset(int during_capture) {
    struct recorded_elsewhere r = {0};
    record_on_device_1(&r);
    if (failures)
        return;
    void *y = NULL;
    enum cudaStreamCaptureMode mode =
        during_capture ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeGlobal;
    CHECK_CODE(cudaStreamBeginCapture(r.s, mode), cudaSuccess);
    CHECK_CODE(r.api.free(r.x), cudaSuccess);
    if (!during_capture)
        end_capture_whole(r.s);
    uint64_t stale = fakecudart_counter("stale_stream_calls");
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    if (during_capture)
        end_capture_whole(r.s);
    CHECK_CODE(r.api.malloc(&y, 10 * MIB, 0, r.a), cudaSuccess);
    CHECK(y == r.x);
    CHECK(fakecudart_counter("stale_stream_calls") == stale);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(r.api.free(y), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(r.a), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(r.s), cudaSuccess);
}

static void scenario_recorded_free_reset(void) { recorded_free_reset(0); }

/* The calling thread's capture mode (exchanged for itself and back). */
static enum cudaStreamCaptureMode thread_capture_mode(void) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    enum cudaStreamCaptureMode back = mode;
    cudaThreadExchangeStreamCaptureMode(&back);
    return mode;
}

/* cachealloc_malloc on the capturing stream: a cached block of the stream serves the request; a
 * miss takes new memory with cudaMalloc, with the thread's capture mode relaxed for the call (as
 * PyTorch's allocator relaxes it around its own cudaMalloc), so the global-mode capture goes on
 * whatever mode the thread had, and the thread's mode is left as it was. So does a miss of the
 * pluggable allocator's hook (here the MemPool one). The program's own cudaMalloc keeps its
 * mode: a miss from a thread in the global mode is refused (900) and ends the capture, as the
 * runtime's cudaMalloc would be. */
static void scenario_direct_malloc(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    void *(*mempool_malloc)(size_t, int, void *) =
        (void *(*)(size_t, int, void *))dlsym(RTLD_DEFAULT, "cachealloc_torch_mempool_malloc");
    CHECK(mempool_malloc != NULL);
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *cached = NULL, *hit = NULL, *grown = NULL, *relaxed = NULL, *hooked = NULL;
    void *refused = NULL;
    CHECK_CODE(api.malloc(&cached, 10 * MIB, 0, s), cudaSuccess);
    CHECK_CODE(api.free(cached), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(api.malloc(&hit, 10 * MIB, 0, s), cudaSuccess);
    CHECK(hit == cached);
    uint64_t mallocs = fakecudart_counter("mallocs");
    CHECK_CODE(api.malloc(&grown, 10 * MIB, 0, s), cudaSuccess);
    CHECK(grown != NULL && grown != hit);
    CHECK(thread_capture_mode() == cudaStreamCaptureModeGlobal);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK_CODE(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    CHECK_CODE(api.malloc(&relaxed, 10 * MIB, 0, s), cudaSuccess);
    CHECK(thread_capture_mode() == cudaStreamCaptureModeRelaxed);
    CHECK_CODE(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    hooked = mempool_malloc(10 * MIB, 0, s);
    CHECK(hooked != NULL);
    CHECK(thread_capture_mode() == cudaStreamCaptureModeGlobal);
    CHECK(fakecudart_counter("mallocs") == mallocs + 3);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaMalloc(&refused, 10 * MIB), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    CHECK(fakecudart_counter("captures_invalidated") == 1);
    CHECK_CODE(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
    CHECK_CODE(api.free(hit), cudaSuccess);
    CHECK_CODE(api.free(grown), cudaSuccess);
    CHECK_CODE(api.free(relaxed), cudaSuccess);
    CHECK_CODE(api.free(hooked), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A miss of cachealloc_malloc during a capture whose cudaMalloc fails with an error other than
 * out of memory: the code is returned, and the thread's last error is left as it was (the
 * failure is the library's own call, the relaxed mode restored after it): none, then the
 * program's own unread error. The thread's mode is left as it was, and the capture completes. */
static void scenario_direct_malloc_fails(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL;
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    fakecudart_inject_malloc_failures(1, cudaErrorUnknown);
    CHECK_CODE(api.malloc(&p, 10 * MIB, 0, s), cudaErrorUnknown);
    CHECK(p == NULL);
    CHECK(thread_capture_mode() == cudaStreamCaptureModeGlobal);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaSetDevice(99), cudaErrorInvalidDevice);
    fakecudart_inject_malloc_failures(1, cudaErrorUnknown);
    CHECK_CODE(api.malloc(&p, 10 * MIB, 0, s), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* cachealloc_malloc during a capture with CACHEALLOC_DISABLE=1 (tests/preload_capture.rs sets
 * it): every request is the runtime's cudaMalloc, made with the thread's capture mode relaxed
 * as when the library is enabled, so the global-mode capture goes on and the thread's mode is
 * left as it was. */
static void scenario_direct_malloc_disabled(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL;
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    uint64_t mallocs = fakecudart_counter("mallocs");
    CHECK_CODE(api.malloc(&p, 10 * MIB, 0, s), cudaSuccess);
    CHECK(p != NULL);
    CHECK(fakecudart_counter("mallocs") == mallocs + 1);
    CHECK(thread_capture_mode() == cudaStreamCaptureModeGlobal);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    end_capture_whole(s);
    CHECK_CODE(api.free(p), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* The same with device 1 reset while the capture on device 0 is still underway (relaxed, which
 * lets the reset be made): the free's event on the stream the reset destroys is recorded before
 * the reset, and the reset completes it; after the capture no call names the stale handle. */
static void scenario_recorded_free_reset_during(void) { recorded_free_reset(1); }

/* A block of the C API recorded on two streams, freed during a capture of a third: the program
 * destroys one recorded stream (s1) after the capture, before its next request. Its event is
 * recorded as it is destroyed, the other stream's at the next request, and the block waits for
 * both streams' work, each one's on its own, with no call on the destroyed handle. */
static void scenario_recorded_free_destroyed(void) {
    struct direct_api api;
    CHECK(find_direct_api(&api));
    cudaStream_t a, c, s1, s2;
    CHECK_CODE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
    void *x = NULL, *y = NULL, *z = NULL, *w = NULL;
    CHECK_CODE(api.malloc(&x, 10 * MIB, 0, a), cudaSuccess);
    CHECK_CODE(api.record_stream(x, s1), cudaSuccess);
    CHECK_CODE(api.record_stream(x, s2), cudaSuccess);
    CHECK_CODE(fakecudart_launch(x, 10 * MIB, s1, 3000), cudaSuccess);
    CHECK_CODE(fakecudart_launch(x, 10 * MIB, s2, 1000), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(api.free(x), cudaSuccess);
    end_capture_whole(c);
    uint64_t stale = fakecudart_counter("stale_stream_calls");
    CHECK_CODE(cudaStreamDestroy(s1), cudaSuccess);
    CHECK_CODE(api.malloc(&y, 10 * MIB, 0, a), cudaSuccess);
    CHECK(y != x);
    /* s2's work is over, the destroyed s1's is not: still waiting. */
    fakecudart_advance(1000);
    CHECK_CODE(api.malloc(&z, 10 * MIB, 0, a), cudaSuccess);
    CHECK(z != x);
    fakecudart_advance(2000);
    CHECK_CODE(api.malloc(&w, 10 * MIB, 0, a), cudaSuccess);
    CHECK(w == x);
    CHECK(fakecudart_counter("stale_stream_calls") == stale);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(api.free(y), cudaSuccess);
    CHECK_CODE(api.free(z), cudaSuccess);
    CHECK_CODE(api.free(w), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(a), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(c), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s2), cudaSuccess);
}

/* Another thread's request during a capture: thread-local captures let other threads call
 * cudaMalloc, and the pool must not synchronize the device for them either. */
static void *other_thread_malloc(void *arg) {
    void **out = arg;
    if (cudaMalloc(out, 10 * MIB) != cudaSuccess)
        *out = NULL;
    return NULL;
}

static void scenario_other_thread(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread_malloc, &q) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(q != NULL && q != p);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK(fakecudart_counter("captures_invalidated") == 0);
}

/* A capture that ended is forgotten, and so is a destroyed stream, its capture ended or not:
 * no later cudaStreamIsCapturing names its handle, which the real runtime does not check (a
 * destroyed stream's may crash it; the fake counts it in stale_stream_calls). The next miss
 * waits for the device again and reuses the pending block. */
static void scenario_ended(void) {
    cudaStream_t s, ended, gone;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&ended, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(ended, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaStreamEndCapture(ended, &graph), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(ended), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(gone, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(gone), cudaSuccess);
    uint64_t stale = fakecudart_counter("stale_stream_calls");
    void *p = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    uint64_t syncs = fakecudart_counter("device_syncs");
    CHECK_CODE(cudaMalloc(&r, 10 * MIB), cudaSuccess);
    CHECK(r == p);
    CHECK(fakecudart_counter("device_syncs") == syncs + 1);
    CHECK(fakecudart_counter("stale_stream_calls") == stale);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
}

/* A device reset destroys the device's streams: a noted one is forgotten then, so that no query
 * names it afterwards, while another device's capture stays noted and its relaxed cudaMalloc
 * still does not wait for the pending free of its device. Needs two devices (the fake's
 * default). */
static void scenario_reset(void) {
    cudaStream_t s0, s1;
    void *p1 = NULL, *q1 = NULL, *p0 = NULL;
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p1, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaStreamEndCapture(s0, &graph), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p1), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    uint64_t stale = fakecudart_counter("stale_stream_calls");
    CHECK_CODE(malloc_relaxed(&p0, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q1, 10 * MIB), cudaSuccess);
    CHECK(q1 != p1);
    CHECK_CODE(cudaStreamEndCapture(s1, &graph), cudaSuccess);
    CHECK(graph != NULL);
    CHECK(fakecudart_counter("captures_invalidated") == 0);
    CHECK(fakecudart_counter("stale_stream_calls") == stale);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(q1), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s1), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaFree(p0), cudaSuccess);
}

/* A noted stream the runtime cannot answer for (injected here: a stream it no longer knows) is
 * forgotten, and the failed cudaStreamIsCapturing is the library's own call: it leaves no error
 * for the program, whose own unread error (101 from cudaSetDevice) is still the one it reads. */
static void scenario_query_fails(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaSetDevice(99), cudaErrorInvalidDevice);
    CHECK_CODE(fakecudart_inject_call_failures("cudaStreamIsCapturing", 1,
                                               cudaErrorInvalidResourceHandle),
               cudaSuccess);
    uint64_t syncs = fakecudart_counter("device_syncs");
    CHECK_CODE(cudaMalloc(&r, 10 * MIB), cudaSuccess);
    CHECK(r == p);
    CHECK(fakecudart_counter("device_syncs") == syncs + 1);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

/* A stream captured again and again, with no request between its captures to find them ended
 * (a loop of torch.cuda.graph captures on PyTorch's one default capture stream), is noted once:
 * more captures of it than the table has slots leave room for another stream's capture, which is
 * followed after the first stream's capture ends (its relaxed cudaMalloc does not wait for the
 * pending free), and no warning says that a capture is not followed. */
static void scenario_recaptured(void) {
    cudaStream_t s, t;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    cudaGraph_t graph = NULL;
    for (int i = 0; i < 100; i++) {
        CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
        CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
        CHECK_CODE(cudaGraphDestroy(graph), cudaSuccess);
    }
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(t, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK_CODE(malloc_relaxed(&q, 10 * MIB), cudaSuccess);
    CHECK(q != p);
    CHECK_CODE(cudaStreamEndCapture(t, &graph), cudaSuccess);
    CHECK(graph != NULL);
    CHECK(fakecudart_counter("captures_invalidated") == 0);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(t), cudaSuccess);
}

/* Refused starts are the runtime's answers, and note nothing: the next miss asks the runtime
 * about no stream (a noted one would be asked about, and found not capturing). */
static void scenario_refused(void) {
    CHECK_CODE(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
               cudaErrorStreamCaptureUnsupported);
    CHECK_CODE(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, (enum cudaStreamCaptureMode)7), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(fakecudart_counter("captures_begun") == 0);
    void *p = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 10 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaMalloc(&r, 10 * MIB), cudaSuccess);
    CHECK(r == p);
    CHECK(fakecudart_counter("capture_queries") == 0);
}

static const struct scenario scenarios[] = {
    {"pending_free", scenario_pending_free},
    {"pending_free_blocking", scenario_pending_free_blocking},
    {"freed_before", scenario_freed_before},
    {"sync_fails_at_capture", scenario_sync_fails_at_capture},
    {"oom", scenario_oom},
    {"oom_pending", scenario_oom_pending},
    {"empty_cache", scenario_empty_cache},
    {"recorded", scenario_recorded},
    {"recorded_before", scenario_recorded_before},
    {"recorded_free", scenario_recorded_free},
    {"recorded_free_emptied", scenario_recorded_free_emptied},
    {"deferred_create_fails", scenario_deferred_create_fails},
    {"deferred_fence_create_fails", scenario_deferred_fence_create_fails},
    {"deferred_fence_create_fails_again", scenario_deferred_fence_create_fails_again},
    {"deferred_refused", scenario_deferred_refused},
    {"recorded_free_reset", scenario_recorded_free_reset},
    {"recorded_free_destroyed", scenario_recorded_free_destroyed},
    {"recorded_free_reset_during", scenario_recorded_free_reset_during},
    {"direct_malloc", scenario_direct_malloc},
    {"direct_malloc_fails", scenario_direct_malloc_fails},
    {"direct_malloc_disabled", scenario_direct_malloc_disabled},
    {"other_thread", scenario_other_thread},
    {"ended", scenario_ended},
    {"refused", scenario_refused},
    {"query_fails", scenario_query_fails},
    {"reset", scenario_reset},
    {"recaptured", scenario_recaptured},
};

SCENARIO_MAIN(scenarios)
