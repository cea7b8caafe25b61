/*
 * fork_log.c — a thread of a parent with no pool logs a line at each call (the C API's refusal of
 * a pointer cachealloc does not own, at debug under CACHEALLOC_LOG=debug) while the main thread
 * forks children that log one themselves. A child forked while the parent's thread was writing
 * its line must not wait forever on the writer's lock: each child answers within HANG_SECONDS or
 * dies of SIGALRM. Prints "forks N hung H" and exits 0 when every child answered, 2 at the first
 * one that hung. The library is preloaded: its C API is found with dlsym.
 * Usage: fork_log FORKS
 */
#include <dlfcn.h>
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

typedef int (*free_fn)(void *);

static free_fn cachealloc_free_ptr;
static atomic_int stop = 0;

static void *log_refusals(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) cachealloc_free_ptr((void *)0x20);
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 1000;
    cachealloc_free_ptr = (free_fn)dlsym(RTLD_DEFAULT, "cachealloc_free");
    if (cachealloc_free_ptr == NULL) return 1;
    /* The mode is decided (and the log set up) before the logging thread starts. */
    if (cudaGetLastError() != cudaSuccess) return 1;
    pthread_t logger;
    if (pthread_create(&logger, NULL, log_refusals, NULL) != 0) return 1;
    int hung = 0, done = 0;
    for (; done < forks && hung == 0; done++) {
        pid_t child = fork();
        if (child == 0) {
            alarm(HANG_SECONDS);
            cachealloc_free_ptr((void *)0x30);
            _exit(0);
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child) return 1;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
            hung++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("a child failed (status %d)\n", status);
            return 1;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(logger, NULL);
    printf("forks %d hung %d\n", done, hung);
    return hung ? 2 : 0;
}
