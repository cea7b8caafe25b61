/*
 * stress.c — many threads calling cudaMalloc/cudaFree at once through libcachealloc.so
 * (preloaded) in front of the fake libcudart.so.12. Run by tests/preload_stress.rs and, for long
 * runs, by scripts/stress-long.sh.
 *
 *   stress [OPS_PER_THREAD]      (default 10000; 8 threads)
 *
 * Each thread performs OPS_PER_THREAD operations: a cudaMalloc into an empty slot of its own
 * table (sizes 512 B to 64 MiB, mostly small) or a cudaFree of a live pointer of its own. Some
 * pointers are handed to other threads through a shared queue and freed there, possibly while
 * another device is current. Threads switch between devices 0 and 1 with cudaSetDevice and now
 * and then call cudaDeviceSynchronize.
 *
 * Sharing detection: every allocation gets a pattern derived from a process-wide unique tag at
 * both ends (cudaMemcpy), some small ones are filled entirely (cudaMemset), and some live ones are
 * written again later. Before a pointer is freed, the pattern is read back; a difference means two
 * live allocations shared memory and is counted as an overlap. cudaPointerGetAttributes checks
 * now and then that a pointer lies on the device that was current when it was allocated.
 *
 * At the end every pointer has been freed. The program prints its counts and the fake's view:
 *   mallocs N frees N cross_frees N ooms N syncs N overlaps N errors N
 *   device0_bytes B device1_bytes B fake_mallocs N fake_frees N
 *   device0_free B device0_total B   (and device1_...: cudaMemGetInfo after a final
 *                                     cudaDeviceSynchronize of each device)
 * and "ok stress" when no overlap or error was seen and every pointer was freed (exit 0).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define THREADS 8
#define DEVICES 2
#define SLOTS 48              /* live allocations a thread holds at most */
#define QUEUE_CAPACITY 1024   /* pointers in flight between threads */
#define END_BYTES 64          /* pattern bytes at each end of an allocation */
#define FILL_LIMIT (64 << 10) /* allocations up to 64 KiB may be filled entirely */
#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define REPORT_LIMIT 10 /* failure lines printed at most */

struct allocation {
    unsigned char *ptr;
    size_t size;
    int device; /* current device at allocation time */
    uint64_t tag;
    int filled; /* the whole range holds fill_byte(tag) between the ends */
};

static atomic_uint_fast64_t next_tag = 1;
static atomic_uint_fast64_t mallocs_ok, frees_ok, cross_frees, ooms, syncs, overlaps, errors;
static atomic_int reports;

static struct {
    pthread_mutex_t lock;
    struct allocation items[QUEUE_CAPACITY];
    size_t count;
} queue = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void report(const char *fmt, const char *what, long long a, long long b) {
    if (atomic_fetch_add(&reports, 1) < REPORT_LIMIT) {
        fprintf(stderr, fmt, what, a, b);
        fputc('\n', stderr);
    }
}

