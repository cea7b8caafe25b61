/*
 * torch_hooks_check.c — calls the pluggable-allocator entry points as PyTorch does
 * (cachealloc_torch_malloc/free, and the hooks set with set_record_stream_fn and set_reset_fn),
 * with the fake runtime's simulated kernels standing in for device work. Prints "ok torch hooks"
 * when every check held, under any free_sync policy (CACHEALLOC_CONF); with the argument
 * "unrecorded" it frees without recording the side stream and prints whether the block came back
 * while the side stream's work still used it; with "failed_free" it checks a recorded free that
 * fails and is made again, printing "ok failed free"; with "third_device_reset" (three devices)
 * it checks that a reset of one device leaves the waits on another's streams, printing
 * "ok third device reset"; with "contract" it checks what PyTorch's CUDAPluggableAllocator relies
 * on from malloc and free (streams, devices, size 0, the arguments free does not need), printing
 * "ok contract"; with "hook_failures" it makes the free and empty-cache hooks fail, printing
 * "ok hook failures" (the log says what failed); with "base_alloc" (or "base_alloc_expandable",
 * under expandable segments) it checks the set_base_alloc_fn hook, printing "ok base alloc".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cachealloc.h>

#include "fakecudart.h"

#include "check.h"

#define MIB ((size_t)1 << 20)

/* The program's own cudaFree of a 1 MiB block of `home` that `worker` reads for `ticks` and that
 * was recorded on `recorded` (followed by a cudaDeviceSynchronize when `sync`): the next 1 MiB
 * block of `home` is not that one while the work runs. */
static void check_cuda_free_waits(cudaStream_t home, cudaStream_t worker, cudaStream_t recorded,
                                  uint64_t ticks, int sync) {
    void *c = NULL, *d = NULL;
    CHECK(cachealloc_malloc(&c, MIB, 0, home) == 0);
    CHECK(fakecudart_launch(c, MIB, worker, ticks) == 0);
    CHECK(cachealloc_record_stream(c, recorded) == 0);
    CHECK(cudaFree(c) == 0);
    if (sync)
        CHECK(cudaDeviceSynchronize() == 0);
    CHECK(cachealloc_malloc(&d, MIB, 0, home) == 0);
    CHECK(!(d == c && fakecudart_range_busy(c, MIB)));
    CHECK(cachealloc_free(d) == 0);
}

