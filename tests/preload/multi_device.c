/*
 * multi_device.c — a program that uses two devices of the fake runtime (FAKECUDART_DEVICES=2,
 * its default) from one or several threads, with libcachealloc.so preloaded: each device's pool
 * keeps to its device, whichever device the calling thread has current. Run by
 * tests/preload_multi_device.rs as `multi_device SCENARIO`; prints "ok SCENARIO" when every check
 * held, "FAIL <file>:<line>: <condition>" for one that did not.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define MIB ((size_t)1 << 20)

#include "check.h"

static int current(void) {
    int dev = -1;
    return cudaGetDevice(&dev) == cudaSuccess ? dev : -1;
}

/* cudaMemGetInfo's free bytes of `dev`, asked with `dev` current; the current device is put
 * back. */
static size_t free_on(int dev) {
    int was = current();
    size_t free_bytes = 0, total = 0;
    if (cudaSetDevice(dev) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess)
        free_bytes = 0;
    cudaSetDevice(was);
    return free_bytes;
}

/* Device 1's allocation, freed while device 0 is current, goes back to device 1's pool without
 * changing the current device. Under free_sync:device (with count_cached_as_free:True, which
 * shows the block once it is reusable) it waits for a synchronization of device 1, which the
 * work of a stream of device 1 still uses it for: device 0's cudaDeviceSynchronize does not
 * complete it. Device 0 never gets its memory. */
static void scenario_free_other_device(void) {
    void *p = NULL, *q = NULL;
    cudaStream_t s = NULL;
    size_t n = 20 * MIB;
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, n), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, n, s, 100), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    size_t before = free_on(1);
    uint64_t syncs = fakecudart_counter("device_syncs");
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK(current() == 0);
    CHECK(fakecudart_counter("device_syncs") == syncs); /* nothing waited for */
    CHECK(free_on(1) == before);                        /* pending */
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);   /* device 0's */
    CHECK(free_on(1) == before);                        /* still pending */
    CHECK(fakecudart_range_busy(p, n));
    CHECK_CODE(cudaMalloc(&q, n), cudaSuccess); /* device 0's own memory */
    CHECK(q != p);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK(!fakecudart_range_busy(p, n));
    CHECK(free_on(1) == before + n); /* reusable now */
    uint64_t mallocs = fakecudart_counter("mallocs");
    CHECK_CODE(cudaMalloc(&q, n), cudaSuccess);
    CHECK(q == p);
    CHECK(fakecudart_counter("mallocs") == mallocs);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK(current() == 0);
}

struct on_device {
    int device;     /* made current by the thread */
    void *ptr;      /* its allocation */
    int after;      /* its current device after the allocation */
    cudaError_t rc; /* the allocation's answer */
};

static void *allocate_on(void *arg) {
    struct on_device *t = arg;
    t->rc = cudaSetDevice(t->device);
    if (t->rc == cudaSuccess) t->rc = cudaMalloc(&t->ptr, 30 * MIB);
    t->after = current();
    return NULL;
}

/* Each thread allocates on its own current device, set with cudaSetDevice after other threads
 * used the other device; no thread's current device changes another's. */
