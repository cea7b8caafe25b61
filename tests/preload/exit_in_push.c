/*
 * exit_in_push.c — exit() called from inside a cudaMalloc while the library holds its event
 * buffer's lock, as a signal handler that calls exit() does when its signal lands there: the
 * program's own clock_gettime (it comes before the C library's) calls exit() the first time it
 * is called once armed, and with a recording on, a cudaMalloc served from the cache calls it
 * once, to time its `alloc` event, under that lock. Run with CACHEALLOC_CONF=trace:PATH.
 * Prints "ok exit_in_push" just before that exit.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_runtime_api.h"

static volatile int armed;

int clock_gettime(clockid_t clock, struct timespec *now) {
    static int (*real)(clockid_t, struct timespec *);
    if (real == NULL)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (armed) {
        armed = 0; /* the exit handler reads the clock too */
        printf("ok exit_in_push\n");
        fflush(stdout);
        exit(0);
    }
    return real(clock, now);
}

int main(void) {
    void *p = NULL;
    /* The segment and a cached block; the file is created with these lines. */
    for (int i = 0; i < 2; i++) {
        if (cudaMalloc(&p, 1000) != cudaSuccess || cudaFree(p) != cudaSuccess)
            return 1;
    }
    armed = 1;
    cudaMalloc(&p, 1000);
    fprintf(stderr, "the clock was not read in cudaMalloc\n");
    return 1;
}
