/* Sharing memory with another process under the shim: two 4 KiB allocations that share one
 * segment, the first at its start, each filled with its own byte. The handle of the first must
 * be made and open, in a child process, on the first's bytes; the second's must be refused (1),
 * since its handle would open at the segment's start, on the first's bytes.
 *
 *   ipc_check            export, then run `ipc_check open HEX` for the first handle
 *   ipc_check open HEX   open the handle (cudaIpcOpenMemHandle, looked up at run time: the fake
 *                        runtime has none) and print the first byte found there
 *
 * Prints  first_rc=0 second_rc=1 second_offset=4096  then the child's  opened byte=0x11  (or
 * opened rc=E, or open unsupported) and exits 0 when the parent's calls went as described. */
#define _GNU_SOURCE
#include "cudart_subset.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define FIRST_BYTE 0x11
#define SECOND_BYTE 0x22

typedef cudaError_t (*open_fn)(void **dev_ptr, cudaIpcMemHandle_t handle, unsigned int flags);
typedef cudaError_t (*close_fn)(void *dev_ptr);

static int open_and_read(const char *hex) {
    cudaIpcMemHandle_t handle;
    if (strlen(hex) != 2 * sizeof handle.reserved) {
        fprintf(stderr, "a handle is %zu hex digits\n", 2 * sizeof handle.reserved);
        return 2;
    }
    for (size_t i = 0; i < sizeof handle.reserved; i++) {
        unsigned byte = 0;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1) {
            fprintf(stderr, "not a hex handle: %s\n", hex);
            return 2;
        }
        handle.reserved[i] = (char)byte;
    }
    open_fn open_handle = (open_fn)dlsym(RTLD_DEFAULT, "cudaIpcOpenMemHandle");
    close_fn close_handle = (close_fn)dlsym(RTLD_DEFAULT, "cudaIpcCloseMemHandle");
    if (open_handle == NULL || close_handle == NULL) {
        printf("open unsupported\n");
        return 0;
    }
    void *dev = NULL;
    cudaError_t rc = open_handle(&dev, handle, 1 /* cudaIpcMemLazyEnablePeerAccess */);
    if (rc != cudaSuccess) {
        printf("opened rc=%d (%s)\n", rc, cudaGetErrorName(rc));
        return 0;
    }
    unsigned char byte = 0;
    rc = cudaMemcpy(&byte, dev, 1, cudaMemcpyDeviceToHost);
    close_handle(dev);
    if (rc != cudaSuccess)
        printf("opened read_rc=%d (%s)\n", rc, cudaGetErrorName(rc));
    else
        printf("opened byte=0x%02x\n", byte);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "open") == 0)
        return open_and_read(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [open HANDLE_HEX]\n", argv[0]);
        return 2;
    }
    char *first = NULL, *second = NULL;
    if (cudaMalloc((void **)&first, 4096) != cudaSuccess ||
        cudaMalloc((void **)&second, 4096) != cudaSuccess ||
        cudaMemset(first, FIRST_BYTE, 4096) != cudaSuccess ||
        cudaMemset(second, SECOND_BYTE, 4096) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        printf("setup failed: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 1;
    }
    cudaIpcMemHandle_t first_handle, second_handle;
    cudaError_t first_rc = cudaIpcGetMemHandle(&first_handle, first);
    cudaError_t second_rc = cudaIpcGetMemHandle(&second_handle, second);
    cudaGetLastError();
    printf("first_rc=%d second_rc=%d second_offset=%td\n", first_rc, second_rc, second - first);
    fflush(stdout);
    int ok = first_rc == cudaSuccess && second_rc == 1 && second - first == 4096;
    if (first_rc == cudaSuccess) {
        char hex[2 * sizeof first_handle.reserved + 1];
        for (size_t i = 0; i < sizeof first_handle.reserved; i++)
            sprintf(hex + 2 * i, "%02x", (unsigned char)first_handle.reserved[i]);
        pid_t child = fork();
        if (child == 0) {
            execl("/proc/self/exe", argv[0], "open", hex, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            ok = 0;
    }
    cudaFree(second);
    cudaFree(first);
    return ok ? 0 : 1;
}