static void run(int record) {
    cudaStream_t side;
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == 0);

    /* A tensor of the default stream, read by a long kernel on a non-blocking side stream,
     * freed while that kernel runs: the next tensor of the same size on the default stream
     * must not get its block before the kernel is done. */
    void *x = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(x != NULL);
    CHECK(fakecudart_launch(x, MIB, side, 1000000) == 0);
    if (record) {
        cachealloc_torch_record_stream(x, side);
    }
    cachealloc_torch_free(x, MIB, 0, NULL);
    uint64_t syncs = fakecudart_counter("device_syncs");
    void *y = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(y != NULL);
    int reused_while_busy = y == x && fakecudart_range_busy(x, MIB);
    if (!record) {
        printf("reused while busy: %d\n", reused_while_busy);
        return;
    }
    CHECK(!reused_while_busy);
    /* The pool grows rather than synchronize the device for a recorded free (PyTorch polls its
     * events), and the block comes back once the side stream's work is done. */
    void *w = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(w != NULL && w != x && fakecudart_range_busy(x, MIB));
    CHECK(fakecudart_counter("device_syncs") == syncs);
    fakecudart_advance(1000000);
    /* Two blocks of this size are free now, x and the rest of w's segment: two tensors take
     * both (whichever order their addresses have), with no new segment. */
    void *v1 = cachealloc_torch_malloc(MIB, 0, NULL);
    void *v2 = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(v1 == x || v2 == x);
    cachealloc_torch_free(v1 == x ? v2 : v1, MIB, 0, NULL);
    void *v = x;

    /* Recorded on two side streams: reused only when both are done. */
    cudaStream_t side2;
    CHECK(cudaStreamCreateWithFlags(&side2, cudaStreamNonBlocking) == 0);
    CHECK(fakecudart_launch(v, MIB, side, 1000) == 0);
    CHECK(fakecudart_launch(v, MIB, side2, 3000) == 0);
    cachealloc_torch_record_stream(v, side);
    cachealloc_torch_record_stream(v, side2);
    cachealloc_torch_record_stream(v, side);
    cachealloc_torch_free(v, MIB, 0, NULL);
    fakecudart_advance(2000);
    void *u = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(u != x && fakecudart_range_busy(x, MIB));
    fakecudart_advance(1000);
    void *t = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(t == x);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    cachealloc_torch_free(t, MIB, 0, NULL);
    cachealloc_torch_free(u, MIB, 0, NULL);
    cachealloc_torch_free(w, MIB, 0, NULL);

    /* A tensor recorded on a stream of another device waits for an event of that device on
     * that stream, as PyTorch records on the stream's own device; the program's current device
     * stays as it was. On a stream of their own, a and a2 fill one 2 MiB segment. */
    cudaStream_t home, elsewhere;
    CHECK(cudaStreamCreateWithFlags(&home, cudaStreamNonBlocking) == 0);
    CHECK(cudaSetDevice(1) == 0);
    CHECK(cudaStreamCreateWithFlags(&elsewhere, cudaStreamNonBlocking) == 0);
    CHECK(cudaSetDevice(0) == 0);
    void *a = NULL, *a2 = NULL, *b = NULL, *a3 = NULL;
    CHECK(cachealloc_malloc(&a, MIB, 0, home) == 0);
    CHECK(cachealloc_malloc(&a2, MIB, 0, home) == 0);
    CHECK(fakecudart_launch(a, MIB, elsewhere, 5000) == 0);
    CHECK(cachealloc_record_stream(a, elsewhere) == 0);
    CHECK(cachealloc_free(a) == 0);
    CHECK(cachealloc_malloc(&b, MIB, 0, home) == 0);
    CHECK(b != a && fakecudart_range_busy(a, MIB));
    fakecudart_advance(5000);
    /* Two blocks of this size are free now, a and the rest of b's segment. Retiring the other
     * device's event leaves the program's own unread error (an invalid device) as it was. */
    void *a4 = NULL;
    CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice);
    CHECK(cachealloc_malloc(&a3, MIB, 0, home) == 0);
    CHECK(cachealloc_malloc(&a4, MIB, 0, home) == 0);
    CHECK(a3 == a || a4 == a);
    CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
    CHECK(fakecudart_counter("device_syncs") == syncs);
    int current = -1;
    CHECK(cudaGetDevice(&current) == 0 && current == 0);
    CHECK(cudaGetLastError() == 0);
    CHECK(cachealloc_free(a3 == a ? a4 : a3) == 0);
    CHECK(cachealloc_free(a) == 0);
    CHECK(cachealloc_free(b) == 0);
    /* The program's own cudaFree of such an allocation waits for that stream too, also after
     * a synchronization of this device (the fence of free_sync:device). */
    check_cuda_free_waits(home, elsewhere, elsewhere, 1000000, 1);
    fakecudart_advance(1000000);

    /* The other device is reset while a block waits for its stream: that work is gone, so the
     * block comes back, and the event it waited on (destroyed by the reset) is not touched
     * again: an event the program creates next may have its handle (not in the fake, which
     * counts the calls instead). */
    CHECK(cachealloc_malloc(&a, MIB, 0, home) == 0);
    CHECK(fakecudart_launch(a, MIB, elsewhere, 1000000) == 0);
    CHECK(cachealloc_record_stream(a, elsewhere) == 0);
    CHECK(cachealloc_free(a) == 0);
    /* Growing the pool waits for no other device's stream (a synchronization before growing,
     * which free_sync:device makes for the pending cudaFree of f, covers this device only):
     * only giving memory back does. */
    void *f = NULL, *big = NULL;
    CHECK(cachealloc_malloc(&f, 8 * MIB, 0, NULL) == 0);
    CHECK(cudaFree(f) == 0);
    uint64_t event_syncs = fakecudart_counter("event_syncs");
    CHECK(cachealloc_malloc(&big, 64 * MIB, 0, NULL) == 0);
    CHECK(fakecudart_counter("event_syncs") == event_syncs);
    CHECK(fakecudart_range_busy(a, MIB));
    CHECK(cachealloc_free(big) == 0);
    /* A query of the other device's event that fails for another reason than that device's
     * reset (here 900, as during a graph capture) is reported, not taken for completion. */
    void *kept = NULL;
    CHECK(fakecudart_inject_call_failures("cudaEventQuery", 1, 900) == 0);
    CHECK(cachealloc_malloc(&kept, MIB, 0, home) == 900);
    CHECK(cudaGetLastError() == 0); /* reported by its return code only */
    CHECK(cachealloc_malloc(&kept, MIB, 0, home) == 0);
    CHECK(kept != a);
    CHECK(cachealloc_free(kept) == 0);
    /* A reset of the other device that fails ends none of its work: the block still waits. */
    CHECK(fakecudart_inject_call_failures("cudaDeviceReset", 1, cudaErrorUnknown) == 0);
    CHECK(cudaSetDevice(1) == 0);
    CHECK(cudaDeviceReset() == cudaErrorUnknown);
    CHECK(cudaGetLastError() == cudaErrorUnknown);
    CHECK(cudaSetDevice(0) == 0);
    CHECK(cachealloc_malloc(&kept, MIB, 0, home) == 0);
    CHECK(kept != a);
    CHECK(cachealloc_free(kept) == 0);
    CHECK(fakecudart_range_busy(a, MIB));
    cudaEvent_t mine;
    CHECK(cudaSetDevice(1) == 0);
    CHECK(cudaDeviceReset() == 0);
    CHECK(cudaEventCreate(&mine) == 0);
    CHECK(cudaSetDevice(0) == 0);
    uint64_t stale = fakecudart_counter("stale_event_calls");
    CHECK(cachealloc_malloc(&a3, MIB, 0, home) == 0);
    CHECK(a3 == a);
    CHECK(fakecudart_counter("stale_event_calls") == stale);
    CHECK(cudaEventQuery(mine) == 0);
    CHECK(cudaGetLastError() == 0);
    CHECK(cachealloc_free(a3) == 0);
    CHECK(cachealloc_free(a2) == 0);

    /* A pool dropped by its device's reset destroys the events it recorded on other devices'
     * streams (the reset takes only its own device's). */
    void *o = NULL;
    CHECK(cudaSetDevice(1) == 0);
    CHECK(cachealloc_malloc(&o, MIB, 1, NULL) == 0);
    CHECK(fakecudart_launch(o, MIB, home, 1000) == 0);
    CHECK(cachealloc_record_stream(o, home) == 0);
    CHECK(cachealloc_free(o) == 0);
    uint64_t destroys = fakecudart_counter("event_destroys");
    CHECK(cudaDeviceReset() == 0);
    CHECK(fakecudart_counter("event_destroys") == destroys + 1);
    CHECK(cudaSetDevice(0) == 0);
    CHECK(cudaGetLastError() == 0);

    /* A stream whose device the runtime cannot name (here a destroyed one; a runtime before
     * CUDA 12.8 has no cudaStreamGetDevice for another device's stream) is not waited for: the
     * free goes through with a warning, and leaves no error behind. */
    cudaStream_t gone;
    CHECK(cudaStreamCreate(&gone) == 0);
    CHECK(cudaStreamDestroy(gone) == 0);
    CHECK(cachealloc_malloc(&a, 3 * MIB, 0, NULL) == 0);
    CHECK(cachealloc_record_stream(a, gone) == 0);
    CHECK(cachealloc_free(a) == 0);
    CHECK(cudaGetLastError() == 0);
    CHECK(cachealloc_malloc(&a3, 3 * MIB, 0, NULL) == 0);
    CHECK(a3 == a);
    CHECK(cachealloc_free(a3) == 0);

    /* Recorded frees complete each on its own: a block whose stream is done is reused while an
     * earlier free still waits for a busy stream. On a stream of their own, p1 and p2 fill one
     * 2 MiB segment. */
    cudaStream_t own;
    CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) == 0);
    void *p1 = cachealloc_torch_malloc(MIB, 0, own);
    void *p2 = cachealloc_torch_malloc(MIB, 0, own);
    CHECK(fakecudart_launch(p1, MIB, side, 1000000) == 0);
    CHECK(fakecudart_launch(p2, MIB, side2, 1000) == 0);
    cachealloc_torch_record_stream(p1, side);
    cachealloc_torch_record_stream(p2, side2);
    cachealloc_torch_free(p1, MIB, 0, own);
    cachealloc_torch_free(p2, MIB, 0, own);
    fakecudart_advance(2000);
    void *q = cachealloc_torch_malloc(MIB, 0, own);
    CHECK(q == p2);
    cachealloc_torch_free(q, MIB, 0, own);

    /* The program's own cudaFree of a recorded allocation waits for the recorded stream too.
     * c2 and the block freed fill a segment of another stream; it is freed while the side
     * stream reads it. */
    cudaStream_t own2;
    CHECK(cudaStreamCreateWithFlags(&own2, cudaStreamNonBlocking) == 0);
    void *c2 = NULL;
    CHECK(cachealloc_malloc(&c2, MIB, 0, own2) == 0);
    check_cuda_free_waits(own2, side, side, 5000, 0);
    /* ... and for its policy's fence: with work on a blocking stream (which the legacy default
     * stream waits for: free_sync:event's fence) and an idle recorded stream, the block is not
     * reused under that work either (free_sync:none waits for no unrecorded stream). */
    const char *conf = getenv("CACHEALLOC_CONF");
    if (!(conf && strstr(conf, "free_sync:none"))) {
        cudaStream_t blocking;
        CHECK(cudaStreamCreate(&blocking) == 0);
        check_cuda_free_waits(own2, blocking, side2, 5000, 0);
    }
    CHECK(cachealloc_free(c2) == 0);

    /* Recording the allocation's own stream defers nothing: the block comes back at once. */
    void *z = cachealloc_torch_malloc(3 * MIB, 0, NULL);
    cachealloc_torch_record_stream(z, NULL);
    cachealloc_torch_free(z, 3 * MIB, 0, NULL);
    CHECK(cachealloc_torch_malloc(3 * MIB, 0, NULL) == z);
    cachealloc_torch_free(z, 3 * MIB, 0, NULL);
    /* A freed tensor is not recorded: 1, logged as a pointer that is no live allocation of
     * cachealloc's (not as memory cachealloc never allocated). */
    CHECK(cachealloc_record_stream(z, side) == 1);
    cachealloc_torch_record_stream(z, side);
    cachealloc_torch_free(z, 3 * MIB, 0, NULL); /* a double free: logged, nothing else */

    /* The C API's own entry point: NULL is nothing to do, a pointer of no allocation is 1. */
    int local;
    CHECK(cachealloc_record_stream(NULL, side) == 0);
    CHECK(cachealloc_record_stream(&local, side) == 1);
    cachealloc_torch_record_stream(&local, side); /* logged, nothing else */

    /* torch.cuda.empty_cache(): the hook gives every fully free segment back, after waiting
     * for recorded streams, another device's too (this device's synchronization does not cover
     * it; its work runs past all of this device's). */
    cudaStream_t elsewhere2;
    CHECK(cudaSetDevice(1) == 0);
    CHECK(cudaStreamCreateWithFlags(&elsewhere2, cudaStreamNonBlocking) == 0);
    CHECK(cudaSetDevice(0) == 0);
    void *e = NULL;
    CHECK(cachealloc_malloc(&e, MIB, 0, home) == 0);
    CHECK(fakecudart_launch(e, MIB, elsewhere2, 3000000) == 0);
    CHECK(cachealloc_record_stream(e, elsewhere2) == 0);
    CHECK(cachealloc_free(e) == 0);
    cachealloc_torch_free(y, MIB, 0, NULL);
    CHECK(fakecudart_device_bytes_in_use(0) > 0);
    cachealloc_torch_empty_cache();
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK(!fakecudart_range_busy(x, MIB));
    CHECK(!fakecudart_range_busy(e, MIB));

    /* A C program has no C++ runtime to throw with: a failed allocation answers NULL. */
    CHECK(cachealloc_torch_malloc((size_t)1 << 50, 0, NULL) == NULL);
    CHECK(cachealloc_torch_mempool_malloc((size_t)1 << 50, 0, NULL) == NULL);
    CHECK(cudaGetLastError() == 0);
    printf("ok torch hooks\n");
}

