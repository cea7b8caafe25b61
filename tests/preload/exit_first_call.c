/*
 * exit_first_call.c — the main thread calls exit() while another thread is still in the
 * process's first CUDA call: held up, after claiming its statistics file, in writing a notice to
 * stderr (a pipe nobody reads, full). The statistics file it claimed must get the report.
 * Usage: exit_first_call DIR (DIR: the statistics file's folder, where another process holds
 * it; the file claimed beside it is the second file there)
 */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "full_stderr.h"

static void *first_call(void *arg) {
    (void)arg;
    cudaGetLastError();
    return NULL;
}

/* The number of files in `dir`. */
static int files_in(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || fill_stderr() != 0) return 1;
    pthread_t first;
    if (pthread_create(&first, NULL, first_call, NULL) != 0) return 1;
    /* Once the file beside is claimed, the first call goes on to its notice, and waits there. */
    for (int waited = 0; files_in(argv[1]) < 2; waited++) {
        if (waited == 10000) return 1;
        usleep(1000);
    }
    usleep(100 * 1000);
    exit(0);
}
