/*
 * fork_stderr.c — a thread of the parent is inside a write to stderr that does not end (the
 * configuration error, at its first CUDA call, to a pipe that is full) when the main thread forks
 * a child, which makes a CUDA call that writes to stderr itself (the program is linked without a
 * runtime, so the library says that none was found). The child's stderr is /dev/null, so only a
 * lock the parent held at the fork can stop it: it answers within HANG_SECONDS or dies of SIGALRM.
 * Prints "forks N hung H" and exits 0 when every child answered, 2 when one hung.
 * The CUDA calls are the preloaded library's, found with dlsym: the program links no runtime.
 * Usage: fork_stderr FORKS
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "full_stderr.h"

/* A hang is for ever: ten seconds catch one and leave room for a loaded machine. */
#define HANG_SECONDS 10

typedef int (*last_error_fn)(void);
typedef int (*malloc_fn)(void **, size_t);

static void *first_call(void *arg) {
    /* Decides the mode: the configuration error is written to the full pipe, and waits there. */
    ((last_error_fn)arg)();
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 3;
    last_error_fn last_error = (last_error_fn)dlsym(RTLD_DEFAULT, "cudaGetLastError");
    malloc_fn cuda_malloc = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
    if (last_error == NULL || cuda_malloc == NULL) return 1;
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull < 0 || fill_stderr() != 0) return 1;
    pthread_t first;
    if (pthread_create(&first, NULL, first_call, (void *)last_error) != 0) return 1;
    usleep(300 * 1000); /* the first call is now blocked in its write */
    int hung = 0, done = 0;
    for (; done < forks; done++) {
        pid_t child = fork();
        if (child == 0) {
            dup2(devnull, 2);
            alarm(HANG_SECONDS);
            void *p = NULL;
            _exit(cuda_malloc(&p, 1 << 20) == 3 ? 0 : 1);
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child) return 1;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
            hung++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            return 1;
        }
    }
    char line[64];
    int n = snprintf(line, sizeof line, "forks %d hung %d\n", done, hung);
    if (write(1, line, n) != n) return 1;
    /* The first call's thread is still blocked: end without waiting for it. */
    _exit(hung ? 2 : 0);
}
