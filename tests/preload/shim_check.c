/*
 * shim_check.c — scenarios run against the fake libcudart.so.12 with libcachealloc.so in front
 * of it (LD_PRELOAD). Built twice by tests/preload.rs: as a program (`shim_check SCENARIO`) and,
 * with -DSHIM_CHECK_LIBRARY, as a shared library whose `shim_check_run(SCENARIO)` a Python script
 * calls through ctypes. Each scenario prints "ok SCENARIO" when every check held; a failed check
 * prints "FAIL <file>:<line>: <condition>" and makes the scenario return 1.
 *
 * The fake's counters show which calls reached the real runtime (i.e. were forwarded or made by
 * the pool), and its clock shows whether memory was handed out while work on it was running.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define MIB ((size_t)1 << 20)

#include "check.h"

static uint64_t counter(const char *name) { return fakecudart_counter(name); }

/* A tiny deterministic generator, so every run asks for the same sizes. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Sizes from 1 byte to 8 MiB, log-uniform-ish, so both pools and splitting are exercised. */
static size_t random_size(void) {
    unsigned shift = (unsigned)(next_random() % 23);
    return (size_t)(next_random() % ((size_t)1 << shift)) + 1;
}

#define LIVE 64

/* 10^5 cudaMalloc/cudaFree calls (N given by SHIM_CHECK_ITERATIONS, default 100000) reach the
 * fake as a handful of segment allocations; live allocations never overlap; data written into
 * each allocation reads back intact. Prints the fake's malloc count for the test to judge. */
static void scenario_churn(void) {
    const char *env = getenv("SHIM_CHECK_ITERATIONS");
    long iterations = env ? atol(env) : 100000;
    void *live[LIVE] = {0};
    size_t sizes[LIVE] = {0};
    unsigned char pattern[256];
    unsigned char back[256];
    for (long i = 0; i < iterations / 2; i++) {
        int slot = (int)(next_random() % LIVE);
        if (live[slot]) {
            /* The first bytes still hold the pattern written at allocation time. */
            size_t n = sizes[slot] < sizeof back ? sizes[slot] : sizeof back;
            memset(pattern, (int)(slot + 1), n);
            CHECK_CODE(cudaMemcpy(back, live[slot], n, cudaMemcpyDeviceToHost), cudaSuccess);
            CHECK(memcmp(back, pattern, n) == 0);
            CHECK_CODE(cudaFree(live[slot]), cudaSuccess);
            live[slot] = NULL;
        }
        size_t size = random_size();
        void *p = NULL;
        CHECK_CODE(cudaMalloc(&p, size), cudaSuccess);
        CHECK(p != NULL);
        CHECK((uintptr_t)p % 512 == 0);
        uintptr_t lo = (uintptr_t)p, hi = lo + size;
        for (int j = 0; j < LIVE; j++) {
            if (!live[j]) continue;
            uintptr_t a = (uintptr_t)live[j], b = a + sizes[j];
            CHECK(hi <= a || b <= lo);
        }
        size_t n = size < sizeof pattern ? size : sizeof pattern;
        memset(pattern, (int)(slot + 1), n);
        CHECK_CODE(cudaMemcpy(p, pattern, n, cudaMemcpyHostToDevice), cudaSuccess);
        if (size > n) {
            /* The last byte is inside the allocation too (cudaMemset checks the range). */
            CHECK_CODE(cudaMemset((char *)p + size - 1, 0xab, 1), cudaSuccess);
        }
        live[slot] = p;
        sizes[slot] = size;
    }
    for (int j = 0; j < LIVE; j++) {
        if (live[j]) CHECK_CODE(cudaFree(live[j]), cudaSuccess);
    }
    printf("fake mallocs %llu frees %llu\n", (unsigned long long)counter("mallocs"),
           (unsigned long long)counter("frees"));
}

/* Out of memory answers exactly 2 and, as the runtime's own failed cudaMalloc does, leaves 2 as
 * the last error until cudaGetLastError() reads it; the program can go on. A request that fits
 * only after the cache is flushed succeeds and leaves no error: the runtime's failure on the
 * way was the library's, recovered from; an older error the program had not read stays. */
