/* Out of memory and recovery: allocate CHUNK_BYTES at a time until cudaMalloc answers 2
 * (cudaErrorMemoryAllocation), then check the program can carry on as PyTorch does: clear the
 * sticky error with cudaGetLastError, free one chunk, allocate it again, free everything and
 * allocate once more.
 *
 *   oom_check CHUNK_BYTES MAX_CHUNKS [touch] [fraction=F]
 *
 * With `touch`, every chunk is written with cudaMemset as soon as it is allocated (memory the
 * device cannot write, such as pages mapped without access, fails there: touch_rc=E, exit 1).
 * With `fraction=F`, the program first limits device 0 to F of its memory with the preloaded
 * library's cachealloc_set_memory_fraction (found with dlsym, as a program that does not link
 * the library finds it) and prints  limit=L  (F × the total cudaMemGetInfo reports) before the
 * rest.
 *
 * Prints  chunks=N oom_rc=2 last_error=E realloc=0 after_free_all=0  and exits 0 when every
 * step after the OOM succeeded; exits 1 (with what went wrong) otherwise. E is 2 when the last
 * error is the one a failed cudaMalloc leaves (the runtime's, and under the shim its own). */
#include "cudart_subset.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int touch = 0;
    double fraction = -1.0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "touch") == 0)
            touch = 1;
        else if (strncmp(argv[i], "fraction=", 9) == 0)
            fraction = strtod(argv[i] + 9, NULL);
        else
            argc = 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s CHUNK_BYTES MAX_CHUNKS [touch] [fraction=F]\n", argv[0]);
        return 2;
    }
    size_t chunk = strtoull(argv[1], NULL, 10);
    long max_chunks = strtol(argv[2], NULL, 10);
    if (chunk == 0 || max_chunks <= 0) {
        fprintf(stderr, "CHUNK_BYTES and MAX_CHUNKS must be positive integers\n");
        return 2;
    }
    if (fraction >= 0.0) {
        int (*set_fraction)(int, double) =
            (int (*)(int, double))dlsym(RTLD_DEFAULT, "cachealloc_set_memory_fraction");
        size_t free_bytes = 0, total = 0;
        if (set_fraction == NULL) {
            printf("no cachealloc_set_memory_fraction in the process "
                   "(is the library preloaded?)\n");
            return 1;
        }
        cudaError_t info_rc = cudaMemGetInfo(&free_bytes, &total);
        int set_rc = set_fraction(0, fraction);
        if (info_rc != cudaSuccess || set_rc != 0) {
            printf("cudaMemGetInfo=%d cachealloc_set_memory_fraction=%d\n", info_rc, set_rc);
            return 1;
        }
        printf("limit=%.0f ", fraction * (double)total);
    }
    void **chunks = calloc((size_t)max_chunks, sizeof *chunks);
    if (chunks == NULL)
        return 2;

    long n = 0;
    cudaError_t rc = cudaSuccess;
    while (n < max_chunks && (rc = cudaMalloc(&chunks[n], chunk)) == cudaSuccess) {
        cudaError_t touch_rc = touch ? cudaMemset(chunks[n], 0x5a, chunk) : cudaSuccess;
        if (touch_rc == cudaSuccess)
            touch_rc = touch ? cudaDeviceSynchronize() : cudaSuccess;
        if (touch_rc != cudaSuccess) {
            printf("chunks=%ld touch_rc=%d name=%s\n", n, touch_rc, cudaGetErrorName(touch_rc));
            return 1;
        }
        n++;
    }
    if (rc != cudaErrorMemoryAllocation) {
        printf("chunks=%ld no_oom rc=%d name=%s\n", n, rc, cudaGetErrorName(rc));
        return 1;
    }
    cudaError_t last_error = cudaGetLastError(); /* forgive and clear, as PyTorch does */

    cudaError_t realloc_rc = cudaErrorMemoryAllocation;
    if (n > 0 && cudaFree(chunks[n - 1]) == cudaSuccess)
        realloc_rc = cudaMalloc(&chunks[n - 1], chunk);

    cudaError_t free_all_rc = cudaSuccess;
    for (long i = 0; i < n; i++) {
        cudaError_t r = cudaFree(chunks[i]);
        if (r != cudaSuccess)
            free_all_rc = r;
    }
    void *again = NULL;
    cudaError_t after_rc = free_all_rc != cudaSuccess ? free_all_rc : cudaMalloc(&again, chunk);
    if (after_rc == cudaSuccess)
        cudaFree(again);

    printf("chunks=%ld oom_rc=%d last_error=%d realloc=%d after_free_all=%d\n", n, rc, last_error,
           realloc_rc, after_rc);
    free(chunks);
    return realloc_rc == cudaSuccess && after_rc == cudaSuccess ? 0 : 1;
}
