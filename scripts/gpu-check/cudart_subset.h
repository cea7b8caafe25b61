/* The few CUDA runtime functions the gpu-check programs call, declared here so that they build
 * against any libcudart.so (NVIDIA's, from a CUDA install or PyPI, or the project's fake runtime)
 * without the CUDA headers. cudaError_t is an enum, int-sized, in the real header. C++ programs
 * include it too: the functions have C linkage there as well. */
#ifndef GPU_CHECK_CUDART_SUBSET_H
#define GPU_CHECK_CUDART_SUBSET_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
enum { cudaStreamNonBlocking = 1 };
/* cudaStreamCaptureMode, an int-sized enum in the real header. */
enum { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeRelaxed = 2 };
enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };

/* cudaIpcMemHandle_t: 64 opaque bytes. */
typedef struct {
    char reserved[64];
} cudaIpcMemHandle_t;

extern cudaError_t cudaMalloc(void **dev_ptr, size_t size);
extern cudaError_t cudaFree(void *dev_ptr);
extern cudaError_t cudaMemset(void *dev_ptr, int value, size_t count);
extern cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
extern cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *dev_ptr);
extern cudaError_t cudaDeviceSynchronize(void);
extern cudaError_t cudaDeviceReset(void);
extern cudaError_t cudaGetDeviceCount(int *count);
extern cudaError_t cudaSetDevice(int device);
extern cudaError_t cudaGetLastError(void);
extern cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
extern const char *cudaGetErrorName(cudaError_t error);
extern cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
extern cudaError_t cudaStreamSynchronize(cudaStream_t stream);
extern cudaError_t cudaFreeAsync(void *dev_ptr, cudaStream_t stream);
extern cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
extern cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
extern cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode);
extern cudaError_t cudaGraphDestroy(cudaGraph_t graph);

#ifdef __cplusplus
}
#endif

#endif
