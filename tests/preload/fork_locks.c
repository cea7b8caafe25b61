/*
 * fork_locks.c — threads poll cudaMemGetInfo before the process has made any pool (with
 * count_cached_as_free:True each call looks at its device's pool slot under the slot's lock; with
 * trace: each call then takes the trace file's lock) while the main thread forks children that
 * call cudaMalloc. A child forked while a poller held one of those locks must not wait forever
 * on it: each child answers within HANG_SECONDS or dies of SIGALRM. Prints "forks N hung H"
 * and exits 0 when every child answered, 2 at the first one that hung.
 * Usage: fork_locks FORKS
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

#define POLLERS 2

static atomic_int stop = 0;

static void *poll_mem_info(void *arg) {
    cudaSetDevice((int)(long)arg);
    while (!atomic_load(&stop)) {
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 1000;
    /* The mode is decided before the pollers start: only their locks are raced against. */
    if (cudaGetLastError() != cudaSuccess) return 1;
    pthread_t pollers[POLLERS];
    for (long i = 0; i < POLLERS; i++) {
        if (pthread_create(&pollers[i], NULL, poll_mem_info, (void *)(i % 2)) != 0) return 1;
    }
    int hung = 0, failed = 0, done = 0;
    for (; done < forks && hung == 0 && failed == 0; done++) {
        pid_t child = fork();
        if (child == 0) {
            alarm(HANG_SECONDS);
            void *p = NULL;
            _exit(cudaMalloc(&p, 1 << 20) == cudaSuccess ? 0 : 1);
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child) return 1;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
            hung++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < POLLERS; i++) pthread_join(pollers[i], NULL);
    printf("forks %d hung %d failed %d\n", done, hung, failed);
    return hung ? 2 : failed ? 1 : 0;
}