static void scenario_threads_own_devices(void) {
    void *p0 = NULL;
    pthread_t th;
    CHECK_CODE(cudaMalloc(&p0, 5 * MIB), cudaSuccess); /* device 0, never set */
    struct on_device one = {1, NULL, -1, cudaErrorUnknown};
    CHECK(pthread_create(&th, NULL, allocate_on, &one) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_CODE(one.rc, cudaSuccess);
    CHECK(one.after == 1);
    CHECK(current() == 0);
    CHECK(fakecudart_device_bytes_in_use(0) == 20 * MIB); /* one large segment */
    CHECK(fakecudart_device_bytes_in_use(1) == 30 * MIB);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    struct on_device zero = {0, NULL, -1, cudaErrorUnknown};
    CHECK(pthread_create(&th, NULL, allocate_on, &zero) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_CODE(zero.rc, cudaSuccess);
    CHECK(zero.after == 0);
    CHECK(current() == 1);
    CHECK(fakecudart_device_bytes_in_use(0) == 50 * MIB);
    CHECK(fakecudart_device_bytes_in_use(1) == 30 * MIB);
    CHECK_CODE(cudaFree(one.ptr), cudaSuccess);
    CHECK_CODE(cudaFree(zero.ptr), cudaSuccess);
    CHECK_CODE(cudaFree(p0), cudaSuccess);
    CHECK(current() == 1);
}

/* cudaMemGetInfo with count_cached_as_free:True (and free_sync:none) adds the current device's
 * cached bytes only. */
static void scenario_mem_info_per_device(void) {
    void *p = NULL;
    size_t before0 = free_on(0), before1 = free_on(1);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(free_on(1) == before1 - 30 * MIB);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK(free_on(1) == before1); /* cached, counted as free */
    CHECK(free_on(0) == before0); /* not device 0's */
    CHECK(fakecudart_device_bytes_in_use(1) == 30 * MIB);
}

/* A reset of device 0 ends device 0's pool only: device 1's allocations stay, and free (with
 * either device current) to device 1's pool, which serves again from its cache. */
static void scenario_reset_keeps_other_device(void) {
    void *a = NULL, *b = NULL, *p0 = NULL;
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc(&a, 3 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 3 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p0, 3 * MIB), cudaSuccess);
    size_t in_use1 = fakecudart_device_bytes_in_use(1);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK(fakecudart_device_bytes_in_use(1) == in_use1);
    CHECK_CODE(cudaMemset(a, 1, 3 * MIB), cudaSuccess); /* still device memory */
    CHECK_CODE(cudaFree(a), cudaSuccess);               /* device 0 current */
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaFree(p0), cudaErrorInvalidValue); /* gone with the reset: the runtime's */
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    uint64_t mallocs = fakecudart_counter("mallocs");
    CHECK_CODE(cudaMalloc(&a, 3 * MIB), cudaSuccess);
    CHECK(fakecudart_counter("mallocs") == mallocs);
    CHECK(fakecudart_device_bytes_in_use(1) == in_use1);
    CHECK_CODE(cudaFree(a), cudaSuccess);
}

/* Device 1 runs out of memory (FAKECUDART_CAPACITY=100MiB) while device 0 caches 40 MiB: device
 * 1's retry releases its own cache only, and the error is device 1's. */
static void scenario_oom_other_device(void) {
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_CODE(cudaMalloc(&a, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&c, 70 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK(fakecudart_device_bytes_in_use(0) == 40 * MIB); /* device 0's cache untouched */
    CHECK(fakecudart_device_bytes_in_use(1) == 40 * MIB); /* the 30 MiB segment released */
    CHECK(current() == 1);
    CHECK_CODE(cudaFree(b), cudaSuccess);
}

/* Allocations and frees on both devices, a free of each device's pointer with the other device
 * current, and a synchronization of device 1 only (for a recording and the exit report). */
static void scenario_two_devices(void) {
    void *a = NULL, *b = NULL;
    CHECK_CODE(cudaMalloc(&a, 5 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 7 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 7 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
}

static size_t slow_bytes;

/* Device 0's allocation that takes thirty seconds (slow_malloc.c), its pool's lock held. */
static void *slow_alloc(void *arg) {
    (void)arg;
    void *p = NULL;
    cudaSetDevice(0);
    cudaMalloc(&p, slow_bytes);
    return NULL;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* While another thread is inside a slow allocation of device 0's pool, this thread frees and
 * allocates device 1's memory (as a thread per device does): it does not wait for device 0's
 * pool, which has nothing to do with it. Prints how long the calls took. (The process then
 * exits with the slow thread still inside its allocation.) */
static void scenario_free_while_other_device_busy(void) {
    const char *bytes = getenv("SLOW_MALLOC_BYTES");
    CHECK(bytes != NULL);
    slow_bytes = strtoull(bytes, NULL, 10);
    atomic_int *sleeping = (atomic_int *)dlsym(RTLD_DEFAULT, "slow_malloc_sleeping");
    CHECK(sleeping != NULL);
    void *a = NULL, *b = NULL;
    CHECK_CODE(cudaMalloc(&a, MIB), cudaSuccess); /* device 0 has a pool */
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, MIB), cudaSuccess);
    pthread_t slow;
    CHECK(pthread_create(&slow, NULL, slow_alloc, NULL) == 0);
    for (int waited = 0; !atomic_load(sleeping); waited++) {
        CHECK(waited < 10000);
        usleep(1000);
    }
    double start = seconds();
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, MIB), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    printf("device 1 calls took %.3f s\n", seconds() - start);
    CHECK(*sleeping); /* device 0's pool was busy all along */
}

static const struct scenario scenarios[] = {
    {"free_other_device", scenario_free_other_device},
    {"threads_own_devices", scenario_threads_own_devices},
    {"mem_info_per_device", scenario_mem_info_per_device},
    {"reset_keeps_other_device", scenario_reset_keeps_other_device},
    {"oom_other_device", scenario_oom_other_device},
    {"two_devices", scenario_two_devices},
    {"free_while_other_device_busy", scenario_free_while_other_device_busy},
};

SCENARIO_MAIN(scenarios)
