/* Times cudaMalloc/cudaFree pairs, the traffic a caching allocator removes.
 *
 *   malloc_loop PAIRS SIZE_BYTES...
 *
 * For each size: one untimed pair (context creation, first pool segment), then PAIRS timed pairs
 * and a final cudaDeviceSynchronize inside the timing (a deferred free must be paid for).
 * Prints one line per size:  size=BYTES pairs=N ns_per_pair=F
 * On a CUDA error prints     size=BYTES error=CODE name=NAME   and exits 1. */
#include "cudart_subset.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int fail(size_t size, cudaError_t rc) {
    printf("size=%zu error=%d name=%s\n", size, rc, cudaGetErrorName(rc));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PAIRS SIZE_BYTES...\n", argv[0]);
        return 2;
    }
    long pairs = strtol(argv[1], NULL, 10);
    if (pairs <= 0) {
        fprintf(stderr, "PAIRS must be a positive integer, not '%s'\n", argv[1]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        size_t size = strtoull(argv[i], NULL, 10);
        void *p = NULL;
        cudaError_t rc = cudaMalloc(&p, size);
        if (rc != cudaSuccess || (rc = cudaFree(p)) != cudaSuccess)
            return fail(size, rc);

        double start = now_ns();
        for (long n = 0; n < pairs; n++) {
            if ((rc = cudaMalloc(&p, size)) != cudaSuccess || (rc = cudaFree(p)) != cudaSuccess)
                return fail(size, rc);
        }
        if ((rc = cudaDeviceSynchronize()) != cudaSuccess)
            return fail(size, rc);
        printf("size=%zu pairs=%ld ns_per_pair=%.1f\n", size, pairs, (now_ns() - start) / pairs);
    }
    return 0;
}