/* A recorded free that fails (the runtime can create no event to wait with) leaves the
 * allocation live, and its record too: made again, the free still waits for the recorded
 * stream, so the next allocation of the stream does not get the block while that work runs. */
static void failed_free(void) {
    cudaStream_t side;
    void *r = NULL, *next = NULL;
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == 0);
    CHECK(cachealloc_malloc(&r, MIB, 0, NULL) == 0);
    CHECK(fakecudart_launch(r, MIB, side, 1000) == 0);
    CHECK(cachealloc_record_stream(r, side) == 0);
    CHECK(fakecudart_inject_call_failures("cudaEventCreate", 1, cudaErrorMemoryAllocation) == 0);
    CHECK(cachealloc_free(r) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == 0); /* reported by its return code only */
    CHECK(cachealloc_free(r) == 0);
    CHECK(cachealloc_malloc(&next, MIB, 0, NULL) == 0);
    CHECK(!(next == r && fakecudart_range_busy(r, MIB)));
    CHECK(cachealloc_free(next) == 0);
    printf("ok failed free\n");
}

/* Three devices: a block of device 0 recorded on a stream of device 2 still waits for that
 * stream's work through a reset of device 1, and comes back, with no new segment, once that
 * work is done. */
static void third_device_reset(void) {
    cudaStream_t home, far;
    void *a = NULL, *a2 = NULL, *d = NULL;
    CHECK(cudaStreamCreateWithFlags(&home, cudaStreamNonBlocking) == 0);
    CHECK(cudaSetDevice(2) == 0);
    CHECK(cudaStreamCreateWithFlags(&far, cudaStreamNonBlocking) == 0);
    CHECK(cudaSetDevice(0) == 0);
    /* a and a2 fill one 2 MiB segment of their own stream. */
    CHECK(cachealloc_malloc(&a, MIB, 0, home) == 0);
    CHECK(cachealloc_malloc(&a2, MIB, 0, home) == 0);
    CHECK(fakecudart_launch(a, MIB, far, 1000) == 0);
    CHECK(cachealloc_record_stream(a, far) == 0);
    CHECK(cachealloc_free(a) == 0);
    CHECK(cudaSetDevice(1) == 0);
    CHECK(cudaDeviceReset() == 0);
    CHECK(cudaSetDevice(0) == 0);
    CHECK(cachealloc_malloc(&d, MIB, 0, home) == 0);
    CHECK(d != a && fakecudart_range_busy(a, MIB));
    CHECK(cachealloc_free(d) == 0);
    fakecudart_advance(1000);
    /* Two blocks of this size are free now, a and the rest of d's segment. */
    uint64_t mallocs = fakecudart_counter("mallocs");
    void *e = NULL, *e2 = NULL;
    CHECK(cachealloc_malloc(&e, MIB, 0, home) == 0);
    CHECK(cachealloc_malloc(&e2, MIB, 0, home) == 0);
    CHECK(e == a || e2 == a);
    CHECK(fakecudart_counter("mallocs") == mallocs);
    CHECK(cachealloc_free(e) == 0);
    CHECK(cachealloc_free(e2) == 0);
    CHECK(cachealloc_free(a2) == 0);
    printf("ok third device reset\n");
}

