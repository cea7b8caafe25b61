/*
 * fake_cudart_check.c — checks of the fake libcudart.so.12, one scenario per argument, run by
 * tests/fake_cudart.rs. A scenario prints "ok <name>" when every check held; the first failing
 * check prints its line and expression on stderr and exits with status 1.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <fakecudart.h>

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK_RC(call, expected)                                                        \
    do {                                                                                \
        cudaError_t rc_ = (call);                                                       \
        if (rc_ != (expected)) {                                                        \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__,      \
                    __LINE__, #call, (int)rc_, cudaGetErrorName(rc_), (int)(expected)); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define MiB (1024u * 1024u)

static void alloc(void) {
    void *p = NULL, *q = NULL;
    fakecudart_reset_counters();
    CHECK_RC(cudaMalloc(&p, 1000), cudaSuccess);
    CHECK(p != NULL && (uintptr_t)p % 256 == 0);
    CHECK_RC(cudaMalloc(&q, 3 * MiB), cudaSuccess);
    CHECK(q != NULL && (uintptr_t)q % 256 == 0);
    CHECK(fakecudart_counter("mallocs") == 2);
    CHECK(fakecudart_counter("bytes_in_use") == 1000 + 3 * MiB);
    CHECK(fakecudart_device_bytes_in_use(0) == 1000 + 3 * MiB);

    /* Host round trip through device memory. */
    char host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (char)(i * 7);
    CHECK_RC(cudaMemcpy(p, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_RC(cudaMemcpy(q, p, sizeof host, cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_RC(cudaMemcpy(back, q, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK_RC(cudaMemset(q, 0xab, 16), cudaSuccess);
    CHECK(((unsigned char *)q)[15] == 0xab && ((unsigned char *)q)[16] == (unsigned char)host[16]);
    /* The device side of a copy must lie inside one allocation. */
    CHECK_RC(cudaMemcpy(p, host, 1001, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_RC(cudaMemcpy(back, host, 10, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_RC(cudaMemset(host, 0, 10), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);

    struct cudaPointerAttributes attr;
    CHECK_RC(cudaPointerGetAttributes(&attr, (char *)q + 100), cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 0 &&
          attr.devicePointer == (char *)q + 100);
    CHECK_RC(cudaPointerGetAttributes(&attr, host), cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeUnregistered);

    /* cudaFree: NULL is fine; unknown, interior and double frees are invalid values. */
    CHECK_RC(cudaFree(NULL), cudaSuccess);
    CHECK_RC(cudaFree(host), cudaErrorInvalidValue);
    CHECK_RC(cudaFree((char *)q + 256), cudaErrorInvalidValue);
    CHECK_RC(cudaFree(q), cudaSuccess);
    CHECK_RC(cudaFree(q), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaSuccess);
    CHECK(fakecudart_counter("frees") == 1);
    CHECK(fakecudart_counter("null_frees") == 1);
    CHECK(fakecudart_counter("free_failures") == 3);
    CHECK(fakecudart_counter("bytes_in_use") == 1000);
    CHECK(fakecudart_counter("peak_bytes") == 1000 + 3 * MiB);
    CHECK(fakecudart_counter("memcpys") == 5 && fakecudart_counter("memsets") == 2);

    /* Size 0 succeeds with a NULL pointer; a NULL out-pointer is an invalid value. */
    void *z = (void *)0x1;
    CHECK_RC(cudaMalloc(&z, 0), cudaSuccess);
    CHECK(z == NULL);
    CHECK_RC(cudaMalloc(NULL, 16), cudaErrorInvalidValue);

    /* Pitch, managed and pinned host memory. */
    void *pitched;
    size_t pitch = 0;
    CHECK_RC(cudaMallocPitch(&pitched, &pitch, 100, 10), cudaSuccess);
    CHECK(pitch >= 100 && pitch % 256 == 0);
    void *managed;
    CHECK_RC(cudaMallocManaged(&managed, 4096, cudaMemAttachGlobal), cudaSuccess);
    CHECK_RC(cudaPointerGetAttributes(&attr, managed), cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeManaged);
    void *pinned;
    CHECK_RC(cudaMallocHost(&pinned, 4096), cudaSuccess);
    CHECK_RC(cudaPointerGetAttributes(&attr, pinned), cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeHost && attr.hostPointer == pinned);
    CHECK(fakecudart_counter("bytes_in_use") == 1000 + pitch * 10 + 4096);
    CHECK_RC(cudaFree(pinned), cudaErrorInvalidValue);
    CHECK_RC(cudaFreeHost(p), cudaErrorInvalidValue);
    CHECK_RC(cudaFreeHost(pinned), cudaSuccess);
    CHECK_RC(cudaFree(pitched), cudaSuccess);
    CHECK_RC(cudaFree(managed), cudaSuccess);
    CHECK_RC(cudaFree(p), cudaSuccess);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK(fakecudart_counter("pitch_mallocs") == 1 && fakecudart_counter("managed_mallocs") == 1);
    CHECK(fakecudart_counter("host_mallocs") == 1 && fakecudart_counter("host_frees") == 1);
    CHECK(fakecudart_counter("no_such_counter") == UINT64_MAX);

    fakecudart_counters all;
    fakecudart_get_counters(&all);
    CHECK(all.mallocs == 3 && all.frees == 4);
    fakecudart_reset_counters();
    CHECK(fakecudart_counter("mallocs") == 0 && fakecudart_counter("peak_bytes") == 0);

    int v = 0;
    CHECK_RC(cudaRuntimeGetVersion(&v), cudaSuccess);
    CHECK(v == 12090);
    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
    CHECK(strcmp(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady") == 0);
    CHECK(strcmp(cudaGetErrorString((cudaError_t)12345), "unrecognized error code") == 0);
}

/* Run with FAKECUDART_CAPACITY=1MiB. */
static void oom(void) {
    size_t free_b = 0, total = 0;
    CHECK_RC(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    CHECK(total == MiB && free_b == MiB);
    void *a, *b = (void *)0xdead;
    CHECK_RC(cudaMalloc(&a, MiB / 2), cudaSuccess);
    CHECK_RC(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    CHECK(free_b == MiB / 2);
    CHECK_RC(cudaMalloc(&b, MiB / 2 + 1), cudaErrorMemoryAllocation);
    CHECK(b == (void *)0xdead); /* out-pointer untouched, as in the real runtime */
    CHECK(fakecudart_counter("malloc_failures") == 1);
    /* Sticky until read: successful calls do not clear it, peeking does not clear it. */
    CHECK_RC(cudaMalloc(&b, MiB / 4), cudaSuccess);
    CHECK_RC(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_RC(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_RC(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_RC(cudaGetLastError(), cudaSuccess);
    CHECK_RC(cudaPeekAtLastError(), cudaSuccess);
    /* Exactly the capacity fits once the rest is freed. */
    CHECK_RC(cudaFree(a), cudaSuccess);
    CHECK_RC(cudaFree(b), cudaSuccess);
    CHECK_RC(cudaMalloc(&a, MiB), cudaSuccess);
    CHECK_RC(cudaFree(a), cudaSuccess);
    /* Injected failures take the next allocations, whatever the free memory. */
    fakecudart_inject_malloc_failures(2, cudaErrorMemoryAllocation);
    CHECK_RC(cudaMalloc(&a, 16), cudaErrorMemoryAllocation);
    CHECK_RC(cudaMalloc(&a, 16), cudaErrorMemoryAllocation);
    CHECK_RC(cudaMalloc(&a, 16), cudaSuccess);
    CHECK_RC(cudaFree(a), cudaSuccess);
    /* Injected failures of other calls: only the calls named, once each time. */
    cudaEvent_t ev;
    CHECK_RC(cudaEventCreate(&ev), cudaSuccess);
    CHECK_RC(fakecudart_inject_call_failures("cudaMemcpy", 1, cudaErrorUnknown),
             cudaErrorInvalidValue);
    CHECK_RC(fakecudart_inject_call_failures("cudaEventQuery", 1, cudaErrorUnknown), cudaSuccess);
    CHECK_RC(cudaEventQuery(ev), cudaErrorUnknown);
    CHECK_RC(cudaGetLastError(), cudaErrorUnknown);
    CHECK_RC(cudaEventQuery(ev), cudaSuccess);
    CHECK_RC(cudaEventDestroy(ev), cudaSuccess);
    CHECK_RC(fakecudart_inject_call_failures("cudaDeviceReset", 1, cudaErrorUnknown), cudaSuccess);
    CHECK_RC(cudaMalloc(&a, 16), cudaSuccess);
    CHECK_RC(cudaDeviceReset(), cudaErrorUnknown);
    CHECK_RC(cudaGetLastError(), cudaErrorUnknown);
    CHECK_RC(cudaFree(a), cudaSuccess); /* the failed reset freed nothing */
    CHECK_RC(fakecudart_inject_call_failures("cudaDeviceSynchronize", 1, cudaErrorUnknown),
             cudaSuccess);
    CHECK_RC(cudaMalloc(&a, 16), cudaSuccess);
    CHECK_RC(fakecudart_launch(a, 16, NULL, 10), cudaSuccess);
    CHECK_RC(cudaDeviceSynchronize(), cudaErrorUnknown);
    CHECK_RC(cudaGetLastError(), cudaErrorUnknown);
    CHECK(fakecudart_range_busy(a, 16)); /* the failed synchronization waited for nothing */
    CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
    CHECK(!fakecudart_range_busy(a, 16));
    CHECK_RC(cudaFree(a), cudaSuccess);
    CHECK_RC(fakecudart_inject_call_failures("cudaEventCreate", 1, cudaErrorMemoryAllocation),
             cudaSuccess);
    CHECK_RC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaErrorMemoryAllocation);
    CHECK_RC(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_RC(cudaEventCreate(&ev), cudaSuccess);
    CHECK_RC(fakecudart_inject_call_failures("cudaEventRecord", 1, cudaErrorUnknown), cudaSuccess);
    uint64_t records = fakecudart_counter("event_records");
    CHECK_RC(cudaEventRecord(ev, NULL), cudaErrorUnknown);
    CHECK_RC(cudaGetLastError(), cudaErrorUnknown);
    CHECK(fakecudart_counter("event_records") == records);
    CHECK_RC(cudaEventRecord(ev, NULL), cudaSuccess);
    CHECK_RC(cudaEventDestroy(ev), cudaSuccess);
    /* A larger capacity set at run time. */
    CHECK_RC(fakecudart_set_capacity(0, 4 * MiB), cudaSuccess);
    CHECK_RC(cudaMalloc(&a, 3 * MiB), cudaSuccess);
    CHECK_RC(cudaFree(a), cudaSuccess);
    CHECK_RC(fakecudart_set_capacity(7, MiB), cudaErrorInvalidDevice);
    CHECK(fakecudart_counter("malloc_failures") == 3);
}

static void *other_thread_device(void *arg) {
    (void)arg;
    int d = -1;
    CHECK_RC(cudaGetDevice(&d), cudaSuccess);
    CHECK(d == 0); /* the current device is per thread */
    CHECK_RC(cudaGetLastError(), cudaSuccess); /* and so is the last error */
    return NULL;
}

/* Run with FAKECUDART_DEVICES=3. */
static void devices(void) {
    int n = 0, d = -1;
    CHECK_RC(cudaGetDeviceCount(&n), cudaSuccess);
    CHECK(n == 3);
    CHECK_RC(cudaSetDevice(3), cudaErrorInvalidDevice);
    CHECK_RC(cudaSetDevice(-1), cudaErrorInvalidDevice);
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaGetDevice(&d), cudaSuccess);
    CHECK(d == 1);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread_device, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidDevice);

    void *p1, *p1b, *p0;
    CHECK_RC(cudaMalloc(&p1, MiB), cudaSuccess);
    CHECK_RC(cudaMalloc(&p1b, MiB), cudaSuccess);
    struct cudaPointerAttributes attr;
    CHECK_RC(cudaPointerGetAttributes(&attr, p1), cudaSuccess);
    CHECK(attr.device == 1 && attr.type == cudaMemoryTypeDevice);
    CHECK(fakecudart_device_bytes_in_use(1) == 2 * MiB);
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaMalloc(&p0, MiB), cudaSuccess);
    size_t free_b, total;
    CHECK_RC(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    CHECK(total - free_b == MiB);
    /* A pointer is freed to its own device whichever device is current. */
    CHECK_RC(cudaFree(p1b), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(1) == MiB);

    /* cudaDeviceReset frees everything of the current device only. */
    cudaStream_t s;
    cudaEvent_t e;
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaStreamCreate(&s), cudaSuccess);
    CHECK_RC(cudaEventCreate(&e), cudaSuccess);
    CHECK_RC(fakecudart_launch(p1, MiB, s, 50), cudaSuccess);
    CHECK(fakecudart_range_busy(p1, MiB));
    CHECK_RC(cudaDeviceReset(), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(1) == 0);
    CHECK(fakecudart_device_bytes_in_use(0) == MiB);
    CHECK(!fakecudart_range_busy(p1, MiB));
    CHECK(fakecudart_pending_work() == 0);
    CHECK_RC(cudaFree(p1), cudaErrorInvalidValue);
    CHECK_RC(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
    CHECK_RC(cudaEventRecord(e, 0), cudaErrorInvalidResourceHandle);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    CHECK(fakecudart_counter("device_resets") == 1);
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaFree(p0), cudaSuccess);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
}

/* cudaIpcGetMemHandle names the whole allocation: a pointer inside it gets the same handle,
 * which opens at the allocation's start. Only cudaMalloc and cudaMallocPitch memory exports. */
static void ipc(void) {
    char *p = NULL, *m = NULL, *h = NULL;
    void *pitched = NULL;
    size_t pitch = 0;
    cudaIpcMemHandle_t whole, inner;
    CHECK_RC(cudaMalloc((void **)&p, 4 * MiB), cudaSuccess);
    CHECK_RC(cudaIpcGetMemHandle(&whole, p), cudaSuccess);
    CHECK(fakecudart_ipc_handle_base(&whole) == (uintptr_t)p);
    CHECK_RC(cudaIpcGetMemHandle(&inner, p + MiB), cudaSuccess);
    CHECK(fakecudart_ipc_handle_base(&inner) == (uintptr_t)p); /* not p + 1 MiB */
    CHECK(memcmp(&whole, &inner, sizeof whole) == 0);
    CHECK_RC(cudaMallocPitch(&pitched, &pitch, 100, 10), cudaSuccess);
    CHECK_RC(cudaIpcGetMemHandle(&whole, pitched), cudaSuccess);
    CHECK(fakecudart_ipc_handle_base(&whole) == (uintptr_t)pitched);
    CHECK(fakecudart_counter("ipc_handles") == 3);

    CHECK_RC(cudaMallocManaged((void **)&m, MiB, cudaMemAttachGlobal), cudaSuccess);
    CHECK_RC(cudaIpcGetMemHandle(&whole, m), cudaErrorInvalidValue);
    CHECK_RC(cudaMallocHost((void **)&h, MiB), cudaSuccess);
    CHECK_RC(cudaIpcGetMemHandle(&whole, h), cudaErrorInvalidValue);
    CHECK_RC(cudaIpcGetMemHandle(&whole, p + 4 * MiB), cudaErrorInvalidValue); /* past the end */
    CHECK_RC(cudaIpcGetMemHandle(&whole, NULL), cudaErrorInvalidValue);
    CHECK_RC(cudaIpcGetMemHandle(NULL, p), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(fakecudart_counter("ipc_handles") == 3);
    memset(&whole, 0, sizeof whole);
    CHECK(fakecudart_ipc_handle_base(&whole) == 0);
    CHECK(fakecudart_ipc_handle_base(NULL) == 0);

    CHECK_RC(cudaFreeHost(h), cudaSuccess);
    CHECK_RC(cudaFree(m), cudaSuccess);
    CHECK_RC(cudaFree(pitched), cudaSuccess);
    CHECK_RC(cudaFree(p), cudaSuccess);
}

/* Run with FAKECUDART_DEVICES=3: peer access, with the real runtime's answers. */
static void peer(void) {
    int can = -1;
    CHECK_RC(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
    CHECK(can == 1);
    CHECK_RC(cudaDeviceCanAccessPeer(&can, 2, 0), cudaSuccess);
    CHECK(can == 1);
    CHECK_RC(cudaDeviceCanAccessPeer(&can, 1, 1), cudaSuccess); /* not its own peer */
    CHECK(can == 0);
    can = 7;
    CHECK_RC(cudaDeviceCanAccessPeer(&can, 0, 3), cudaErrorInvalidDevice);
    CHECK_RC(cudaDeviceCanAccessPeer(&can, -1, 0), cudaErrorInvalidDevice);
    CHECK(can == 7); /* untouched */
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_RC(cudaDeviceCanAccessPeer(NULL, 0, 1), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);

    /* Enabling from the current device (0): flags must be 0, the peer another device. */
    CHECK_RC(cudaDeviceEnablePeerAccess(1, 1), cudaErrorInvalidValue);
    CHECK_RC(cudaPeekAtLastError(), cudaErrorInvalidValue);
    CHECK_RC(cudaDeviceEnablePeerAccess(3, 0), cudaErrorInvalidDevice);
    CHECK_RC(cudaDeviceEnablePeerAccess(-1, 0), cudaErrorInvalidDevice);
    CHECK_RC(cudaDeviceEnablePeerAccess(0, 0), cudaErrorInvalidDevice);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK(fakecudart_counter("peer_enables") == 0);
    CHECK_RC(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    CHECK_RC(cudaDeviceEnablePeerAccess(2, 0), cudaSuccess);
    CHECK_RC(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_RC(cudaGetLastError(), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_RC(cudaGetLastError(), cudaSuccess);
    CHECK(strcmp(cudaGetErrorName(cudaErrorPeerAccessAlreadyEnabled),
                 "cudaErrorPeerAccessAlreadyEnabled") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorPeerAccessNotEnabled),
                 "peer access has not been enabled") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorIllegalAddress),
                 "an illegal memory access was encountered") == 0);

    /* Access is one way: device 1 has not enabled device 0 yet. */
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaGetLastError(), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
    CHECK_RC(cudaSetDevice(2), cudaSuccess);
    CHECK_RC(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);

    /* Disabling. */
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaDeviceDisablePeerAccess(2), cudaSuccess);
    CHECK_RC(cudaDeviceDisablePeerAccess(2), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaDeviceDisablePeerAccess(3), cudaErrorInvalidDevice);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidDevice);
    CHECK_RC(cudaDeviceEnablePeerAccess(2, 0), cudaSuccess); /* again after a disable */
    CHECK(fakecudart_counter("peer_enables") == 5);

    /* Resetting device 0 ends its access both ways (0 -> 1, 0 -> 2, 1 -> 0), not 2 -> 1. */
    CHECK_RC(cudaDeviceReset(), cudaSuccess);
    CHECK_RC(cudaDeviceDisablePeerAccess(1), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaDeviceDisablePeerAccess(2), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaSetDevice(1), cudaSuccess);
    CHECK_RC(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    CHECK_RC(cudaSetDevice(2), cudaSuccess);
    CHECK_RC(cudaDeviceDisablePeerAccess(1), cudaSuccess);
    CHECK_RC(cudaGetLastError(), cudaErrorPeerAccessNotEnabled);

    /* Peer access or not, cudaMalloc memory is usable from every device. */
    void *p = NULL;
    cudaStream_t s;
    CHECK_RC(cudaMalloc(&p, 4096), cudaSuccess); /* on device 2 */
    CHECK_RC(cudaSetDevice(0), cudaSuccess);
    CHECK_RC(cudaStreamCreate(&s), cudaSuccess);
    CHECK_RC(cudaMemset(p, 1, 4096), cudaSuccess);
    CHECK_RC(fakecudart_launch(p, 4096, s, 10), cudaSuccess);
    CHECK_RC(cudaFree(p), cudaSuccess);
    CHECK_RC(cudaStreamDestroy(s), cudaSuccess);
    CHECK(fakecudart_counter("vmm_access_faults") == 0);
}

static void clock_and_streams(void) {
    void *p, *q;
    CHECK_RC(cudaMalloc(&p, MiB), cudaSuccess);
    CHECK_RC(cudaMalloc(&q, MiB), cudaSuccess);
    cudaStream_t s1, s2;
    CHECK_RC(cudaStreamCreate(&s1), cudaSuccess);
    CHECK_RC(cudaStreamCreate(&s2), cudaSuccess);
    CHECK(fakecudart_now() == 0);

    /* Work on one stream is ordered: the second launch starts when the first ends. */
    CHECK_RC(fakecudart_launch(p, 100, s1, 10), cudaSuccess);
    CHECK_RC(fakecudart_launch(q, 100, s1, 10), cudaSuccess);
    CHECK(fakecudart_range_busy_until(p, 100) == 10);
    CHECK(fakecudart_range_busy_until(q, 100) == 20);
    CHECK(fakecudart_range_busy(p, 1) && fakecudart_range_busy((char *)p + 99, 1));
    CHECK(!fakecudart_range_busy((char *)p + 100, 1000));
    CHECK(fakecudart_pending_work() == 2);
    CHECK_RC(cudaStreamQuery(s1), cudaErrorNotReady);
    CHECK_RC(cudaStreamQuery(s2), cudaSuccess);
    fakecudart_advance(10);
    CHECK(!fakecudart_range_busy(p, 100) && fakecudart_range_busy(q, 100));
    CHECK_RC(cudaStreamSynchronize(s1), cudaSuccess);
    CHECK(fakecudart_now() == 20 && !fakecudart_range_busy(q, 100));
    CHECK_RC(cudaStreamQuery(s1), cudaSuccess);

    /* Different streams run concurrently; an event completes with its stream's earlier work. */
    cudaEvent_t e1, e2;
    CHECK_RC(cudaEventCreate(&e1), cudaSuccess);
    CHECK_RC(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming), cudaSuccess);
    CHECK_RC(cudaEventQuery(e1), cudaSuccess); /* never recorded */
    CHECK_RC(fakecudart_launch(p, MiB, s1, 30), cudaSuccess);
    CHECK_RC(fakecudart_launch(q, MiB, s2, 5), cudaSuccess);
    CHECK_RC(cudaEventRecord(e1, s1), cudaSuccess);
    CHECK_RC(cudaEventRecord(e2, s2), cudaSuccess);
    CHECK_RC(cudaEventQuery(e1), cudaErrorNotReady);
    CHECK_RC(cudaEventQuery(e2), cudaErrorNotReady);
    CHECK_RC(cudaPeekAtLastError(), cudaSuccess); /* not-ready answers are not errors */
    fakecudart_advance(5);
    CHECK_RC(cudaEventQuery(e2), cudaSuccess);
    CHECK_RC(cudaEventQuery(e1), cudaErrorNotReady);
    CHECK_RC(cudaEventSynchronize(e1), cudaSuccess);
    CHECK(fakecudart_now() == 50);
    CHECK_RC(cudaEventQuery(e1), cudaSuccess);
    CHECK(!fakecudart_range_busy(p, MiB));

    /* cudaStreamWaitEvent orders a stream after another stream's work. */
    CHECK_RC(fakecudart_launch(p, 1, s1, 40), cudaSuccess);
    CHECK_RC(cudaEventRecord(e1, s1), cudaSuccess);
    CHECK_RC(cudaStreamWaitEvent(s2, e1, 0), cudaSuccess);
    CHECK_RC(fakecudart_launch(q, 1, s2, 1), cudaSuccess);
    CHECK(fakecudart_range_busy_until(q, 1) == 91);
    /* cudaDeviceSynchronize completes everything. */
    CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
    CHECK(fakecudart_now() == 91 && fakecudart_pending_work() == 0);

    /* Elapsed time: one tick is one microsecond. */
    cudaEvent_t start, stop;
    CHECK_RC(cudaEventCreate(&start), cudaSuccess);
    CHECK_RC(cudaEventCreate(&stop), cudaSuccess);
    CHECK_RC(cudaEventRecord(start, s1), cudaSuccess);
    CHECK_RC(fakecudart_launch(NULL, 0, s1, 2500), cudaSuccess);
    CHECK_RC(cudaEventRecord(stop, s1), cudaSuccess);
    float ms = 0;
    CHECK_RC(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
    CHECK_RC(cudaEventSynchronize(stop), cudaSuccess);
    CHECK_RC(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    CHECK(ms > 2.49f && ms < 2.51f);
    CHECK_RC(cudaEventElapsedTime(&ms, start, e2), cudaErrorInvalidResourceHandle);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidResourceHandle);

    /* cudaFree waits for the device, like the real one. */
    CHECK_RC(fakecudart_launch(p, MiB, s2, 1000), cudaSuccess);
    uint64_t before = fakecudart_now();
    CHECK_RC(cudaFree(p), cudaSuccess);
    CHECK(fakecudart_now() == before + 1000);
    CHECK(fakecudart_counter("implicit_syncs") == 1);

    /* A destroyed stream's work still completes; its handle is gone. */
    CHECK_RC(fakecudart_launch(q, MiB, s2, 7), cudaSuccess);
    CHECK_RC(cudaStreamDestroy(s2), cudaSuccess);
    CHECK(fakecudart_range_busy(q, MiB));
    CHECK_RC(cudaStreamSynchronize(s2), cudaErrorInvalidResourceHandle);
    CHECK_RC(fakecudart_launch(q, 1, s2, 1), cudaErrorInvalidResourceHandle);
    CHECK_RC(cudaStreamDestroy(0), cudaErrorInvalidResourceHandle);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    fakecudart_advance(7);
    CHECK(!fakecudart_range_busy(q, MiB));

    /* Launches must stay inside a live allocation. */
    CHECK_RC(fakecudart_launch(q, MiB + 1, s1, 1), cudaErrorInvalidValue);
    CHECK_RC(fakecudart_launch(p, 1, s1, 1), cudaErrorInvalidValue);

    CHECK(fakecudart_counter("event_records") == 5);
    CHECK(fakecudart_counter("device_syncs") == 1);
    CHECK(fakecudart_counter("stream_creates") == 2 && fakecudart_counter("stream_destroys") == 1);
    CHECK_RC(cudaEventDestroy(e1), cudaSuccess);
    CHECK_RC(cudaEventDestroy(e1), cudaErrorInvalidResourceHandle);
    CHECK_RC(cudaFree(q), cudaSuccess);
}

/* Work of 30 ticks on the calling thread's own default stream. */
static void *launch_on_own_default_stream(void *p) {
    CHECK_RC(fakecudart_launch(p, 8, cudaStreamPerThread, 30), cudaSuccess);
    return NULL;
}

/*
 * The legacy default stream waits for blocking streams, not for non-blocking ones: an event
 * recorded on stream 0 after work on a blocking stream completes with that work; after work on a
 * cudaStreamNonBlocking stream it completes at once, while that work still runs.
 */
static void legacy_stream(void) {
    void *p;
    CHECK_RC(cudaMalloc(&p, MiB), cudaSuccess);
    cudaStream_t blocking, nonblocking, other;
    CHECK_RC(cudaStreamCreate(&blocking), cudaSuccess);
    CHECK_RC(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
    unsigned flags = 99;
    CHECK_RC(cudaStreamGetFlags(nonblocking, &flags), cudaSuccess);
    CHECK(flags == cudaStreamNonBlocking);
    CHECK_RC(cudaStreamCreateWithFlags(&other, 2), cudaErrorInvalidValue);
    CHECK_RC(cudaGetLastError(), cudaErrorInvalidValue);
    cudaEvent_t e;
    CHECK_RC(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);

    /* Blocking stream: the legacy-stream event waits for it. */
    CHECK_RC(fakecudart_launch(p, MiB, blocking, 100), cudaSuccess);
    CHECK_RC(cudaEventRecord(e, 0), cudaSuccess);
    CHECK_RC(cudaEventQuery(e), cudaErrorNotReady);
    fakecudart_advance(99);
    CHECK_RC(cudaEventQuery(e), cudaErrorNotReady);
    fakecudart_advance(1);
    CHECK_RC(cudaEventQuery(e), cudaSuccess);
    CHECK(!fakecudart_range_busy(p, MiB));

    /* Non-blocking stream: the legacy-stream event does not wait; the memory is still busy. */
    CHECK_RC(fakecudart_launch(p, MiB, nonblocking, 100), cudaSuccess);
    CHECK_RC(cudaEventRecord(e, cudaStreamLegacy), cudaSuccess);
    CHECK_RC(cudaEventQuery(e), cudaSuccess);
    CHECK(fakecudart_range_busy(p, MiB));
    /* Synchronizing the legacy stream does not wait for it either; the device does. */
    CHECK_RC(cudaStreamSynchronize(0), cudaSuccess);
    CHECK(fakecudart_range_busy(p, MiB));
    CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
    CHECK(!fakecudart_range_busy(p, MiB));

    /* A blocking stream waits for earlier legacy-stream work; a non-blocking one does not. */
    uint64_t t0 = fakecudart_now();
    CHECK_RC(fakecudart_launch(NULL, 0, 0, 50), cudaSuccess);
    CHECK_RC(fakecudart_launch(p, 1, blocking, 1), cudaSuccess);
    CHECK_RC(fakecudart_launch((char *)p + 1, 1, nonblocking, 1), cudaSuccess);
    CHECK(fakecudart_range_busy_until(p, 1) == t0 + 51);
    CHECK(fakecudart_range_busy_until((char *)p + 1, 1) == t0 + 1);

    /* cudaStreamPerThread is a blocking stream too. */
    CHECK_RC(cudaDeviceSynchronize(), cudaSuccess);
    t0 = fakecudart_now();
    CHECK_RC(fakecudart_launch(p, 8, cudaStreamPerThread, 20), cudaSuccess);
    CHECK_RC(cudaEventRecord(e, 0), cudaSuccess);
    CHECK_RC(cudaEventSynchronize(e), cudaSuccess);
    CHECK(fakecudart_now() == t0 + 20);

    /* A destroyed blocking stream's pending work still orders the legacy stream. */
    CHECK_RC(fakecudart_launch(p, 8, blocking, 30), cudaSuccess);
    CHECK_RC(cudaStreamDestroy(blocking), cudaSuccess);
    CHECK_RC(cudaEventRecord(e, 0), cudaSuccess);
    CHECK_RC(cudaEventQuery(e), cudaErrorNotReady);
    CHECK_RC(cudaEventSynchronize(e), cudaSuccess);
    CHECK(fakecudart_now() == t0 + 50);

    /* Each thread has its own: another thread's work there does not order this thread's, and
     * the legacy stream waits for both. */
    t0 = fakecudart_now();
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, launch_on_own_default_stream, p) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK_RC(fakecudart_launch((char *)p + 8, 8, cudaStreamPerThread, 5), cudaSuccess);
    CHECK(fakecudart_range_busy_until((char *)p + 8, 8) == t0 + 5);
    CHECK_RC(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    CHECK(fakecudart_now() == t0 + 5 && fakecudart_range_busy(p, 8));
    CHECK_RC(cudaEventRecord(e, 0), cudaSuccess);
    CHECK_RC(cudaEventSynchronize(e), cudaSuccess);
    CHECK(fakecudart_now() == t0 + 30);

    CHECK_RC(cudaStreamDestroy(nonblocking), cudaSuccess);
    CHECK_RC(cudaEventDestroy(e), cudaSuccess);
    CHECK_RC(cudaFree(p), cudaSuccess);
}

/* Run with FAKECUDART_FAIL=35: what the real runtime answers on a machine without a driver. */
static void no_driver(void) {
    void *p = (void *)0xdead;
    CHECK_RC(cudaMalloc(&p, MiB), cudaErrorInsufficientDriver);
    CHECK(p == (void *)0xdead);
    CHECK_RC(cudaFree(NULL), cudaErrorInsufficientDriver);
    size_t free_b, total;
    CHECK_RC(cudaMemGetInfo(&free_b, &total), cudaErrorInsufficientDriver);
    int n = 5, v = -1;
    CHECK_RC(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver);
    CHECK(n == 0);
    CHECK_RC(cudaGetLastError(), cudaErrorInsufficientDriver);
    CHECK_RC(cudaGetLastError(), cudaErrorInsufficientDriver);
    CHECK_RC(cudaDriverGetVersion(&v), cudaSuccess);
    CHECK(v == 0);
    CHECK_RC(cudaRuntimeGetVersion(&v), cudaSuccess);
    CHECK(v == 12090);
    CHECK(strcmp(cudaGetErrorString(cudaErrorInsufficientDriver),
                 "CUDA driver version is insufficient for CUDA runtime version") == 0);
    CHECK(fakecudart_counter("mallocs") == 0);
}

/* Run with FAKECUDART_DEVICES=0. */
static void no_device(void) {
    int n = 5;
    CHECK_RC(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    CHECK(n == 0);
    void *p;
    CHECK_RC(cudaMalloc(&p, 1), cudaErrorNoDevice);
}

/* Run with FAKECUDART_CAPACITY=1MiB and FAKECUDART_CONTEXT=256KiB: the context's bytes are in
 * the total, never free, and not allocatable. */
static void context(void) {
    size_t free_b = 0, total_b = 0;
    CHECK_RC(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    CHECK(total_b == MiB && free_b == MiB / 4 * 3);
    void *a = NULL, *b = NULL;
    CHECK_RC(cudaMalloc(&a, MiB / 4 * 3 + 1), cudaErrorMemoryAllocation);
    CHECK_RC(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_RC(cudaMalloc(&a, MiB / 2), cudaSuccess);
    CHECK_RC(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    CHECK(total_b == MiB && free_b == MiB / 4);
    CHECK_RC(cudaMalloc(&b, MiB / 4), cudaSuccess);
    CHECK_RC(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    CHECK(free_b == 0);
    CHECK_RC(cudaFree(a), cudaSuccess);
    CHECK_RC(cudaFree(b), cudaSuccess);
}

/* Prints the capacity of device 0 as cudaMemGetInfo reports it, or the error code. */
static void total(void) {
    size_t free_b = 0, total_b = 0;
    cudaError_t rc = cudaMemGetInfo(&free_b, &total_b);
    if (rc != cudaSuccess)
        printf("error %d\n", (int)rc);
    else
        printf("total %zu\n", total_b);
}

#define THREADS 8
#define ROUNDS 500

static void *alloc_worker(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        void *p;
        CHECK_RC(cudaMalloc(&p, 4096 + (size_t)i), cudaSuccess);
        ((volatile char *)p)[0] = 1;
        CHECK_RC(cudaFree(p), cudaSuccess);
    }
    void *p;
    CHECK_RC(cudaMalloc(&p, (size_t)1 << 40), cudaErrorMemoryAllocation);
    CHECK_RC(cudaGetLastError(), cudaErrorMemoryAllocation);
    return NULL;
}

static void threads(void) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, alloc_worker, NULL) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(fakecudart_counter("mallocs") == THREADS * ROUNDS);
    CHECK(fakecudart_counter("frees") == THREADS * ROUNDS);
    CHECK(fakecudart_counter("malloc_failures") == THREADS);
    CHECK(fakecudart_counter("bytes_in_use") == 0);
    CHECK_RC(cudaGetLastError(), cudaSuccess); /* other threads' errors are not ours */
}

/*
 * The runtime loads the driver at its first call, as the real one: libcuda.so.1 is not in the
 * process before (this program does not link it), and is after, found without loading it again
 * (what a preloaded library does). With FAKECUDART_FAIL=35, "no driver", it stays out.
 */
static void driver_load(void) {
    CHECK(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL);
    const char *fail = getenv("FAKECUDART_FAIL");
    int no_driver = fail != NULL && strcmp(fail, "35") == 0;
    int n = 0;
    CHECK_RC(cudaGetDeviceCount(&n), no_driver ? cudaErrorInsufficientDriver : cudaSuccess);
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (no_driver) {
        CHECK(driver == NULL);
        return;
    }
    CHECK(driver != NULL);
    CHECK(dlsym(driver, "cuMemCreate") != NULL && dlsym(driver, "cuMemAddressReserve") != NULL);
    /* The driver shares the runtime's state: it is initialized, and its calls count here. */
    int (*get_count)(int *) = (int (*)(int *))dlsym(driver, "cuDeviceGetCount");
    CHECK(get_count != NULL);
    n = 0;
    CHECK(get_count(&n) == 0 && n == 2);
    CHECK(get_count(NULL) == 1);
    CHECK(fakecudart_counter("driver_errors") == 1);
}

/* A cudaMalloc during a capture: refused in the thread's default (global) mode, tolerated in
 * relaxed mode. */
static cudaError_t malloc_in_mode(void **p, size_t size, enum cudaStreamCaptureMode mode) {
    enum cudaStreamCaptureMode previous = mode;
    cudaThreadExchangeStreamCaptureMode(&previous);
    cudaError_t rc = cudaMalloc(p, size);
    cudaThreadExchangeStreamCaptureMode(&previous);
    return rc;
}

static void capture(void) {
    cudaStream_t s, blocking;
    CHECK_RC(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_RC(cudaStreamCreate(&blocking), cudaSuccess);
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    CHECK_RC(cudaStreamIsCapturing(s, &status), cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusNone);
    CHECK_RC(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
             cudaErrorStreamCaptureUnsupported);
    cudaGraph_t graph = NULL;
    CHECK_RC(cudaStreamEndCapture(s, &graph), cudaErrorIllegalState);

    /* A relaxed cudaMalloc is tolerated; a cudaFree, even relaxed, ends the capture. */
    void *p = NULL, *q = NULL;
    CHECK_RC(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
    CHECK_RC(cudaStreamIsCapturing(s, &status), cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusActive);
    CHECK_RC(cudaStreamIsCapturing(cudaStreamLegacy, &status), cudaSuccess);
    CHECK_RC(malloc_in_mode(&q, 4096, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_RC(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK(graph != NULL);
    CHECK_RC(cudaGraphDestroy(graph), cudaSuccess);
    CHECK(fakecudart_counter("captures_invalidated") == 0);

    /* In global mode a cudaMalloc ends it; the end answers 901 and no graph. */
    CHECK_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_RC(malloc_in_mode(&q, 4096, cudaStreamCaptureModeGlobal),
             cudaErrorStreamCaptureUnsupported);
    CHECK_RC(cudaStreamIsCapturing(s, &status), cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusInvalidated);
    CHECK_RC(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    CHECK(graph == NULL);
    CHECK(fakecudart_counter("captures_invalidated") == 1);

    /* A device synchronization ends any capture, whatever the mode; so does a cudaFree. */
    CHECK_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    CHECK_RC(cudaThreadExchangeStreamCaptureMode(&relaxed), cudaSuccess);
    CHECK_RC(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    CHECK_RC(cudaThreadExchangeStreamCaptureMode(&relaxed), cudaSuccess);
    CHECK(relaxed == cudaStreamCaptureModeRelaxed);
    CHECK_RC(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    CHECK_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_RC(cudaFree(p), cudaErrorStreamCaptureUnsupported);
    CHECK_RC(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    CHECK(fakecudart_counter("captures_invalidated") == 3);
    CHECK(fakecudart_counter("capture_refusals") == 3);
    CHECK_RC(cudaFree(p), cudaSuccess);

    /* A blocking stream's capture shows on the legacy stream. */
    CHECK_RC(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_RC(cudaStreamIsCapturing(cudaStreamLegacy, &status), cudaErrorStreamCaptureImplicit);
    CHECK_RC(cudaStreamEndCapture(blocking, &graph), cudaSuccess);
    CHECK(fakecudart_counter("captures_begun") == 5);
    CHECK(fakecudart_counter("capture_queries") == 5);
    CHECK_RC(cudaFree(q), cudaSuccess);

    /* An event recorded on a capturing stream is a captured event: querying or synchronizing it
     * answers 907, during the capture and after it, until it is recorded outside a capture. A
     * non-blocking stream's capture leaves the legacy stream usable. */
    cudaEvent_t ev;
    CHECK_RC(cudaEventCreate(&ev), cudaSuccess);
    CHECK_RC(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_RC(cudaEventRecord(ev, s), cudaSuccess);
    CHECK_RC(cudaEventQuery(ev), cudaErrorCapturedEvent);
    CHECK_RC(cudaGetLastError(), cudaErrorCapturedEvent);
    cudaEvent_t legacy_ev;
    CHECK_RC(cudaEventCreate(&legacy_ev), cudaSuccess);
    CHECK_RC(cudaEventRecord(legacy_ev, cudaStreamLegacy), cudaSuccess);
    CHECK_RC(cudaEventQuery(legacy_ev), cudaSuccess);
    CHECK_RC(cudaStreamEndCapture(s, &graph), cudaSuccess);
    CHECK(graph != NULL);
    CHECK_RC(cudaGraphDestroy(graph), cudaSuccess);
    CHECK_RC(cudaEventQuery(ev), cudaErrorCapturedEvent);
    CHECK_RC(cudaEventSynchronize(ev), cudaErrorCapturedEvent);
    CHECK_RC(cudaEventRecord(ev, s), cudaSuccess);
    CHECK_RC(cudaEventQuery(ev), cudaSuccess);
    CHECK_RC(cudaEventSynchronize(ev), cudaSuccess);
    CHECK(fakecudart_counter("captures_invalidated") == 3);

    /* While a blocking stream captures, the legacy stream is unusable: an event recorded on it
     * ends that capture and answers 906. */
    CHECK_RC(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed), cudaSuccess);
    CHECK_RC(cudaEventRecord(ev, cudaStreamLegacy), cudaErrorStreamCaptureImplicit);
    CHECK_RC(cudaStreamEndCapture(blocking, &graph), cudaErrorStreamCaptureInvalidated);
    CHECK(graph == NULL);
    CHECK(fakecudart_counter("captures_invalidated") == 4);
    CHECK(fakecudart_counter("capture_refusals") == 4);
    CHECK_RC(cudaEventRecord(ev, cudaStreamLegacy), cudaSuccess);
    CHECK_RC(cudaEventQuery(ev), cudaSuccess);
    CHECK_RC(cudaEventDestroy(ev), cudaSuccess);
    CHECK_RC(cudaEventDestroy(legacy_ev), cudaSuccess);
}

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"alloc", alloc},         {"oom", oom},           {"devices", devices},
    {"clock", clock_and_streams}, {"legacy", legacy_stream}, {"no-driver", no_driver},
    {"no-device", no_device}, {"total", total},       {"threads", threads},
    {"context", context},
    {"driver-load", driver_load}, {"peer", peer}, {"ipc", ipc},
    {"capture", capture},
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        if (strcmp(scenarios[i].name, argv[1]) == 0) {
            scenarios[i].run();
            printf("ok %s\n", argv[1]);
            return 0;
        }
    }
    fprintf(stderr, "unknown scenario '%s'\n", argv[1]);
    return 2;
}
