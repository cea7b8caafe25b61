/* Row (m) of gpu-check.sh: cudaFreeAsync of memory that cudaMalloc gave.
 *
 *   free_async BYTES
 *
 * Allocates two blocks of BYTES with cudaMalloc (with the shim and BYTES of 1 MiB, the two halves
 * of one 2 MiB segment), writes the second, frees the first with cudaFreeAsync on a non-blocking
 * stream and synchronizes that stream, then reads the second back: it must still hold its bytes
 * (freed by the runtime, the first block's pointer would release the shim's whole segment). Then
 * it begins a global-mode capture on a second non-blocking stream, frees the second block with
 * cudaFreeAsync on it (a free node takes only a graph allocation: the shim refuses its memory
 * with 1), and ends the capture; a block the capture's free did not take is freed again after
 * it. Prints
 *     free_rc=F sync_rc=S read_rc=R intact=I capture_free_rc=C end_rc=E graph=G after_rc=A
 * (I is 1 when the bytes read back are those written, G 1 when the end gave a graph, A 0 when
 * nothing was left to free) and exits 0; what the runtime alone answers is a figure of the row.
 * Exits 1 when setting up fails, 2 on a usage error. */
#include "cudart_subset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    unsigned char *written = malloc(bytes), *read = malloc(bytes);
    cudaStream_t stream = NULL, capturing = NULL;
    void *first = NULL, *second = NULL;
    cudaError_t rc = written && read ? cudaSuccess : cudaErrorMemoryAllocation;
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&first, bytes);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&second, bytes);
    if (rc == cudaSuccess) {
        for (size_t i = 0; i < bytes; i++)
            written[i] = (unsigned char)(i * 7 + 1);
        rc = cudaMemcpy(second, written, bytes, cudaMemcpyHostToDevice);
    }
    if (rc != cudaSuccess) {
        printf("setting up answered %d (%s)\n", rc, cudaGetErrorName(rc));
        return 1;
    }
    cudaError_t free_rc = cudaFreeAsync(first, stream);
    cudaError_t sync_rc = cudaStreamSynchronize(stream);
    cudaError_t read_rc = cudaMemcpy(read, second, bytes, cudaMemcpyDeviceToHost);
    int intact = read_rc == cudaSuccess && memcmp(read, written, bytes) == 0;
    cudaGetLastError();

    cudaError_t begin_rc = cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal);
    cudaError_t capture_free_rc = cudaFreeAsync(second, capturing);
    cudaGraph_t graph = NULL;
    cudaError_t end_rc = begin_rc == cudaSuccess ? cudaStreamEndCapture(capturing, &graph)
                                                 : begin_rc;
    if (graph != NULL)
        cudaGraphDestroy(graph);
    cudaGetLastError();
    cudaError_t after_rc = cudaSuccess;
    if (capture_free_rc != cudaSuccess) {
        after_rc = cudaFreeAsync(second, stream);
        cudaStreamSynchronize(stream);
    }
    printf("free_rc=%d sync_rc=%d read_rc=%d intact=%d capture_free_rc=%d end_rc=%d graph=%d "
           "after_rc=%d\n",
           free_rc, sync_rc, read_rc, intact, capture_free_rc, end_rc, graph != NULL, after_rc);
    cudaGetLastError();
    return 0;
}