/* What PyTorch's CUDAPluggableAllocator relies on from the malloc and free it is given. */
static void contract(void) {
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == 0);
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == 0);
    /* A block belongs to the stream its tensor was allocated on: freed while that stream's
     * kernel still reads it, it goes at once to the next tensor of the same stream (whose work
     * runs after that kernel), never to a tensor of another stream, whose work would not. */
    void *x = cachealloc_torch_malloc(MIB, 0, s1);
    CHECK(x != NULL);
    CHECK(fakecudart_launch(x, MIB, s1, 1000) == 0);
    cachealloc_torch_free(x, MIB, 0, s1);
    void *other = cachealloc_torch_malloc(MIB, 0, s2);
    CHECK(other != NULL && other != x);
    void *same = cachealloc_torch_malloc(MIB, 0, s1);
    CHECK(same == x);
    /* The pointer alone names the block: free's size, device and stream are not read (a
     * caller that has no size to pass frees as well). */
    cachealloc_torch_free(same, 0, 5, s2);
    same = cachealloc_torch_malloc(MIB, 0, s1);
    CHECK(same == x);
    cachealloc_torch_free(same, MIB, 0, s1);
    cachealloc_torch_free(other, MIB, 0, s2);

    /* Size 0, an empty tensor: NULL, which PyTorch never frees; no failure. */
    CHECK(cachealloc_torch_malloc(0, 0, NULL) == NULL);
    CHECK(cachealloc_torch_mempool_malloc(0, 0, NULL) == NULL);
    /* NULL to free is nothing to do; a pointer of no allocation is logged, nothing else. */
    cachealloc_torch_free(NULL, 0, 0, NULL);
    int local;
    cachealloc_torch_free(&local, sizeof local, 0, NULL);

    /* The device argument, not the current device, says whose memory it is; the current
     * device stays as it was. */
    void *d1 = cachealloc_torch_malloc(MIB, 1, NULL);
    void *m1 = cachealloc_torch_mempool_malloc(MIB, 1, NULL);
    struct cudaPointerAttributes attributes;
    CHECK(d1 != NULL && cudaPointerGetAttributes(&attributes, d1) == 0 && attributes.device == 1);
    CHECK(m1 != NULL && cudaPointerGetAttributes(&attributes, m1) == 0 && attributes.device == 1);
    int current = -1;
    CHECK(cudaGetDevice(&current) == 0 && current == 0);
    cachealloc_torch_free(d1, MIB, 1, NULL);
    cachealloc_torch_free(m1, MIB, 1, NULL);

    /* A device the process does not have: NULL (no C++ runtime here to throw with), logged,
     * and no error left for the program's next check. */
    CHECK(cachealloc_torch_malloc(MIB, 7, NULL) == NULL);
    CHECK(cachealloc_torch_mempool_malloc(MIB, 7, NULL) == NULL);
    CHECK(cudaGetLastError() == 0);
    printf("ok contract\n");
}