static void scenario_oom(void) {
    void *a = NULL, *b = NULL, *c = NULL;
    /* FAKECUDART_CAPACITY=64MiB */
    CHECK_CODE(cudaMalloc(&a, 40 * MIB), cudaSuccess);
    b = (void *)0x1234;
    CHECK_CODE(cudaMalloc(&b, 40 * MIB), cudaErrorMemoryAllocation);
    CHECK(b == (void *)0x1234); /* out-pointer untouched */
    CHECK_CODE(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    /* a is cached (40 MiB); 50 MiB fits only once the cache is released: the first real
     * cudaMalloc fails (leaving a sticky error in the runtime), the pool releases a and retries. */
    uint64_t failures_before = counter("malloc_failures");
    CHECK_CODE(cudaMalloc(&c, 50 * MIB), cudaSuccess);
    CHECK(counter("malloc_failures") > failures_before);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaPeekAtLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(c), cudaSuccess);
    /* An error the program has not read yet outlives the library's own failed cudaMalloc on
     * the way, which replaced it in the runtime: 60 MiB fits once the cached 50 MiB go. */
    CHECK_CODE(cudaSetDevice(99), cudaErrorInvalidDevice);
    failures_before = counter("malloc_failures");
    CHECK_CODE(cudaMalloc(&c, 60 * MIB), cudaSuccess);
    CHECK(counter("malloc_failures") > failures_before);
    CHECK_CODE(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(c), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
}

/* A program that tries again and again (FAKECUDART_CAPACITY=64MiB): 20 requests of 40 MiB
 * beside a live 40 MiB allocation, each refused with 2. */
static void scenario_oom_loop(void) {
    void *a = NULL, *b = NULL;
    CHECK_CODE(cudaMalloc(&a, 40 * MIB), cudaSuccess);
    for (int i = 0; i < 20; i++) {
        CHECK_CODE(cudaMalloc(&b, 40 * MIB), cudaErrorMemoryAllocation);
        CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    }
    CHECK_CODE(cudaFree(a), cudaSuccess);
}

/* A program that frees a freed pointer again and again, ignoring the answer (each is refused). */
static void scenario_double_free_loop(void) {
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    for (int i = 0; i < 40; i++) CHECK_CODE(cudaFree(p), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
}

/* Fragmentation (FAKECUDART_CAPACITY=256MiB): two 100 MiB segments, each cut by a live 60 MiB
 * block, leave 80 MiB free in 40 MiB pieces and 56 MiB on the device, so a third 100 MiB
 * request runs out of memory under the default settings. Prints that request's answer: the
 * test reruns with the report's suggested max_split_size_mb and expects success. */
static void scenario_fragmentation(void) {
    void *big = NULL, *first = NULL, *second = NULL, *last = NULL;
    CHECK_CODE(cudaMalloc(&big, 100 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(big), cudaSuccess);
    CHECK_CODE(cudaMalloc(&first, 60 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&big, 100 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(big), cudaSuccess);
    CHECK_CODE(cudaMalloc(&second, 60 * MIB), cudaSuccess);
    cudaError_t answer = cudaMalloc(&last, 100 * MIB);
    printf("last request: %d\n", (int)answer);
    CHECK_CODE(cudaGetLastError(), answer);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    if (answer == cudaSuccess) CHECK_CODE(cudaFree(last), cudaSuccess);
    CHECK_CODE(cudaFree(first), cudaSuccess);
    CHECK_CODE(cudaFree(second), cudaSuccess);
}

/* Memory the pool does not own, and cudaFree(NULL), go to the runtime untouched. */
static void scenario_foreign(void) {
    void *managed = NULL, *pitched = NULL, *pooled = NULL;
    size_t pitch = 0;
    CHECK_CODE(cudaMalloc(&pooled, 1 * MIB), cudaSuccess);
    CHECK_CODE(cudaMallocManaged(&managed, 3 * MIB, 1), cudaSuccess);
    CHECK_CODE(cudaMallocPitch(&pitched, &pitch, 1000, 10), cudaSuccess);
    uint64_t frees = counter("frees"), nulls = counter("null_frees");
    CHECK_CODE(cudaFree(NULL), cudaSuccess);
    CHECK(counter("null_frees") == nulls + 1);
    CHECK_CODE(cudaFree(managed), cudaSuccess);
    CHECK_CODE(cudaFree(pitched), cudaSuccess);
    CHECK(counter("frees") == frees + 2);
    CHECK_CODE(cudaFree(pooled), cudaSuccess);
    CHECK(counter("frees") == frees + 2); /* the pool keeps its segment */
    /* A pointer nobody allocated: the runtime's own answer. */
    int on_stack;
    CHECK_CODE(cudaFree(&on_stack), cudaErrorInvalidValue);
    CHECK(counter("free_failures") == 1);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    /* Size 0 and a NULL out-pointer are the runtime's to answer. */
    void *zero = (void *)0x1;
    CHECK_CODE(cudaMalloc(&zero, 0), cudaSuccess);
    CHECK(zero == NULL);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue); /* the runtime's own refusal */
}

/* cudaIpcGetMemHandle: the start of a segment goes to the runtime, whose handle opens there; a
 * pointer further inside a segment answers 1 (the handle would open at the segment's start, at
 * another allocation) without reaching the runtime; memory the pool does not own is forwarded. */
static void scenario_ipc(void) {
    char *p = NULL, *q = NULL;
    void *pitched = NULL;
    size_t pitch = 0;
    int on_stack = 0;
    cudaIpcMemHandle_t h;
    CHECK_CODE(cudaMalloc((void **)&p, 4096), cudaSuccess);
    CHECK_CODE(cudaMalloc((void **)&q, 4096), cudaSuccess);
    CHECK(q == p + 4096); /* one 2 MiB segment, p at its start */
    CHECK_CODE(cudaIpcGetMemHandle(&h, p), cudaSuccess);
    CHECK(fakecudart_ipc_handle_base(&h) == (uintptr_t)p);
    uint64_t made = counter("ipc_handles");
    CHECK(made == 1);
    CHECK_CODE(cudaIpcGetMemHandle(&h, q), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue); /* as the runtime's own refusal */
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK(counter("ipc_handles") == made);
    /* Not the pool's: the runtime answers. */
    CHECK_CODE(cudaMallocPitch(&pitched, &pitch, 1000, 10), cudaSuccess);
    CHECK_CODE(cudaIpcGetMemHandle(&h, pitched), cudaSuccess);
    CHECK(fakecudart_ipc_handle_base(&h) == (uintptr_t)pitched);
    CHECK_CODE(cudaIpcGetMemHandle(&h, &on_stack), cudaErrorInvalidValue);
    CHECK_CODE(cudaIpcGetMemHandle(NULL, p), cudaErrorInvalidValue);
    CHECK(counter("ipc_handles") == made + 1);
    CHECK_CODE(cudaFree(pitched), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

/* A double free or an interior pointer answers 1 and leaves the pool intact. */
static void scenario_double_free(void) {
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK_CODE(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK_CODE(cudaMalloc(&q, 4096), cudaSuccess);
    uint64_t frees = counter("frees"), failed = counter("free_failures");
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue); /* as the runtime's own refusal */
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree((char *)q + 512), cudaErrorInvalidValue);
    /* A newer error of the runtime's own comes first. */
    CHECK_CODE(cudaSetDevice(99), cudaErrorInvalidDevice);
    CHECK_CODE(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    /* The library's refusal is newer than an error of the runtime's the program has not read:
     * it replaces it, as a newer failure of the runtime's own would. */
    CHECK_CODE(cudaSetDevice(99), cudaErrorInvalidDevice);
    CHECK_CODE(cudaFree(p), cudaErrorInvalidValue);
    CHECK_CODE(cudaPeekAtLastError(), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK(counter("frees") == frees);           /* nothing reached the runtime */
    CHECK(counter("free_failures") == failed);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    /* q is still live and usable; the pool still serves and frees. */
    CHECK_CODE(cudaMemset(q, 7, 4096), cudaSuccess);
    CHECK_CODE(cudaMalloc(&r, 4096), cudaSuccess);
    CHECK(r != q);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaErrorInvalidValue);
}

/* cudaDeviceReset drops the pool of the current device: its memory went with the reset, and the
 * next allocation gets a fresh segment from the runtime. */
static void scenario_reset(void) {
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    uint64_t mallocs = counter("mallocs");
    CHECK_CODE(cudaMalloc(&q, 1 * MIB), cudaSuccess); /* from the cache */
    CHECK(counter("mallocs") == mallocs);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK(counter("device_resets") == 1);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaSuccess);
    CHECK(counter("mallocs") == mallocs + 1);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    printf("pid %d\n", (int)getpid()); /* names the exit statistics' file */
}

/* Two cudaDeviceResets, each ending a pool that served one allocation of 1 MiB, then a third pool
 * that serves one: the exit statistics cover all three. */
static void scenario_reset_twice(void) {
    void *p = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaSuccess);
        CHECK_CODE(cudaFree(p), cudaSuccess);
        if (i < 2) CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    }
    printf("pid %d\n", (int)getpid()); /* names the exit statistics' file */
}

/* A record of another stream's use (cachealloc_record_stream) goes with the pool a reset ends:
 * an allocation the next pool makes at the same address is not held back by it. The stream is
 * one of device 1, which the reset of device 0 does not stop, busy with other work. */
static void scenario_reset_forgets_records(void) {
    int (*record_stream)(void *, void *) =
        (int (*)(void *, void *))dlsym(RTLD_DEFAULT, "cachealloc_record_stream");
    CHECK(record_stream != NULL);
    cudaStream_t other = NULL;
    void *work = NULL, *a = NULL, *b = NULL, *c = NULL;
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaMalloc(&work, 1 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc(&a, 1 * MIB), cudaSuccess);
    CHECK_CODE(record_stream(a, other), 0);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK_CODE(fakecudart_launch(work, 1 * MIB, other, 1000000), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 1 * MIB), cudaSuccess);
    CHECK(b == a); /* the new segment is mapped where the reset's was */
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&c, 1 * MIB), cudaSuccess);
    CHECK(c == b);
    CHECK_CODE(cudaFree(c), cudaSuccess);
    CHECK_CODE(cudaFree(work), cudaSuccess);
}

