/*
 * cuda_runtime_api.h — the subset of the CUDA runtime API that the fake `libcudart.so.12` of the
 * cachealloc test suite implements. Prototypes, type names and error codes are those of the real
 * CUDA 12 runtime, so a program written against the real header compiles against this one (as far
 * as it stays inside the subset) and links against either library.
 *
 * The fake (tests/fake-cudart, built by tests/support/fake_cudart.rs) has no GPU behind it:
 *
 *  - Memory. Device memory is host memory from mmap (page aligned, zero filled, readable and
 *    writable by the host, which lets tests inspect it). Each device has a capacity
 *    (FAKECUDART_CAPACITY, default 16GiB), of which a context may hold part (FAKECUDART_CONTEXT,
 *    default 0: in the total cudaMemGetInfo reports, never free, as a real context's memory);
 *    cudaMalloc/cudaMallocPitch/cudaMallocManaged beyond what is free
 *    fail with cudaErrorMemoryAllocation (2). cudaFree(NULL) succeeds; an unknown or interior
 *    pointer, or a double free, gives cudaErrorInvalidValue (1). cudaFree of a live allocation
 *    synchronizes the owning device first (as the real one may). cudaMallocHost memory is pinned
 *    host memory: not charged to a device, freed by cudaFreeHost only. The fake driver
 *    libcuda.so.1 (cuda.h: virtual memory management) shares the capacity: its cuMemCreate memory
 *    counts in cudaMemGetInfo, and memory it mapped and made accessible is device memory for
 *    cudaMemcpy, cudaMemset, cudaPointerGetAttributes and fakecudart_launch (not for cudaFree).
 *  - Stream-ordered memory. cudaMallocAsync and cudaFreeAsync (and their _ptsz forms) have no
 *    pool behind them: cudaMallocAsync allocates as cudaMalloc does, and cudaFreeAsync gives the
 *    allocation at its pointer back at once — any device allocation, cudaMalloc's included (so a
 *    test sees what such a free would give back). On a capturing stream both answer
 *    cudaErrorNotSupported (801): the fake makes no graph allocations. Details in async_memory.c.
 *  - Access. Driver-mapped memory is usable only by the devices that cuMemSetAccess gave access:
 *    cudaMemcpy and cudaMemset (for the calling thread's current device) and fakecudart_launch
 *    (for the stream's device) over a range where the accessing device lacks access on some
 *    mapping fail with cudaErrorIllegalAddress (700) and count in vmm_access_faults (a real GPU
 *    would fault; the fake's 700 is an ordinary last error, not a sticky one). cudaMalloc memory
 *    is not checked that way: any device may use any device's allocation, with or without peer
 *    access. Peer access (cudaDeviceCanAccessPeer: every pair of distinct devices can;
 *    cudaDeviceEnablePeerAccess, cudaDeviceDisablePeerAccess, with the real codes 101, 1, 704 and
 *    705) is bookkeeping only: it grants nothing to driver-mapped memory (neither does the real
 *    one: such memory follows cuMemSetAccess alone) and changes nothing for cudaMalloc memory.
 *  - Interprocess memory. cudaIpcGetMemHandle, as the real driver, names the whole allocation
 *    that holds devPtr, even when devPtr lies inside it: a process that opens the handle gets the
 *    allocation's start, not devPtr. Memory the driver mapped, managed and host memory, and
 *    addresses that are no allocation answer cudaErrorInvalidValue (1).
 *    fakecudart_ipc_handle_base (fakecudart.h) says where a handle would open; there is no
 *    cudaIpcOpenMemHandle (the fake's memory is not shared with other processes).
 *  - Devices. FAKECUDART_DEVICES devices (default 2). The current device is per host thread.
 *    cudaSetDevice of an ordinal out of range gives cudaErrorInvalidDevice (101). cudaDeviceReset
 *    frees every device allocation, stream and event of the current device, drops its pending
 *    work and its peer access both ways (its own to other devices, and other devices' to it, as
 *    the real one documents); the driver's reservations, handles, mappings and their access stay
 *    (they are not the runtime's).
 *    FAKECUDART_DEVICES=0 mimics a driver without devices: every call answers
 *    cudaErrorNoDevice (100).
 *  - Errors. As in the real runtime, a call that returns an error records it as the calling
 *    thread's last error; cudaPeekAtLastError returns it, cudaGetLastError returns and clears it.
 *    cudaErrorNotReady from a query is not recorded. FAKECUDART_FAIL=<code> (e.g. 35, what the
 *    real runtime answers on a machine without a driver) makes every call return <code> and keeps
 *    it as a last error that cudaGetLastError never clears; cudaRuntimeGetVersion still answers and
 *    cudaDriverGetVersion answers 0 for code 35.
 *  - Time. Nothing runs by itself. fakecudart_launch (fakecudart.h) enqueues simulated work on a
 *    stream; a simulated clock moves only through fakecudart_advance and the synchronizing calls
 *    (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, cudaFree, cudaMemcpy,
 *    cudaMemset), which move it just far enough for the work they wait for to be complete.
 *    Streams follow CUDA's ordering rules, including the legacy default stream (0 or
 *    cudaStreamLegacy) that waits for, and is waited for by, blocking streams but not streams
 *    created with cudaStreamNonBlocking. cudaStreamPerThread is the calling thread's own
 *    blocking stream of its current device (the legacy stream waits for every thread's).
 *    One tick counts as one microsecond for cudaEventElapsedTime.
 *  - cudaMemcpy and cudaMemset act as actions on the legacy default stream followed by a wait for
 *    it; they check that the device side of the copy lies inside one live allocation (or inside
 *    adjacent accessible driver mappings of one device, which the current device has access to).
 *  - Driver. At its first call the fake runtime initializes the fake driver and loads
 *    libcuda.so.1 with dlopen through its RUNPATH ($ORIGIN), as the real runtime loads the real
 *    driver; not with FAKECUDART_FAIL=35 (no driver).
 *  - Stream capture. cudaStreamBeginCapture starts capturing a created stream (the legacy and
 *    per-thread default streams are refused with cudaErrorStreamCaptureUnsupported, one already
 *    capturing with cudaErrorIllegalState); nothing issued to it is recorded as a graph, but the
 *    rules that make a capture fail are kept, as the real runtime documents them. While any
 *    capture is active: cudaDeviceSynchronize, and cudaFree of an allocation (which synchronizes
 *    the device), end every active capture as invalidated and answer
 *    cudaErrorStreamCaptureUnsupported (900), whatever the calling thread's mode; cudaMalloc,
 *    cudaEventQuery and cudaEventSynchronize, the calls the runtime calls potentially unsafe, do
 *    so for each capture they would endanger (a global-mode capture from any thread, a
 *    thread-local one from its own thread) unless the calling thread's mode
 *    (cudaThreadExchangeStreamCaptureMode, global by default) is relaxed, which tolerates them.
 *    cudaStreamEndCapture gives a graph handle (destroyed with cudaGraphDestroy; it holds
 *    nothing), or NULL and cudaErrorStreamCaptureInvalidated (901) for an invalidated capture;
 *    from another thread than a non-relaxed capture's it answers
 *    cudaErrorStreamCaptureWrongThread (908) and the capture goes on. cudaStreamIsCapturing of
 *    the legacy stream answers cudaErrorStreamCaptureImplicit (906) while a blocking stream of
 *    the device captures; cudaEventRecord on the legacy stream then ends those captures as
 *    invalidated and answers 906 (the legacy stream is unusable while a blocking stream
 *    captures). An event recorded on a capturing stream is a captured event, which stands for
 *    no work that runs: cudaEventQuery and cudaEventSynchronize of it answer
 *    cudaErrorCapturedEvent (907), during the capture and after it, until it is recorded again
 *    outside a capture.
 *  - Thread safe: one mutex guards the state. Environment variables are read at the first call.
 *    Fork safe: a fork waits for the mutex, so the child never inherits it held.
 *
 * Test-only entry points (call counters, the clock, capacity and failure injection) are declared
 * in fakecudart.h; the driver subset is in cuda.h.
 */
