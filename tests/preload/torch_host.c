/*
 * torch_host.c — a C program standing in for Python: it loads torch_like.so (argv[1]) with
 * RTLD_LOCAL, so no C++ runtime is in its global scope, and has it drive libcachealloc
 * (argv[2]). Prints what torch_like_run reports.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *torch = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!torch) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    int (*run)(const char *, char *, size_t) =
        (int (*)(const char *, char *, size_t))dlsym(torch, "torch_like_run");
    char out[8192] = {0};
    int rc = run ? run(argv[2], out, sizeof out) : 3;
    fputs(out, stdout);
    return rc;
}
