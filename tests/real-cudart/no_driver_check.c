/* Calls NVIDIA's real libcudart.so.12 the way an application does (linked -l:libcudart.so.12,
 * no header needed) and prints one line per call:
 *
 *   driver absent|present           whether libcuda.so.1 (the driver) can be loaded at all
 *   call=NAME rc=N name=ERRNAME ... one line per runtime call, with what happened to outputs
 *
 * On a machine without a driver every call answers 35 cudaErrorInsufficientDriver (100
 * cudaErrorNoDevice with a driver but no device). The tests compare these lines with and without
 * libcachealloc.so preloaded: the shim must pass the runtime's answers through unchanged. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef int cudaError_t; /* an enum in the real header: int-sized */
extern cudaError_t cudaMalloc(void **dev_ptr, size_t size);
extern cudaError_t cudaFree(void *dev_ptr);
extern cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
extern cudaError_t cudaIpcGetMemHandle(void *handle, void *dev_ptr);
extern cudaError_t cudaDeviceEnablePeerAccess(int peer_device, unsigned int flags);
extern cudaError_t cudaFreeAsync(void *dev_ptr, void *stream);
extern cudaError_t cudaFreeAsync_ptsz(void *dev_ptr, void *stream);
extern const char *cudaGetErrorName(cudaError_t error);

#define SENTINEL ((void *)0xdead)

static void report_malloc(size_t size) {
    void *p = SENTINEL;
    cudaError_t rc = cudaMalloc(&p, size);
    printf("call=cudaMalloc(%zu) rc=%d name=%s out=%s\n", size, rc, cudaGetErrorName(rc),
           p == SENTINEL ? "untouched" : "written");
    if (rc == 0)
        cudaFree(p);
}

int main(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("driver %s\n", driver ? "present" : "absent");

    report_malloc(1 << 20); /* 1 MiB */
    report_malloc(0);

    cudaError_t rc = cudaFree(NULL);
    printf("call=cudaFree(NULL) rc=%d name=%s\n", rc, cudaGetErrorName(rc));

    size_t free_bytes = 7, total_bytes = 7;
    rc = cudaMemGetInfo(&free_bytes, &total_bytes);
    printf("call=cudaMemGetInfo rc=%d name=%s\n", rc, cudaGetErrorName(rc));

    char handle[64] = {0}; /* cudaIpcMemHandle_t: 64 opaque bytes */
    rc = cudaIpcGetMemHandle(handle, (void *)0x7f0000000000);
    printf("call=cudaIpcGetMemHandle rc=%d name=%s\n", rc, cudaGetErrorName(rc));

    rc = cudaDeviceEnablePeerAccess(1, 0);
    printf("call=cudaDeviceEnablePeerAccess rc=%d name=%s\n", rc, cudaGetErrorName(rc));

    rc = cudaFreeAsync((void *)0x7f0000000000, NULL);
    printf("call=cudaFreeAsync rc=%d name=%s\n", rc, cudaGetErrorName(rc));
    rc = cudaFreeAsync_ptsz((void *)0x7f0000000000, NULL);
    printf("call=cudaFreeAsync_ptsz rc=%d name=%s\n", rc, cudaGetErrorName(rc));
    return 0;
}
