/*
 * pairs.c — the cost of one cudaMalloc+cudaFree pair of a fixed size, repeated, as a program sees
 * it. Run by benches/shim_overhead.rs (and its bounded test) against the fake libcudart.so.12,
 * with and without libcachealloc.so preloaded.
 *
 *   pairs PAIRS ROUNDS SIZE...
 *
 * For each size: a warm-up pair (with the shim this leaves a cached block, so every timed pair
 * is a cache hit), then ROUNDS rounds of PAIRS pairs, each round timed with
 * clock_gettime(CLOCK_MONOTONIC). Prints the best round per size, then what reached the runtime:
 *   size S pairs P ns_per_pair X
 *   fake_mallocs N fake_device_syncs N fake_implicit_syncs N
 * Any CUDA error prints "FAIL ..." and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int pair(size_t size) {
    void *p = NULL;
    int code = cudaMalloc(&p, size);
    if (code != cudaSuccess) {
        fprintf(stderr, "FAIL cudaMalloc(%zu) returned %d\n", size, code);
        return 0;
    }
    code = cudaFree(p);
    if (code != cudaSuccess) {
        fprintf(stderr, "FAIL cudaFree returned %d\n", code);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4 || atol(argv[1]) <= 0 || atol(argv[2]) <= 0) {
        fprintf(stderr, "usage: %s PAIRS ROUNDS SIZE...\n", argv[0]);
        return 2;
    }
    long pairs = atol(argv[1]);
    long rounds = atol(argv[2]);
    for (int a = 3; a < argc; a++) {
        size_t size = (size_t)strtoull(argv[a], NULL, 10);
        if (!pair(size)) return 1;
        double best = -1;
        for (long r = 0; r < rounds; r++) {
            double start = now_ns();
            for (long i = 0; i < pairs; i++)
                if (!pair(size)) return 1;
            double per_pair = (now_ns() - start) / (double)pairs;
            if (best < 0 || per_pair < best) best = per_pair;
        }
        printf("size %zu pairs %ld ns_per_pair %.1f\n", size, pairs, best);
    }
    printf("fake_mallocs %llu fake_device_syncs %llu fake_implicit_syncs %llu\n",
           (unsigned long long)fakecudart_counter("mallocs"),
           (unsigned long long)fakecudart_counter("device_syncs"),
           (unsigned long long)fakecudart_counter("implicit_syncs"));
    return 0;
}
