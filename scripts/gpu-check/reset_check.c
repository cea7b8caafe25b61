/* A device reset under the shim with expandable segments (run with LD_PRELOAD=libcachealloc.so
 * and CACHEALLOC_CONF=expandable_segments:True): the reset ends the device's pool, and the
 * memory of its expandable segments, which a reset does not free (the driver's virtual-memory
 * calls made it), must have been given back by cachealloc before it.
 *
 *   reset_check CHUNK_BYTES CHUNKS
 *
 * Notes the free memory cudaMemGetInfo reports at the start, allocates CHUNKS chunks and writes
 * each with cudaMemset, frees every other one, calls cudaDeviceReset and notes the free memory
 * again (both readings are taken in a context that has done nothing else yet), then allocates
 * and writes one chunk more.
 *
 * Prints  total=T start_free=A chunks=N freed=F reset_rc=0 reset_free=B again_rc=0  and exits 0
 * when every call succeeded; exits 1 (with what went wrong) otherwise. Whether B is back at A is
 * for the caller to judge. */
#include "cudart_subset.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s CHUNK_BYTES CHUNKS\n", argv[0]);
        return 2;
    }
    size_t chunk = strtoull(argv[1], NULL, 10);
    long count = strtol(argv[2], NULL, 10);
    if (chunk == 0 || count <= 0) {
        fprintf(stderr, "CHUNK_BYTES and CHUNKS must be positive integers\n");
        return 2;
    }
    void **chunks = calloc((size_t)count, sizeof *chunks);
    if (chunks == NULL)
        return 2;

    size_t start_free = 0, total = 0;
    cudaError_t rc = cudaMemGetInfo(&start_free, &total);
    if (rc != cudaSuccess) {
        printf("cudaMemGetInfo at the start answered %d (%s)\n", rc, cudaGetErrorName(rc));
        return 1;
    }
    for (long i = 0; i < count; i++) {
        if ((rc = cudaMalloc(&chunks[i], chunk)) != cudaSuccess ||
            (rc = cudaMemset(chunks[i], 0x5a, chunk)) != cudaSuccess) {
            printf("chunk %ld of %ld: %d (%s)\n", i + 1, count, rc, cudaGetErrorName(rc));
            return 1;
        }
    }
    if ((rc = cudaDeviceSynchronize()) != cudaSuccess) {
        printf("cudaDeviceSynchronize answered %d (%s)\n", rc, cudaGetErrorName(rc));
        return 1;
    }
    long freed = 0;
    for (long i = 1; i < count; i += 2, freed++) {
        if ((rc = cudaFree(chunks[i])) != cudaSuccess) {
            printf("cudaFree of chunk %ld answered %d (%s)\n", i + 1, rc, cudaGetErrorName(rc));
            return 1;
        }
    }
    /* The chunks still allocated end with the reset: they are not freed after it. */
    cudaError_t reset_rc = cudaDeviceReset();
    size_t reset_free = 0, reset_total = 0;
    cudaError_t info_rc = cudaMemGetInfo(&reset_free, &reset_total);

    void *again = NULL;
    cudaError_t again_rc = cudaMalloc(&again, chunk);
    if (again_rc == cudaSuccess)
        again_rc = cudaMemset(again, 0x5a, chunk);
    if (again_rc == cudaSuccess)
        again_rc = cudaDeviceSynchronize();
    cudaError_t free_rc = again != NULL ? cudaFree(again) : cudaSuccess;
    if (again_rc == cudaSuccess)
        again_rc = free_rc;

    printf("total=%zu start_free=%zu chunks=%ld freed=%ld reset_rc=%d reset_free=%zu "
           "again_rc=%d\n",
           total, start_free, count, freed, reset_rc, reset_free, again_rc);
    if (info_rc != cudaSuccess)
        printf("cudaMemGetInfo after the reset answered %d (%s)\n", info_rc,
               cudaGetErrorName(info_rc));
    free(chunks);
    return reset_rc == cudaSuccess && info_rc == cudaSuccess && again_rc == cudaSuccess ? 0 : 1;
}