#ifndef FAKECUDART_CUDA_RUNTIME_API_H
#define FAKECUDART_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: the numeric values of the real runtime. */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorPeerAccessNotEnabled = 705,
    cudaErrorNotSupported = 801,
    cudaErrorIllegalState = 401,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorCapturedEvent = 907,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;

/* Stream capture (graphs), as in driver_types.h. */
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};

/* Special stream handles, as in driver_types.h. */
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

/* Stream flags. */
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01

/* Event flags. */
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04

/* cudaMallocManaged flags. */
#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost 0x02

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

/* An interprocess memory handle: 64 opaque bytes, as in driver_types.h. */
#define CUDA_IPC_HANDLE_SIZE 64
typedef struct cudaIpcMemHandle_st {
    char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

/* Memory */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);

/* Stream-ordered memory (no pool behind it: see async_memory.c), and the per-thread-default-stream
 * forms that code built with --default-stream per-thread calls. */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);

/* Interprocess memory */
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr);

/* Devices */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);

/* Peer device memory access */
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
cudaError_t cudaDeviceDisablePeerAccess(int peerDevice);

/* Streams */
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags);
cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

/* Events */
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* Errors and versions */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaDriverGetVersion(int *driverVersion);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDART_CUDA_RUNTIME_API_H */
