/*
 * torch_peer_check.c — PyTorch's pluggable allocator on two devices with expandable segments:
 * libcachealloc (argv[1]) is loaded as CUDAPluggableAllocator loads it (ctypes: dlopen,
 * RTLD_LOCAL) and a tensor of device 0 is allocated through cachealloc_torch_malloc; then device
 * 1 enables peer access with the program's own call (as PyTorch does before a copy between
 * devices) and runs work over that tensor. Prints "enable: CODE" and "read from device 1: CODE"
 * (0, or 700 where the pages were never opened to device 1).
 */
#include <dlfcn.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "fakecudart.h"

#define MIB ((size_t)1 << 20)

typedef void *(*malloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    malloc_fn torch_malloc = (malloc_fn)dlsym(lib, "cachealloc_torch_malloc");
    free_fn torch_free = (free_fn)dlsym(lib, "cachealloc_torch_free");
    if (!torch_malloc || !torch_free) return 3;
    if (cudaSetDevice(0) != cudaSuccess) return 4;
    void *tensor = torch_malloc(30 * MIB, 0, NULL);
    if (!tensor) return 5;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 1) {
        cudaStream_t on1 = NULL;
        if (cudaSetDevice(1) != cudaSuccess || cudaStreamCreate(&on1) != cudaSuccess) return 6;
        printf("enable: %d\n", (int)cudaDeviceEnablePeerAccess(0, 0));
        printf("read from device 1: %d\n", (int)fakecudart_launch(tensor, 30 * MIB, on1, 10));
        cudaStreamSynchronize(on1);
        cudaSetDevice(0);
    }
    torch_free(tensor, 30 * MIB, 0, NULL);
    return 0;
}
