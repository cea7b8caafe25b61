/* A CUDA program of the kind cachealloc is for: an iterative solver that allocates its work
 * buffers with cudaMalloc and releases them with cudaFree on every step, with sizes that change
 * as the problem is refined. It prints how many calls it made and, from the fake runtime's
 * counters, how many reached the runtime (each real cudaFree also synchronizes the device). */
#include <cuda_runtime_api.h>
#include <fakecudart.h>
#include <stdio.h>
#include <stdlib.h>

#define STEPS 500

static int check(cudaError_t err, const char *what) {
    if (err != cudaSuccess) {
        fprintf(stderr, "solver: %s failed with CUDA error %d\n", what, (int)err);
        exit(1);
    }
    return 0;
}

int main(void) {
    unsigned long calls = 0;
    size_t grid = 1 << 16;
    for (int step = 0; step < STEPS; step++) {
        if (step % 100 == 99) grid += grid / 4; /* refine the problem now and then */
        size_t sizes[6] = {grid * 8, grid * 8, grid * 4, (grid / 64) * 8, 4096, 256};
        void *buf[6];
        for (int i = 0; i < 6; i++) {
            check(cudaMalloc(&buf[i], sizes[i]), "cudaMalloc");
            check(cudaMemset(buf[i], step & 0xff, sizes[i]), "cudaMemset");
            calls++;
        }
        for (int i = 5; i >= 0; i--) check(cudaFree(buf[i]), "cudaFree");
    }
    printf("  the program made     %6lu cudaMalloc and %6lu cudaFree calls\n", calls, calls);
    printf("  the runtime received %6llu cudaMalloc and %6llu cudaFree calls; the device was "
           "synchronized %llu times\n",
           (unsigned long long)fakecudart_counter("mallocs"),
           (unsigned long long)fakecudart_counter("frees"),
           (unsigned long long)(fakecudart_counter("implicit_syncs") +
                                fakecudart_counter("device_syncs")));
    if (fakecudart_counter("vmm_maps") > 0)
        printf("  the driver mapped     %6llu pages (cuMemCreate + cuMemMap) into %llu address "
               "ranges\n",
               (unsigned long long)fakecudart_counter("vmm_maps"),
               (unsigned long long)fakecudart_counter("vmm_reserves"));
    return 0;
}