static void error_code(const char *call, int code) {
    atomic_fetch_add(&errors, 1);
    report("FAIL %s returned %lld (%lld)", call, code, 0);
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte `offset` of the end pattern of allocation `tag`. */
static unsigned char pattern_byte(uint64_t tag, size_t offset) {
    uint64_t m = mix(tag);
    return (unsigned char)((m >> ((offset & 7) * 8)) ^ (offset >> 3));
}

static unsigned char fill_byte(uint64_t tag) { return (unsigned char)(mix(~tag) | 1); }

static uint64_t next_random(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* 512 B to 64 MiB, mostly small: 75% in [512 B, 64 KiB), 20% in [64 KiB, 4 MiB), 5% in
 * [4 MiB, 64 MiB), each range log-uniform by power of two. */
static size_t random_size(uint64_t *rng) {
    uint64_t r = next_random(rng) % 100;
    unsigned lo_shift = 9, hi_shift = 16;
    if (r >= 95) {
        lo_shift = 22;
        hi_shift = 26;
    } else if (r >= 75) {
        lo_shift = 16;
        hi_shift = 22;
    }
    unsigned shift = lo_shift + (unsigned)(next_random(rng) % (hi_shift - lo_shift));
    return ((size_t)1 << shift) + (size_t)(next_random(rng) % ((size_t)1 << shift));
}

/* The pattern bytes of [offset, offset + n) into buf. */
static void make_pattern(unsigned char *buf, uint64_t tag, size_t offset, size_t n) {
    for (size_t i = 0; i < n; i++) buf[i] = pattern_byte(tag, offset + i);
}

static size_t end_bytes(const struct allocation *a) {
    return a->size < END_BYTES ? a->size : END_BYTES;
}

/* Writes the end patterns (head, then tail). */
static void write_ends(const struct allocation *a) {
    unsigned char buf[END_BYTES];
    size_t n = end_bytes(a);
    make_pattern(buf, a->tag, 0, n);
    int code = cudaMemcpy(a->ptr, buf, n, cudaMemcpyHostToDevice);
    if (code != cudaSuccess) error_code("cudaMemcpy (head)", code);
    size_t tail = a->size - n;
    make_pattern(buf, a->tag, tail, n);
    code = cudaMemcpy(a->ptr + tail, buf, n, cudaMemcpyHostToDevice);
    if (code != cudaSuccess) error_code("cudaMemcpy (tail)", code);
}

/* Reads the allocation back and counts an overlap if anything differs from what was written. */
static void check_pattern(const struct allocation *a, unsigned char *scratch) {
    size_t n = end_bytes(a);
    size_t spans[2] = {0, a->size - n};
    for (int s = 0; s < 2; s++) {
        int code = cudaMemcpy(scratch, a->ptr + spans[s], n, cudaMemcpyDeviceToHost);
        if (code != cudaSuccess) {
            error_code("cudaMemcpy (check)", code);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            if (scratch[i] != pattern_byte(a->tag, spans[s] + i)) {
                atomic_fetch_add(&overlaps, 1);
                report("FAIL %s: pattern of allocation %lld differs at offset %lld", "overlap",
                       (long long)a->tag, (long long)(spans[s] + i));
                return;
            }
        }
    }
    if (a->filled && a->size > 2 * n) {
        size_t middle = a->size - 2 * n;
        int code = cudaMemcpy(scratch, a->ptr + n, middle, cudaMemcpyDeviceToHost);
        if (code != cudaSuccess) {
            error_code("cudaMemcpy (check fill)", code);
            return;
        }
        unsigned char want = fill_byte(a->tag);
        for (size_t i = 0; i < middle; i++) {
            if (scratch[i] != want) {
                atomic_fetch_add(&overlaps, 1);
                report("FAIL %s: fill of allocation %lld differs at offset %lld", "overlap",
                       (long long)a->tag, (long long)(n + i));
                return;
            }
        }
    }
}

static int allocate(struct allocation *a, uint64_t *rng, int device) {
    size_t size = random_size(rng);
    void *p = NULL;
    int code = cudaMalloc(&p, size);
    if (code == cudaErrorMemoryAllocation) {
        atomic_fetch_add(&ooms, 1);
        cudaGetLastError();
        return 0;
    }
    if (code != cudaSuccess || p == NULL || (uintptr_t)p % 512 != 0) {
        error_code("cudaMalloc", code);
        return 0;
    }
    atomic_fetch_add(&mallocs_ok, 1);
    *a = (struct allocation){p, size, device, atomic_fetch_add(&next_tag, 1), 0};
    if (size <= FILL_LIMIT && next_random(rng) % 4 == 0) {
        code = cudaMemset(p, fill_byte(a->tag), size);
        if (code != cudaSuccess) error_code("cudaMemset", code);
        a->filled = 1;
    }
    write_ends(a);
    if (next_random(rng) % 8 == 0) {
        struct cudaPointerAttributes attr;
        code = cudaPointerGetAttributes(&attr, p);
        if (code != cudaSuccess) {
            error_code("cudaPointerGetAttributes", code);
        } else if (attr.device != device) {
            atomic_fetch_add(&errors, 1);
            report("FAIL %s: allocated on device %lld, lies on device %lld", "cudaMalloc",
                   device, attr.device);
        }
    }
    return 1;
}

/* Checks the pattern, then frees. */
static void release(const struct allocation *a, unsigned char *scratch) {
    check_pattern(a, scratch);
    int code = cudaFree(a->ptr);
    if (code != cudaSuccess)
        error_code("cudaFree", code);
    else
        atomic_fetch_add(&frees_ok, 1);
}

static int queue_push(const struct allocation *a) {
    pthread_mutex_lock(&queue.lock);
    int pushed = queue.count < QUEUE_CAPACITY;
    if (pushed) queue.items[queue.count++] = *a;
    pthread_mutex_unlock(&queue.lock);
    return pushed;
}

static int queue_pop(struct allocation *a) {
    pthread_mutex_lock(&queue.lock);
    int popped = queue.count > 0;
    if (popped) *a = queue.items[--queue.count];
    pthread_mutex_unlock(&queue.lock);
    return popped;
}

static long ops_per_thread = 10000;
static uint64_t base_seed = 1;

static void *worker(void *arg) {
    int index = (int)(intptr_t)arg;
    uint64_t rng = mix(base_seed * 1000003u + (uint64_t)index) | 1;
    unsigned char *scratch = malloc(FILL_LIMIT);
    struct allocation live[SLOTS];
    memset(live, 0, sizeof live);
    int device = index % DEVICES;
    int code = cudaSetDevice(device);
    if (code != cudaSuccess) error_code("cudaSetDevice", code);

    for (long op = 0; op < ops_per_thread; op++) {
        uint64_t r = next_random(&rng);
        if (r % 1000 == 7) {
            code = cudaDeviceSynchronize();
            if (code != cudaSuccess) error_code("cudaDeviceSynchronize", code);
            atomic_fetch_add(&syncs, 1);
        }
        if (r % 100 == 3) {
            device = (device + 1) % DEVICES;
            code = cudaSetDevice(device);
            if (code != cudaSuccess) error_code("cudaSetDevice", code);
        }
        struct allocation other;
        if (r % 50 == 11 && queue_pop(&other)) {
            release(&other, scratch);
            atomic_fetch_add(&cross_frees, 1);
        }
        if (r % 16 == 5) {
            /* Write a live allocation's pattern again (unchanged content). */
            struct allocation *a = &live[(r >> 20) % SLOTS];
            if (a->ptr) write_ends(a);
        }
        struct allocation *a = &live[next_random(&rng) % SLOTS];
        if (a->ptr == NULL) {
            allocate(a, &rng, device);
        } else {
            if (next_random(&rng) % 40 != 0 || !queue_push(a)) release(a, scratch);
            a->ptr = NULL;
        }
    }
    for (int s = 0; s < SLOTS; s++)
        if (live[s].ptr) release(&live[s], scratch);
    free(scratch);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) ops_per_thread = atol(argv[1]);
    if (ops_per_thread <= 0) {
        fprintf(stderr, "usage: %s [OPS_PER_THREAD > 0]\n", argv[0]);
        return 2;
    }
    const char *seed = getenv("STRESS_SEED");
    if (seed) base_seed = strtoull(seed, NULL, 10);

    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
        if (pthread_create(&threads[t], NULL, worker, (void *)(intptr_t)t) != 0) {
            fprintf(stderr, "FAIL pthread_create\n");
            return 1;
        }
    }
    for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);

    /* Pointers still queued: freed here, by a thread that allocated none of them. */
    unsigned char *scratch = malloc(FILL_LIMIT);
    struct allocation a;
    while (queue_pop(&a)) {
        release(&a, scratch);
        atomic_fetch_add(&cross_frees, 1);
    }
    free(scratch);

    /* Frees whose fence is pending under free_sync device/event complete with a synchronization
     * of each device; cudaMemGetInfo then returns them to their pools when the shim counts cached
     * blocks as free (count_cached_as_free:True), and reports all memory free again. */
    size_t free_bytes[DEVICES] = {0}, total_bytes[DEVICES] = {0};
    for (int d = 0; d < DEVICES; d++) {
        int code = cudaSetDevice(d);
        if (code == cudaSuccess) code = cudaDeviceSynchronize();
        if (code == cudaSuccess) code = cudaMemGetInfo(&free_bytes[d], &total_bytes[d]);
        if (code != cudaSuccess) error_code("synchronize and cudaMemGetInfo at the end", code);
    }

    unsigned long long m = mallocs_ok, f = frees_ok;
    printf("mallocs %llu frees %llu cross_frees %llu ooms %llu syncs %llu overlaps %llu errors "
           "%llu\n",
           m, f, (unsigned long long)cross_frees, (unsigned long long)ooms,
           (unsigned long long)syncs, (unsigned long long)overlaps, (unsigned long long)errors);
    printf("device0_bytes %llu device1_bytes %llu fake_mallocs %llu fake_frees %llu\n",
           (unsigned long long)fakecudart_device_bytes_in_use(0),
           (unsigned long long)fakecudart_device_bytes_in_use(1),
           (unsigned long long)fakecudart_counter("mallocs"),
           (unsigned long long)fakecudart_counter("frees"));
    for (int d = 0; d < DEVICES; d++)
        printf("device%d_free %llu device%d_total %llu\n", d, (unsigned long long)free_bytes[d], d,
               (unsigned long long)total_bytes[d]);
    int ok = overlaps == 0 && errors == 0 && m == f;
    if (m != f) fprintf(stderr, "FAIL %llu allocations but %llu frees\n", m, f);
    if (ok) printf("ok stress\n");
    fflush(stdout);
    return ok ? 0 : 1;
}
