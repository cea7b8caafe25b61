/*
 * fork_lookup.c — a program with no CUDA runtime loaded (built without one), so that every
 * interposed call makes cachealloc look the runtime up through the dynamic loader again
 * (`dlopen` with RTLD_NOLOAD of each runtime's name, which reads the loader's cache). Four
 * threads call cudaGetLastError in a loop while the main thread forks children that call
 * cudaMalloc, which looks the runtime up in the child. A child forked in the middle of a
 * parent thread's lookup must not crash in its own (glibc resets the loader's lock in a child,
 * not the state it guarded). The library is preloaded: its exports are found with dlsym.
 * Prints "forks N crashed C hung H"; exits 0 when every child ended normally, 2 otherwise.
 * Usage: fork_lookup FORKS
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* A hang is for ever; ten seconds leave room for a loaded machine. */
#define HANG_SECONDS 10
#define POLLERS 4

typedef int (*last_error_fn)(void);
typedef int (*malloc_fn)(void **, size_t);

static atomic_int stop = 0;
static last_error_fn last_error;

static void *poll_last_error(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) last_error();
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 2000;
    last_error = (last_error_fn)dlsym(RTLD_DEFAULT, "cudaGetLastError");
    malloc_fn cuda_malloc = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (last_error == NULL || cuda_malloc == NULL) {
        fprintf(stderr, "cachealloc is not preloaded\n");
        return 1;
    }
    pthread_t pollers[POLLERS];
    for (int i = 0; i < POLLERS; i++) {
        if (pthread_create(&pollers[i], NULL, poll_last_error, NULL) != 0) return 1;
    }
    int crashed = 0, hung = 0;
    for (int i = 0; i < forks; i++) {
        pid_t child = fork();
        if (child == 0) {
            alarm(HANG_SECONDS);
            void *p = NULL;
            cuda_malloc(&p, 1 << 20);
            _exit(0);
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child) return 1;
        if (WIFSIGNALED(status)) {
            if (WTERMSIG(status) == SIGALRM) {
                hung++;
            } else {
                crashed++;
            }
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < POLLERS; i++) pthread_join(pollers[i], NULL);
    printf("forks %d crashed %d hung %d\n", forks, crashed, hung);
    return crashed || hung ? 2 : 0;
}
