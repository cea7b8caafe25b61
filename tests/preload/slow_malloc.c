/*
 * slow_malloc.c — a library preloaded after libcachealloc.so, so that its cudaMalloc is the one
 * the pool calls (the next in the search order), with the device's pool lock held: a request of
 * at least SLOW_MALLOC_BYTES sleeps thirty seconds before it goes on to the runtime. The program
 * sees `slow_malloc_sleeping` (found with dlsym) set while it sleeps.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_runtime_api.h"

typedef cudaError_t (*malloc_fn)(void **, size_t);

atomic_int slow_malloc_sleeping = 0;

cudaError_t cudaMalloc(void **p, size_t size) {
    malloc_fn next = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    const char *slow = getenv("SLOW_MALLOC_BYTES");
    if (slow != NULL && size >= strtoull(slow, NULL, 10)) {
        atomic_store(&slow_malloc_sleeping, 1);
        sleep(30);
        atomic_store(&slow_malloc_sleeping, 0);
    }
    return next(p, size);
}