/* The free and empty-cache hooks return nothing: a failure inside can reach the program
 * through the log only. A recorded free whose event cannot be made leaves the memory
 * allocated; pages that cannot be unmapped stay in the cache. */
static void hook_failures(void) {
    cudaStream_t side;
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == 0);
    void *r = cachealloc_torch_malloc(MIB, 0, NULL);
    CHECK(r != NULL);
    CHECK(fakecudart_launch(r, MIB, side, 1000) == 0);
    cachealloc_torch_record_stream(r, side);
    CHECK(fakecudart_inject_call_failures("cudaEventCreate", 1, cudaErrorMemoryAllocation) == 0);
    cachealloc_torch_free(r, MIB, 0, NULL);
    CHECK(cudaGetLastError() == 0);
    void *big = cachealloc_torch_malloc(64 * MIB, 0, NULL);
    CHECK(big != NULL);
    cachealloc_torch_free(big, 64 * MIB, 0, NULL);
    CHECK(fakecudart_inject_driver_failure("cuMemUnmap", 0, 1) == 0);
    cachealloc_torch_empty_cache();
    CHECK(cudaGetLastError() == 0);
    printf("ok hook failures\n");
}

/* torch.cuda.set_per_process_memory_fraction through set_memory_fraction_fn: set before the
 * device's first tensor, it limits the pool made for it; another device is not limited; 1 lifts
 * the limit; a fraction PyTorch would have refused is logged. (The fake's devices have 16 GiB.) */
