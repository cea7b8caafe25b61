/* Row (l) of gpu-check.sh: a cudaMalloc during a CUDA graph capture, as PyTorch's caching
 * allocator makes it during torch.cuda.graph (the thread's capture mode relaxed for the call),
 * after a cudaFree that the shim keeps pending (free_sync:device, its default).
 *
 *   graph_capture BYTES
 *
 * Creates a non-blocking stream, allocates and frees BYTES, begins a global-mode capture on the
 * stream, allocates BYTES with the mode relaxed, and ends the capture. With the shim (found by
 * its cachealloc_empty_cache symbol) the captured block is also freed during the capture, where
 * the shim keeps it pending (the runtime's own cudaFree is not called), and BYTES allocated again:
 * a miss during the capture with a free pending. Prints
 *     begin_rc=B malloc_rc=M end_rc=E graph=G pending_rc=P
 * (G is 1 when the end gave a graph; P is the second allocation's answer, 0 without the shim)
 * and exits 0 when every call succeeded, 1 otherwise. Without the shim the runtime's own
 * cudaMalloc serves the requests. With it the block freed before the capture is completed by the
 * device synchronization the shim makes just before it forwards the capture's start, and the
 * first request reuses it; a pool that synchronized the device during the capture (for the
 * second) would end it: end_rc=901. */
#include "cudart_subset.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BYTES\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10);
    if (bytes == 0) {
        fprintf(stderr, "BYTES must be a positive integer\n");
        return 2;
    }
    cudaStream_t stream = NULL;
    cudaError_t rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    void *freed = NULL, *captured = NULL;
    if (rc == cudaSuccess)
        rc = cudaMalloc(&freed, bytes);
    if (rc == cudaSuccess)
        rc = cudaFree(freed);
    if (rc != cudaSuccess) {
        printf("setting up answered %d (%s)\n", rc, cudaGetErrorName(rc));
        return 1;
    }
    cudaError_t begin_rc = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    int mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t malloc_rc = cudaMalloc(&captured, bytes);
    cudaError_t pending_rc = cudaSuccess;
    if (malloc_rc == cudaSuccess && dlsym(RTLD_DEFAULT, "cachealloc_empty_cache") != NULL) {
        void *again = NULL;
        cudaFree(captured);
        pending_rc = cudaMalloc(&again, bytes);
        captured = pending_rc == cudaSuccess ? again : NULL;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaGraph_t graph = NULL;
    cudaError_t end_rc = begin_rc == cudaSuccess ? cudaStreamEndCapture(stream, &graph) : begin_rc;
    printf("begin_rc=%d malloc_rc=%d end_rc=%d graph=%d pending_rc=%d\n", begin_rc, malloc_rc,
           end_rc, graph != NULL, pending_rc);
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (captured != NULL)
        cudaFree(captured);
    cudaGetLastError();
    return begin_rc == cudaSuccess && malloc_rc == cudaSuccess && end_rc == cudaSuccess &&
                   pending_rc == cudaSuccess
               ? 0
               : 1;
}