/* cachealloc_reset_peak_stats after a cudaDeviceReset: the exit statistics' peaks are those
 * since the call, not the ended pool's larger ones. (The C API, looked up in the preloaded
 * library.) */
static void scenario_reset_peak_after_reset(void) {
    int (*reset_peak)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "cachealloc_reset_peak_stats");
    CHECK(reset_peak != NULL);
    if (reset_peak == NULL) return;
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaSuccess);
    CHECK_CODE(reset_peak(0), 0);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    printf("pid %d\n", (int)getpid()); /* names the exit statistics' file */
}

/* cachealloc_reset_accumulated_stats after a cudaDeviceReset: the exit statistics' totals and
 * counts are those since the call, without the ended pool's; its peaks stay. */
static void scenario_reset_totals_after_reset(void) {
    int (*reset_totals)(int) =
        (int (*)(int))dlsym(RTLD_DEFAULT, "cachealloc_reset_accumulated_stats");
    CHECK(reset_totals != NULL);
    if (reset_totals == NULL) return;
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess); /* p, live, is freed with the pool */
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaSuccess);
    CHECK_CODE(reset_totals(0), 0);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    printf("pid %d\n", (int)getpid()); /* names the exit statistics' file */
}

/* A cudaDeviceReset that fails leaves the memory of the pool cachealloc let go of allocated, and
 * allocations in it still in use: freeing one does nothing (forwarded, a free of a segment's
 * first block would release the segment under the other), and the next reset that happens
 * releases it: from then on such a pointer is the runtime's to refuse. */