static void memory_fraction(void) {
    cachealloc_torch_set_memory_fraction(0.125, 0);
    CHECK(cachealloc_torch_mempool_malloc(3 * 1024 * MIB, 0, NULL) == NULL);
    CHECK(cudaGetLastError() == 0);
    void *other = cachealloc_torch_mempool_malloc(3 * 1024 * MIB, 1, NULL);
    CHECK(other != NULL);
    cachealloc_torch_free(other, 3 * 1024 * MIB, 1, NULL);
    cachealloc_torch_set_memory_fraction(2.0, 0);
    CHECK(cachealloc_torch_mempool_malloc(3 * 1024 * MIB, 0, NULL) == NULL);
    cachealloc_torch_set_memory_fraction(1.0, 0);
    void *lifted = cachealloc_torch_mempool_malloc(3 * 1024 * MIB, 0, NULL);
    CHECK(lifted != NULL);
    cachealloc_torch_free(lifted, 3 * 1024 * MIB, 0, NULL);
    CHECK(cudaGetLastError() == 0);
    printf("ok memory fraction\n");
}

/* torch.multiprocessing in PyTorch 2.1 to 2.4 shares a CUDA tensor as getBaseAllocation's start
 * and the tensor's offset from it, the start exported with cudaIpcGetMemHandle; the other process
 * opens the handle and adds the offset. With cachealloc_torch_base_alloc (set_base_alloc_fn) the
 * start is the tensor's segment's, where the handle opens. Under expandable segments ("expandable"
 * argument) there is no handle to make: the tensor's own address comes back, logged. */
