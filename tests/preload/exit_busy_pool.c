/*
 * exit_busy_pool.c — devices 0 and 1 each have a pool when the main thread calls exit() while
 * another thread is inside a cudaMalloc on device 1 that takes thirty seconds (slow_malloc.c,
 * preloaded after the library), its pool's lock held all along: the exit report cannot read
 * device 1.
 * Usage: exit_busy_pool BYTES (BYTES: the slow allocation, SLOW_MALLOC_BYTES or more)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_runtime_api.h"

static size_t slow_bytes;

static void *slow_alloc(void *arg) {
    (void)arg;
    void *p = NULL;
    cudaSetDevice(1);
    cudaMalloc(&p, slow_bytes);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 1;
    slow_bytes = strtoull(argv[1], NULL, 10);
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, 1 << 20) != cudaSuccess) return 1;
    if (cudaSetDevice(1) != cudaSuccess || cudaMalloc(&b, 1 << 20) != cudaSuccess) return 1;
    atomic_int *sleeping = (atomic_int *)dlsym(RTLD_DEFAULT, "slow_malloc_sleeping");
    if (sleeping == NULL) return 1;
    pthread_t slow;
    if (pthread_create(&slow, NULL, slow_alloc, NULL) != 0) return 1;
    /* Once it sleeps, the slow allocation holds device 1's pool lock. */
    for (int waited = 0; !atomic_load(sleeping); waited++) {
        if (waited == 10000) return 1;
        usleep(1000);
    }
    exit(0);
}