static void scenario_reset_fails(void) {
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 1000), cudaSuccess);
    CHECK_CODE(cudaMalloc(&q, 1000), cudaSuccess); /* the same small segment */
    uint64_t in_use = fakecudart_device_bytes_in_use(0);
    CHECK(in_use == 2 * MIB);
    CHECK_CODE(fakecudart_inject_call_failures("cudaDeviceReset", 1, cudaErrorUnknown),
               cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaErrorUnknown);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(0) == in_use); /* q's segment is still there */
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    uint64_t failed = counter("free_failures");
    CHECK_CODE(cudaFree(q), cudaErrorInvalidValue);
    CHECK(counter("free_failures") == failed + 1);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_CODE(cudaMalloc(&p, 1000), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

/* A pointer is freed to the device that owns it, whatever device is current, and allocations
 * happen on the current device without changing it. */
static void scenario_cross_device(void) {
    void *p = NULL, *q = NULL;
    int dev = -1;
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaGetDevice(&dev), cudaSuccess);
    CHECK(dev == 1);
    CHECK(fakecudart_device_bytes_in_use(1) == 0);
    CHECK_CODE(cudaMalloc(&q, 30 * MIB), cudaSuccess); /* device 1's own pool */
    CHECK(fakecudart_device_bytes_in_use(1) >= 30 * MIB);
    CHECK(q != p);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    uint64_t mallocs = counter("mallocs");
    CHECK_CODE(cudaMalloc(&q, 30 * MIB), cudaSuccess); /* device 0 reuses p's block */
    CHECK(q == p);
    CHECK(counter("mallocs") == mallocs);
    CHECK_CODE(cudaGetDevice(&dev), cudaSuccess);
    CHECK(dev == 0);
    CHECK_CODE(cudaFree(q), cudaSuccess);
}