static void base_alloc(int expandable) {
    void *a = cachealloc_torch_malloc(4096, 0, NULL);
    void *b = cachealloc_torch_malloc(4096, 0, NULL);
    CHECK(a != NULL && b != NULL && a != b);
    if (expandable) {
        size_t kept = 12345;
        CHECK(cachealloc_torch_base_alloc(b, &kept) == b && kept == 12345);
        cachealloc_torch_free(a, 4096, 0, NULL);
        cachealloc_torch_free(b, 4096, 0, NULL);
        printf("ok base alloc expandable\n");
        return;
    }
    /* Two small tensors share one 2 MiB segment of the small pool. */
    void *first = (uintptr_t)a < (uintptr_t)b ? a : b;
    void *second = first == a ? b : a;
    size_t size = 0;
    void *base = cachealloc_torch_base_alloc(second, &size);
    CHECK(base == first && size == 2 * MIB);
    size = 0;
    CHECK(cachealloc_torch_base_alloc(first, &size) == first && size == 2 * MIB);
    CHECK(cachealloc_torch_base_alloc(second, NULL) == first);
    /* The handle of the start opens where the offset PyTorch sends finds the tensor. */
    cudaIpcMemHandle_t handle;
    CHECK(cudaIpcGetMemHandle(&handle, base) == 0);
    uintptr_t offset = (uintptr_t)second - (uintptr_t)base;
    CHECK(fakecudart_ipc_handle_base(&handle) + offset == (uintptr_t)second);
    /* Memory of no cachealloc segment, NULL included: itself, the size left as it was. */
    int local;
    size = 12345;
    CHECK(cachealloc_torch_base_alloc(&local, &size) == (void *)&local && size == 12345);
    CHECK(cachealloc_torch_base_alloc(NULL, &size) == NULL && size == 12345);
    cachealloc_torch_free(a, 4096, 0, NULL);
    cachealloc_torch_free(b, 4096, 0, NULL);
    CHECK(cudaGetLastError() == 0);
    printf("ok base alloc\n");
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "contract") == 0)
        contract();
    else if (argc == 2 && strcmp(argv[1], "base_alloc") == 0)
        base_alloc(0);
    else if (argc == 2 && strcmp(argv[1], "base_alloc_expandable") == 0)
        base_alloc(1);
    else if (argc == 2 && strcmp(argv[1], "hook_failures") == 0)
        hook_failures();
    else if (argc == 2 && strcmp(argv[1], "memory_fraction") == 0)
        memory_fraction();
    else if (argc == 2 && strcmp(argv[1], "failed_free") == 0)
        failed_free();
    else if (argc == 2 && strcmp(argv[1], "third_device_reset") == 0)
        third_device_reset();
    else
        run(!(argc == 2 && strcmp(argv[1], "unrecorded") == 0));
    return failures ? 1 : 0;
}
