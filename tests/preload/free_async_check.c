/*
 * free_async_check.c — cudaFreeAsync (and its _ptsz form) with libcachealloc.so preloaded in
 * front of the fake runtime, whose cudaFreeAsync gives back the whole allocation at the pointer
 * it is given, cudaMalloc's included. A pool pointer must go back to the pool, ordered on the
 * stream: the rest of its segment stays usable, and the block is reused only once the stream
 * has reached the free. Memory of the stream-ordered allocator (cudaMallocAsync) goes to the
 * runtime. Run by tests/preload_free_async.rs as `free_async_check SCENARIO`; prints
 * "ok SCENARIO" when every check held.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define KIB ((size_t)1 << 10)
#define BLOCK (256 * KIB)

#include "check.h"

static uint64_t counter(const char *name) { return fakecudart_counter(name); }

/* Two blocks of one small segment; work on `sync` uses the first, which `free_async` then frees
 * on `s` (the same stream; NULL for the _ptsz form's default). The runtime is not asked, the
 * first block is reused only after `sync` is synchronized, and the second stays usable. */
static void freed_on(cudaStream_t s, cudaStream_t sync,
                     cudaError_t (*free_async)(void *, cudaStream_t)) {
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK_CODE(cudaMalloc(&a, BLOCK), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, BLOCK), cudaSuccess);
    uint64_t in_use = counter("bytes_in_use");
    CHECK_CODE(fakecudart_launch(a, BLOCK, sync, 1000), cudaSuccess);
    CHECK_CODE(free_async(a, s), cudaSuccess);
    CHECK(counter("async_frees") == 0);
    CHECK(counter("frees") == 0);
    CHECK(counter("bytes_in_use") == in_use);
    CHECK_CODE(cudaMalloc(&c, BLOCK), cudaSuccess);
    CHECK(c != a);
    CHECK(fakecudart_range_busy(a, BLOCK));
    CHECK_CODE(cudaStreamSynchronize(sync), cudaSuccess);
    CHECK_CODE(cudaMalloc(&d, BLOCK), cudaSuccess);
    CHECK(d == a);
    CHECK(counter("bytes_in_use") == in_use);
    /* (cudaMemset waits for the legacy stream, hence for blocking streams' work: not before.) */
    CHECK_CODE(cudaMemset(b, 7, BLOCK), cudaSuccess);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
}

/* cudaFreeAsync(p, s) of a pool pointer on a created stream. */
static void scenario_stream_ordered(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    freed_on(s, s, cudaFreeAsync);
}

/* cudaFreeAsync_ptsz(p, NULL): ordered on the calling thread's default stream. */
static void scenario_per_thread(void) {
    freed_on(NULL, cudaStreamPerThread, cudaFreeAsync_ptsz);
}

