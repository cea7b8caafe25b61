/* Another device's memory, copied to and from the host while a different device is current:
 * 1 MiB allocated and set to 0x33 on device 1, then, with device 0 current, copied to the host
 * and back. Ordinary cudaMalloc memory allows it (unified addressing: the runtime finds the
 * owner); the pages of expandable segments are opened only to their own device (and to peers
 * after cudaDeviceEnablePeerAccess), which this check measures on a GPU.
 *
 * Prints  devices=N  and, with two or more devices,  d2h_rc=E byte=0xBB h2d_rc=E  (byte is the
 * first byte copied out, 0x33 when the copy read the memory). Exits 0 when every call before
 * the copies succeeded, whatever the copies answered. */
#include "cudart_subset.h"

#include <stdio.h>
#include <string.h>

#define BYTES ((size_t)1 << 20)
#define COPIED 4096

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
        fprintf(stderr, "cudaGetDeviceCount failed\n");
        return 1;
    }
    if (devices < 2) {
        printf("devices=%d\n", devices);
        return 0;
    }
    void *p = NULL;
    cudaError_t rc;
    if ((rc = cudaSetDevice(1)) != cudaSuccess || (rc = cudaMalloc(&p, BYTES)) != cudaSuccess ||
        (rc = cudaMemset(p, 0x33, BYTES)) != cudaSuccess ||
        (rc = cudaDeviceSynchronize()) != cudaSuccess || (rc = cudaSetDevice(0)) != cudaSuccess) {
        fprintf(stderr, "setting up on device 1 failed: %s\n", cudaGetErrorName(rc));
        return 1;
    }
    static unsigned char host[COPIED];
    memset(host, 0, sizeof host);
    cudaError_t d2h = cudaMemcpy(host, p, COPIED, cudaMemcpyDeviceToHost);
    unsigned first = host[0];
    cudaError_t h2d = cudaMemcpy(p, host, COPIED, cudaMemcpyHostToDevice);
    printf("devices=%d d2h_rc=%d byte=0x%02x h2d_rc=%d\n", devices, (int)d2h, first, (int)h2d);
    return 0;
}
