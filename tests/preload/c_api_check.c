/*
 * c_api_check.c — a program that links libcachealloc directly (flags from
 * `pkg-config --cflags --libs cachealloc`) and uses the C API from include/cachealloc.h, with the
 * fake libcudart.so.12 as the runtime. Prints "ok c_api" when every check held.
 */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cachealloc.h>

#include "fakecudart.h"

#define MIB ((size_t)1 << 20)

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

/* A thread of its own allocating on cudaStreamPerThread, its own default stream: the address. */
static void *per_thread_malloc(void *arg) {
    void *q = NULL;
    if (cachealloc_malloc(&q, 3 * MIB, 0, cudaStreamPerThread) != 0)
        return arg;
    return q;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    CHECK(strcmp(cachealloc_version(), argv[1]) == 0);

    void *stream = NULL;
    void *p = NULL, *q = NULL, *zero = (void *)0x1;
    CHECK(cachealloc_malloc(&p, 3 * MIB, 0, stream) == 0);
    CHECK(p != NULL);
    CHECK(cachealloc_malloc(&zero, 0, 0, stream) == 0 && zero == NULL);
    CHECK(cachealloc_malloc(NULL, 16, 0, stream) == 1);

    CacheallocStats stats;
    memset(&stats, 0xff, sizeof stats);
    stats.size = sizeof stats;
    CHECK(cachealloc_get_stats(0, &stats) == 0);
    CHECK(stats.size == sizeof stats);
    CHECK(stats.version == CACHEALLOC_STATS_VERSION);
    CHECK(stats.allocated_bytes == 3 * MIB);
    CHECK(stats.allocations == 1);
    CHECK(stats.reserved_bytes == fakecudart_device_bytes_in_use(0));

    /* An older, shorter struct gets only the fields it has. */
    uint64_t old[3] = {0, 0, 0xdeadbeef};
    ((uint32_t *)old)[0] = 16; /* size: header + allocated_bytes */
    CHECK(cachealloc_get_stats(0, (CacheallocStats *)old) == 0);
    CHECK(((uint32_t *)old)[0] == 16);
    CHECK(old[1] == 3 * MIB);
    CHECK(old[2] == 0xdeadbeef);
    stats.size = 4;
    CHECK(cachealloc_get_stats(0, &stats) == 1);
    CHECK(cachealloc_get_stats(0, NULL) == 1);

    /* JSON, snprintf-like. */
    size_t need = cachealloc_stats_json(0, NULL, 0);
    CHECK(need > 100);
    char small[8];
    /* A length of 0 writes nothing, whatever the buffer: the length needed is the answer. */
    memset(small, 'x', sizeof small);
    CHECK(cachealloc_stats_json(0, small, 0) == need);
    CHECK(small[0] == 'x');
    CHECK(cachealloc_stats_json(0, small, sizeof small) == need);
    CHECK(small[7] == '\0' && small[0] == '{');
    char *json = malloc(need + 1);
    CHECK(cachealloc_stats_json(0, json, need + 1) == need);
    CHECK(strlen(json) == need);
    CHECK(strstr(json, "\"allocated_bytes.all.current\":3145728") != NULL);
    free(json);

    /* Free is immediate: the same stream gets the block straight back. */
    CHECK(cachealloc_free(p) == 0);
    CHECK(cachealloc_malloc(&q, 3 * MIB, 0, stream) == 0);
    CHECK(q == p);
    CHECK(cachealloc_free(q) == 0);
    CHECK(cachealloc_free(q) == 1);         /* double free */
    CHECK(cachealloc_free(NULL) == 0);
    int local;
    CHECK(cachealloc_free(&local) == 1);    /* not ours: the C API does not forward */

    /* Another stream does not get that block. */
    void *other = (void *)0x1000;
    CHECK(cachealloc_malloc(&q, 3 * MIB, 0, other) == 0);
    CHECK(q != p);
    CHECK(cachealloc_free(q) == 0);

    /* PyTorch's pluggable-allocator entry points. */
    void *t = cachealloc_torch_malloc(1000, 1, stream);
    CHECK(t != NULL);
    CHECK(fakecudart_device_bytes_in_use(1) > 0);
    cachealloc_torch_free(t, 1000, 1, stream);

    /* Peaks and empty_cache. */
    CHECK(cachealloc_reset_peak_stats(0) == 0);
    stats.size = sizeof stats;
    CHECK(cachealloc_get_stats(0, &stats) == 0);
    CHECK(stats.allocated_bytes_peak == 0);
    CHECK(stats.cached_free_bytes == stats.reserved_bytes);
    /* Running totals and counts, as reset_accumulated_memory_stats: current values stay. */
    CHECK(stats.num_device_alloc > 0);
    uint64_t reserved = stats.reserved_bytes, segments = stats.segments;
    CHECK(cachealloc_reset_accumulated_stats(0) == 0);
    CHECK(cachealloc_get_stats(0, &stats) == 0);
    CHECK(stats.num_device_alloc == 0);
    CHECK(stats.reserved_bytes == reserved);
    char totals[8192];
    CHECK(cachealloc_stats_json(0, totals, sizeof totals) < sizeof totals);
    CHECK(strstr(totals, "\"reserved_bytes.all.allocated\":0,") != NULL);
    CHECK(strstr(totals, "\"allocation.all.freed\":0,") != NULL);
    CHECK(cachealloc_empty_cache(0) == 0);
    CHECK(cachealloc_get_stats(0, &stats) == 0);
    CHECK(segments > 0 && stats.num_device_free == segments);
    CHECK(stats.reserved_bytes == 0);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    /* Ordinals the process does not have (the fake has 2 devices), negative ones included: the
     * runtime's cudaErrorInvalidDevice, as its cudaSetDevice answers, from every call. A failed
     * call makes no pool (device 7 is missing from the exit statistics, checked by the test) and
     * reports by its return code only: the thread's last error stays clear; `*ptr` is left as it
     * was by every failure. */
    void *const untouched = (void *)0x1234;
    void *nowhere = untouched;
    CHECK(cudaGetLastError() == 0);
    CHECK(cachealloc_malloc(&nowhere, 4096, 7, NULL) == 101);
    CHECK(cudaGetLastError() == 0);
    CHECK(cachealloc_malloc(&nowhere, 4096, 2, NULL) == 101); /* one past the last device */
    CHECK(cachealloc_malloc(&nowhere, 0, 7, NULL) == 101);
    CHECK(cachealloc_malloc(&nowhere, 4096, -1, NULL) == 101);
    CHECK(cachealloc_malloc(&nowhere, 4096, INT_MIN, NULL) == 101);
    CHECK(nowhere == untouched);
    CHECK(cachealloc_get_stats(7, &stats) == 101);
    CHECK(cachealloc_get_stats(99, &stats) == 101);
    CHECK(cachealloc_stats_json(7, NULL, 0) == 0);
    CHECK(cachealloc_empty_cache(7) == 101);
    CHECK(cachealloc_reset_peak_stats(5) == 101);
    CHECK(cachealloc_empty_cache(64) == 101);
    CHECK(cachealloc_reset_peak_stats(-1) == 101);
    CHECK(cachealloc_reset_accumulated_stats(7) == 101);
    CHECK(cudaGetLastError() == 0);
    /* Device 1's own statistics, peaks, totals and cache: its pool caches the segment of the
     * freed torch allocation; a reset of its peaks or totals and an empty_cache of it are its
     * own (device 0's count of cudaFree calls stays). */
    CHECK(cachealloc_get_stats(1, &stats) == 0);
    CHECK(stats.allocations == 0 && stats.allocated_bytes_peak > 0);
    CHECK(stats.reserved_bytes > 0 && stats.reserved_bytes == fakecudart_device_bytes_in_use(1));
    CHECK(stats.num_device_alloc == 1);
    CHECK(cachealloc_reset_peak_stats(1) == 0);
    CHECK(cachealloc_reset_accumulated_stats(1) == 0);
    CHECK(cachealloc_get_stats(1, &stats) == 0);
    CHECK(stats.allocated_bytes_peak == 0 && stats.reserved_bytes > 0);
    CHECK(stats.num_device_alloc == 0);
    CHECK(cachealloc_get_stats(0, &stats) == 0);
    CHECK(stats.num_device_free == segments);
    CHECK(cachealloc_empty_cache(1) == 0);
    CHECK(fakecudart_device_bytes_in_use(1) == 0);
    /* An error the program has not read stays its last error through a call that fails inside:
     * the runtime's failed cudaMalloc on the way (the fake has 16 GiB) is the library's own. */
    CHECK(cudaSetDevice(99) == 101);
    CHECK(cachealloc_malloc(&nowhere, (size_t)1 << 40, 0, NULL) == 2);
    CHECK(nowhere == untouched);
    CHECK(cudaPeekAtLastError() == 101);
    CHECK(cudaGetLastError() == 101);
    CHECK(cudaGetLastError() == 0);

    /* A memory fraction: device 0 (16 GiB) limited to a quarter refuses a 5 GiB request, as
     * out of memory; lifted with 1, it serves it. Outside [0, 1]: refused, the limit stays. */
    CHECK(cachealloc_set_memory_fraction(0, 0.25) == 0);
    void *five = untouched;
    CHECK(cachealloc_malloc(&five, 5 * 1024 * MIB, 0, NULL) == 2);
    CHECK(five == untouched);
    CHECK(cachealloc_set_memory_fraction(0, 1.5) == 1);
    CHECK(cachealloc_set_memory_fraction(0, -0.5) == 1);
    CHECK(cachealloc_set_memory_fraction(0, 0.0 / 0.0) == 1);
    CHECK(cachealloc_malloc(&five, 5 * 1024 * MIB, 0, NULL) == 2);
    CHECK(cachealloc_set_memory_fraction(7, 0.5) == 101);
    CHECK(cachealloc_set_memory_fraction(-1, 0.5) == 101);
    CHECK(cudaGetLastError() == 0);
    CHECK(cachealloc_set_memory_fraction(0, 1.0) == 0);
    CHECK(cachealloc_malloc(&five, 5 * 1024 * MIB, 0, NULL) == 0);
    CHECK(cachealloc_free(five) == 0);
    CHECK(cachealloc_empty_cache(0) == 0);

    /* cudaStreamPerThread names each thread's own default stream, whose work is not ordered
     * with another thread's: a block this thread freed on it goes back to this thread's next
     * request on it, not to another thread's while this thread's work still uses it. */
    void *mine = NULL, *again = NULL, *theirs = NULL;
    CHECK(cachealloc_malloc(&mine, 3 * MIB, 0, cudaStreamPerThread) == 0);
    CHECK(fakecudart_launch(mine, 3 * MIB, cudaStreamPerThread, 1000) == 0);
    CHECK(cachealloc_free(mine) == 0);
    CHECK(cachealloc_malloc(&again, 3 * MIB, 0, cudaStreamPerThread) == 0 && again == mine);
    CHECK(cachealloc_free(again) == 0);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, per_thread_malloc, untouched) == 0);
    CHECK(pthread_join(thread, &theirs) == 0);
    CHECK(theirs != untouched && theirs != NULL);
    CHECK(!(theirs == mine && fakecudart_range_busy(mine, 3 * MIB)));
    CHECK(cachealloc_free(theirs) == 0);
    fakecudart_advance(1000);
    CHECK(cachealloc_empty_cache(0) == 0);

    printf("ok c_api\n");
    return 0;
}