/* Memory of the stream-ordered allocator, and NULL, go to the runtime in both forms. */
static void scenario_foreign(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *pooled = NULL, *e = NULL, *f = NULL;
    CHECK_CODE(cudaMalloc(&pooled, BLOCK), cudaSuccess);
    CHECK_CODE(cudaMallocAsync(&e, BLOCK, s), cudaSuccess);
    CHECK_CODE(cudaMallocAsync_ptsz(&f, BLOCK, NULL), cudaSuccess);
    CHECK(counter("async_mallocs") == 2);
    CHECK_CODE(cudaFreeAsync(e, s), cudaSuccess);
    CHECK_CODE(cudaFreeAsync_ptsz(f, NULL), cudaSuccess);
    CHECK(counter("async_frees") == 2);
    CHECK_CODE(cudaFreeAsync(NULL, s), cudaSuccess);
    /* An unknown pointer is the runtime's to refuse. */
    CHECK_CODE(cudaFreeAsync(e, s), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(counter("async_frees") == 2);
}

/* A pool pointer freed twice, or inside its block: refused with 1, the pool intact. */
static void scenario_bad_pointers(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL, *b = NULL;
    CHECK_CODE(cudaMalloc(&a, BLOCK), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, BLOCK), cudaSuccess);
    CHECK_CODE(cudaFreeAsync((char *)b + 512, s), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_CODE(cudaFreeAsync(a, s), cudaSuccess);
    CHECK_CODE(cudaFreeAsync(a, s), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(counter("free_failures") == 0);
    CHECK_CODE(cudaMemset(b, 1, BLOCK), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
}

/* On a capturing stream a pool pointer is no graph allocation: refused with 1, still allocated,
 * the capture goes on; after the capture the same free succeeds. */
static void scenario_capturing(void) {
    cudaStream_t s;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL;
    CHECK_CODE(cudaMalloc(&a, BLOCK), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFreeAsync(a, s), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK(counter("captures_invalidated") == 0);
    CHECK_CODE(cudaGraphDestroy(graph), cudaSuccess);
    CHECK_CODE(cudaMemset(a, 1, BLOCK), cudaSuccess);
    CHECK_CODE(cudaFreeAsync(a, s), cudaSuccess);
    CHECK(counter("async_frees") == 0);
}

/* A stream the runtime does not take: its answer (400 from the fake), the block still
 * allocated. */
static void scenario_stale_stream(void) {
    cudaStream_t t;
    CHECK_CODE(cudaStreamCreate(&t), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(t), cudaSuccess);
    void *a = NULL;
    CHECK_CODE(cudaMalloc(&a, BLOCK), cudaSuccess);
    CHECK_CODE(cudaFreeAsync(a, t), cudaErrorInvalidResourceHandle);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    CHECK_CODE(cudaMemset(a, 1, BLOCK), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
}

/* A free made while another stream (c) captures waits for its event until the capture has
 * ended. The program may destroy the free's stream before its next request, during the capture
 * or after it (`during`), and CUDA lets the stream's work run on: the block still waits for that
 * work, no call names the destroyed stream, and the capture is not disturbed. */
static void destroyed_with_a_free_deferred(int during) {
    cudaStream_t c, s;
    CHECK_CODE(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL, *b = NULL, *d = NULL;
    CHECK_CODE(cudaMalloc(&a, BLOCK), cudaSuccess);
    CHECK_CODE(fakecudart_launch(a, BLOCK, s, 1000), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(c, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_CODE(cudaFreeAsync(a, s), cudaSuccess);
    uint64_t stale = counter("stale_stream_calls");
    if (during)
        CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(c, &graph), cudaSuccess);
    CHECK_CODE(cudaGraphDestroy(graph), cudaSuccess);
    if (!during)
        CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, BLOCK), cudaSuccess);
    CHECK(!fakecudart_range_busy(b, BLOCK));
    /* Once the destroyed stream's work has ended, the block is reused. */
    fakecudart_advance(1000);
    CHECK_CODE(cudaMalloc(&d, BLOCK), cudaSuccess);
    CHECK(d == a);
    CHECK(counter("stale_stream_calls") == stale);
    CHECK(counter("captures_invalidated") == 0);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaFree(d), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(c), cudaSuccess);
}

static void scenario_destroyed_after_capture(void) { destroyed_with_a_free_deferred(0); }

static void scenario_destroyed_during_capture(void) { destroyed_with_a_free_deferred(1); }

/* Another thread's work on its own default stream, freed there with cudaFreeAsync_ptsz(p, NULL)
 * while the main thread's stream captures. */
static void *free_on_own_default_stream(void *p) {
    if (fakecudart_launch(p, BLOCK, cudaStreamPerThread, 1000) != cudaSuccess ||
        cudaFreeAsync_ptsz(p, NULL) != cudaSuccess)
        return p;
    return NULL;
}

/* A free on another thread's default stream, made during a capture, waits for its event until
 * the capture has ended; the main thread's next request records it. The block still waits for
 * that thread's work, not for the main thread's own default stream (empty). */
static void scenario_per_thread_deferred(void) {
    cudaStream_t c;
    CHECK_CODE(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
    void *a = NULL, *b = NULL, *d = NULL, *failed = NULL;
    CHECK_CODE(cudaMalloc(&a, BLOCK), cudaSuccess);
    CHECK_CODE(cudaStreamBeginCapture(c, cudaStreamCaptureModeRelaxed), cudaSuccess);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, free_on_own_default_stream, a) == 0);
    CHECK(pthread_join(thread, &failed) == 0);
    CHECK(failed == NULL);
    cudaGraph_t graph = NULL;
    CHECK_CODE(cudaStreamEndCapture(c, &graph), cudaSuccess);
    CHECK_CODE(cudaGraphDestroy(graph), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, BLOCK), cudaSuccess);
    CHECK(!fakecudart_range_busy(b, BLOCK));
    fakecudart_advance(1000);
    CHECK_CODE(cudaMalloc(&d, BLOCK), cudaSuccess);
    CHECK(d == a);
    CHECK(counter("captures_invalidated") == 0);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaFree(d), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(c), cudaSuccess);
}

static const struct scenario scenarios[] = {
    {"stream_ordered", scenario_stream_ordered},
    {"per_thread", scenario_per_thread},
    {"per_thread_deferred", scenario_per_thread_deferred},
    {"foreign", scenario_foreign},
    {"bad_pointers", scenario_bad_pointers},
    {"capturing", scenario_capturing},
    {"stale_stream", scenario_stale_stream},
    {"destroyed_after_capture", scenario_destroyed_after_capture},
    {"destroyed_during_capture", scenario_destroyed_during_capture},
};

SCENARIO_MAIN(scenarios)
