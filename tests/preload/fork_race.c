/*
 * fork_race.c — one thread makes the process's first CUDA call (cachealloc decides its mode,
 * installs its hooks) while the main thread forks; the child then calls cudaMalloc. A child
 * forked in the middle of that first call must not wait forever on the parent's unfinished
 * initialisation: it answers within HANG_SECONDS or dies of SIGALRM. Exits 0 when the child
 * answered, 2 when it hung, 3 when it died of another signal. The test runs it many times,
 * each a fresh process.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_runtime_api.h"

/* A hang is for ever: ten seconds catch one and leave room for a loaded machine. */
#define HANG_SECONDS 10

static atomic_int go = 0;

static void *first_call(void *arg) {
    (void)arg;
    while (!atomic_load(&go)) {
    }
    cudaGetLastError();
    return NULL;
}

int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, first_call, NULL) != 0) return 1;
    atomic_store(&go, 1);
    /* A varying head start, so that over many runs the fork lands all through the first call. */
    for (volatile int i = 0; i < (getpid() % 200) * 50; i++) {
    }
    pid_t child = fork();
    if (child == 0) {
        alarm(HANG_SECONDS);
        void *p = NULL;
        int rc = cudaMalloc(&p, 1 << 20);
        _exit(rc == 0 || rc == 3 ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    pthread_join(thread, NULL);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
        printf("child hung\n");
        return 2;
    }
    if (WIFSIGNALED(status)) {
        printf("child crashed (signal %d)\n", WTERMSIG(status));
        return 3;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