/* free_sync: work issued before a free on stream `s` uses the block for 100 ticks; the next
 * same-sized allocation needs that block. Prints whether the block was reused and whether work
 * on it was still running when it was handed out, and how many device syncs the runtime saw.
 * `program_syncs` 2: the program's cudaDeviceSynchronize fails (900, as during a stream capture)
 * without waiting for anything; 3: it synchronizes device 1, not the block's. */
static void run_reuse(cudaStream_t s, int advance_first, int program_syncs) {
    void *p = NULL, *q = NULL;
    size_t n = 20 * MIB;
    CHECK_CODE(cudaMalloc(&p, n), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, n, s, 100), cudaSuccess);
    uint64_t syncs = counter("device_syncs");
    CHECK_CODE(cudaFree(p), cudaSuccess);
    if (advance_first) fakecudart_advance(1000);
    if (program_syncs == 1) CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    if (program_syncs == 2) {
        CHECK_CODE(fakecudart_inject_call_failures("cudaDeviceSynchronize", 1,
                                                   cudaErrorStreamCaptureUnsupported),
                   cudaSuccess);
        CHECK_CODE(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
        CHECK_CODE(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
    }
    if (program_syncs == 3) {
        CHECK_CODE(cudaSetDevice(1), cudaSuccess);
        CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
        CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    }
    CHECK_CODE(cudaMalloc(&q, n), cudaSuccess);
    printf("reused %d busy %d device_syncs %llu\n", q == p, fakecudart_range_busy(q, n),
           (unsigned long long)(counter("device_syncs") - syncs));
    CHECK_CODE(cudaFree(q), cudaSuccess);
}

static cudaStream_t make_stream(unsigned flags) {
    cudaStream_t s = NULL;
    if (cudaStreamCreateWithFlags(&s, flags) != cudaSuccess) {
        fprintf(stderr, "FAIL cannot create a stream\n");
        failures++;
    }
    return s;
}

static void scenario_reuse_nonblocking(void) {
    run_reuse(make_stream(cudaStreamNonBlocking), 0, 0);
}
static void scenario_reuse_legacy(void) { run_reuse(0, 0, 0); }
static void scenario_reuse_legacy_done(void) { run_reuse(0, 1, 0); }
static void scenario_reuse_after_program_sync(void) {
    run_reuse(make_stream(cudaStreamNonBlocking), 0, 1);
}
static void scenario_reuse_after_failed_sync(void) {
    run_reuse(make_stream(cudaStreamNonBlocking), 0, 2);
}
static void scenario_reuse_after_other_device_sync(void) {
    run_reuse(make_stream(cudaStreamNonBlocking), 0, 3);
}

/* Allocations under a bad configuration fail with 3; frees still forward. */
static void scenario_config_error(void) {
    void *p = NULL, *managed = NULL;
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaErrorInitializationError);
    CHECK_CODE(cudaMalloc(&p, 2 * MIB), cudaErrorInitializationError);
    CHECK_CODE(cudaGetLastError(), cudaErrorInitializationError);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK(counter("mallocs") == 0);
    CHECK_CODE(cudaMallocManaged(&managed, MIB, 1), cudaSuccess);
    CHECK_CODE(cudaFree(managed), cudaSuccess);
    CHECK(counter("frees") == 1);
}

/* Allocate and keep a few blocks, for the exit-time statistics. */
static void scenario_stats(void) {
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 3 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&q, 1000), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    printf("pid %d\n", (int)getpid());
}

/* The runtime's own error passes through unchanged (FAKECUDART_FAIL=35). */
static void scenario_runtime_error(void) {
    void *p = (void *)0x1234;
    CHECK_CODE(cudaMalloc(&p, 1 * MIB), cudaErrorInsufficientDriver);
    CHECK(p == (void *)0x1234);
    CHECK_CODE(cudaGetLastError(), cudaErrorInsufficientDriver);
    CHECK_CODE(cudaFree(NULL), cudaErrorInsufficientDriver);
}

/* A cudaMalloc of the pool's that the runtime refuses with another error than out of memory
 * (here 999) is answered with that error, the thread's last error, not with 2; the next call
 * gets memory. */
static void scenario_malloc_error(void) {
    void *p = (void *)0x1234;
    fakecudart_inject_malloc_failures(1, cudaErrorUnknown);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

/* free_sync:event reuses its events: a hundred frees whose event the pool waited for with a
 * device synchronization (work still running at the next request) create a few events, not
 * one each. Prints how many were created. */
static void scenario_event_reuse(void) {
    uint64_t creates = counter("event_creates");
    for (int i = 0; i < 100; i++) {
        void *p = NULL, *q = NULL;
        CHECK_CODE(cudaMalloc(&p, 20 * MIB), cudaSuccess);
        CHECK_CODE(fakecudart_launch(p, 20 * MIB, 0, 100), cudaSuccess);
        CHECK_CODE(cudaFree(p), cudaSuccess);
        CHECK_CODE(cudaMalloc(&q, 20 * MIB), cudaSuccess);
        CHECK(q == p);
        CHECK_CODE(cudaFree(q), cudaSuccess);
    }
    printf("events created %llu\n", (unsigned long long)(counter("event_creates") - creates));
}

/* cudaMemGetInfo after a block went back to the cache (after the program's synchronization,
 * when `synced`); prints what it reports. */
static void run_mem_info(int synced) {
    void *p = NULL;
    size_t free_bytes = 0, total = 0;
    CHECK_CODE(cudaMalloc(&p, 20 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    if (synced) CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    CHECK(free_bytes <= total);
    printf("free %llu total %llu\n", (unsigned long long)free_bytes, (unsigned long long)total);
}

static void scenario_mem_info(void) { run_mem_info(1); }
static void scenario_mem_info_unsynced(void) { run_mem_info(0); }

#define THREADS 4

static void *thread_churn(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t state = 0x12345678u + (uint64_t)id;
    unsigned char want[4096], got[4096];
    memset(want, id + 1, sizeof want);
    for (int i = 0; i < 3000; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        size_t size = (size_t)(state % 4096) + 1;
        void *p = NULL;
        if (cudaMalloc(&p, size) != cudaSuccess) return (void *)1;
        if (cudaMemcpy(p, want, size, cudaMemcpyHostToDevice) != cudaSuccess) return (void *)2;
        /* Another thread's allocation overlapping this one would overwrite the pattern. */
        if (i % 2 == 0) sched_yield();
        if (cudaMemcpy(got, p, size, cudaMemcpyDeviceToHost) != cudaSuccess) return (void *)3;
        if (memcmp(got, want, size) != 0) return (void *)4;
        if (cudaFree(p) != cudaSuccess) return (void *)5;
    }
    return NULL;
}

/* Threads allocate and free concurrently; no allocation is ever shared. */
static void scenario_threads(void) {
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++)
        CHECK(pthread_create(&threads[t], NULL, thread_churn, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < THREADS; t++) {
        void *result = NULL;
        CHECK(pthread_join(threads[t], &result) == 0);
        CHECK(result == NULL);
    }
}

/* The last error after an out-of-memory answer (FAKECUDART_CAPACITY=64MiB), the same whether
 * the library serves the calls or passes them through (CACHEALLOC_DISABLE=1): 2, shown by
 * cudaPeekAtLastError, returned once by cudaGetLastError; also for a request of SIZE_MAX. */
static void scenario_last_error(void) {
    void *a = NULL, *b = NULL;
    CHECK_CODE(cudaMalloc(&a, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 40 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaPeekAtLastError(), cudaSuccess);
    /* So is a request no device could hold (SIZE_MAX, as a size computed with an underflow
     * gives): 2, the code a caller such as PyTorch recovers from, not a refused argument. */
    b = (void *)0x1234;
    CHECK_CODE(cudaMalloc(&b, SIZE_MAX), cudaErrorMemoryAllocation);
    CHECK(b == (void *)0x1234);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
}

/* CUDA calls made at exit (FAKECUDART_CAPACITY=64MiB), as a C++ static destructor or an atexit
 * handler makes them: by then the thread's thread-local storage is destroyed. main logs first (a
 * failed request: an out-of-memory warning), then the handler asks for a new segment, frees it,
 * runs into an out-of-memory and empties the cache, printing each answer. */
static void at_exit_calls(void) {
    void *late = NULL, *too_big = NULL;
    cudaError_t got = cudaMalloc(&late, 30 * MIB);
    cudaError_t freed = got == cudaSuccess ? cudaFree(late) : cudaErrorInvalidValue;
    cudaError_t oom = cudaMalloc(&too_big, 100 * MIB);
    printf("at exit: malloc %d free %d oom %d\n", (int)got, (int)freed, (int)oom);
    fflush(stdout);
}

static void scenario_at_exit(void) {
    void *a = NULL, *b = NULL;
    CHECK(atexit(at_exit_calls) == 0);
    CHECK_CODE(cudaMalloc(&a, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 40 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaFree(a), cudaSuccess);
}

/* Children forked while the pool holds a live and a cached block: a worker that exits normally
 * without calling CUDA, and one that calls cudaMalloc. The second child's request reaches the
 * runtime (the parent's cached block is not handed out in a process that cannot use it). Both
 * exit through exit(), so their exit hooks run; the test checks that the parent's trace and
 * statistics files are the only ones, written once. */
static void scenario_fork(void) {
    void *a = NULL, *b = NULL;
    int status = -1;
    CHECK_CODE(cudaMalloc(&a, 1 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 3 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    fflush(stdout);
    pid_t worker = fork();
    if (worker == 0) exit(0);
    CHECK(worker > 0);
    CHECK(waitpid(worker, &status, 0) == worker && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pid_t user = fork();
    if (user == 0) {
        uint64_t before = counter("mallocs");
        void *c = NULL;
        int forwarded = cudaMalloc(&c, 3 * MIB) == cudaSuccess && counter("mallocs") == before + 1;
        exit(forwarded ? 0 : 3);
    }
    CHECK(user > 0);
    CHECK(waitpid(user, &status, 0) == user && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_CODE(cudaFree(a), cudaSuccess);
}

/* A child forked after the pool recorded an allocation outlives its parent (an orphaned
 * data-loader worker): it sleeps, its output sent to /dev/null so that the test's read of the
 * parent's output ends with the parent. The test checks, while the child lives, that the trace
 * and statistics files are no longer locked, and then ends the child. */
static void scenario_fork_outlived(void) {
    void *a = NULL;
    CHECK_CODE(cudaMalloc(&a, 1 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(3);
        sleep(60);
        _exit(0);
    }
    CHECK(child > 0);
    printf("child %d\n", (int)child);
}

/* A free followed by the program's own cudaDeviceSynchronize, then the end of the run: the
 * test checks that the exit statistics and the trace show the free completed. */
static void scenario_sync_then_exit(void) {
    void *a = NULL;
    CHECK_CODE(cudaMalloc(&a, 7 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    printf("pid %d\n", (int)getpid());
}

/* A parent that has asked the library something (cudaGetLastError) but made no pool forks a
 * child that allocates: the child keeps cachealloc (a freed block is reused without a second
 * runtime cudaMalloc) and records to its own files, named with its own process id. */
static void scenario_fork_before_pools(void) {
    int status = -1;
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        uint64_t before = counter("mallocs");
        void *c = NULL;
        int ok = cudaMalloc(&c, 3 * MIB) == cudaSuccess && cudaFree(c) == cudaSuccess &&
                 cudaMalloc(&c, 3 * MIB) == cudaSuccess && counter("mallocs") == before + 1 &&
                 cudaFree(c) == cudaSuccess;
        exit(ok ? 0 : 3);
    }
    CHECK(child > 0);
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("child %d\n", (int)child);
}

static const struct scenario scenarios[] = {
    {"at_exit", scenario_at_exit},
    {"fork_before_pools", scenario_fork_before_pools},
    {"sync_then_exit", scenario_sync_then_exit},
    {"fork", scenario_fork},
    {"fork_outlived", scenario_fork_outlived},
    {"last_error", scenario_last_error},
    {"churn", scenario_churn},
    {"oom", scenario_oom},
    {"oom_loop", scenario_oom_loop},
    {"double_free_loop", scenario_double_free_loop},
    {"fragmentation", scenario_fragmentation},
    {"foreign", scenario_foreign},
    {"double_free", scenario_double_free},
    {"ipc", scenario_ipc},
    {"reset", scenario_reset},
    {"reset_fails", scenario_reset_fails},
    {"reset_peak_after_reset", scenario_reset_peak_after_reset},
    {"reset_totals_after_reset", scenario_reset_totals_after_reset},
    {"reset_twice", scenario_reset_twice},
    {"reset_forgets_records", scenario_reset_forgets_records},
    {"cross_device", scenario_cross_device},
    {"reuse_nonblocking", scenario_reuse_nonblocking},
    {"reuse_legacy", scenario_reuse_legacy},
    {"reuse_legacy_done", scenario_reuse_legacy_done},
    {"reuse_after_program_sync", scenario_reuse_after_program_sync},
    {"reuse_after_failed_sync", scenario_reuse_after_failed_sync},
    {"reuse_after_other_device_sync", scenario_reuse_after_other_device_sync},
    {"config_error", scenario_config_error},
    {"stats", scenario_stats},
    {"runtime_error", scenario_runtime_error},
    {"malloc_error", scenario_malloc_error},
    {"event_reuse", scenario_event_reuse},
    {"mem_info", scenario_mem_info},
    {"mem_info_unsynced", scenario_mem_info_unsynced},
    {"threads", scenario_threads},
};

int shim_check_run(const char *name) {
    return run_scenario_named(scenarios, sizeof scenarios / sizeof scenarios[0], name);
}

#ifndef SHIM_CHECK_LIBRARY
int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
        return 2;
    }
    return shim_check_run(argv[1]);
}
#endif
