/*
 * expandable_check.c — expandable segments in the preloaded library, against the fake
 * libcudart.so.12 and the fake driver libcuda.so.1 it loads (tests/preload_expandable.rs sets
 * CACHEALLOC_CONF=expandable_segments:True, plus what each scenario needs). Each scenario prints
 * "ok SCENARIO" when every check held; a failed check prints "FAIL <file>:<line>: <condition>".
 *
 * The fake's counters show which driver calls the pool made (vmm_*), and its clock whether
 * pages were unmapped while work on them was still running (vmm_busy_unmaps).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cachealloc.h"
#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define MIB ((size_t)1 << 20)

#include "check.h"

static uint64_t counter(const char *name) { return fakecudart_counter(name); }

static void print_counters(void) {
    printf("reserves %llu maps %llu unmaps %llu creates %llu releases %llu address_frees %llu "
           "busy_unmaps %llu mallocs %llu\n",
           (unsigned long long)counter("vmm_reserves"), (unsigned long long)counter("vmm_maps"),
           (unsigned long long)counter("vmm_unmaps"), (unsigned long long)counter("vmm_creates"),
           (unsigned long long)counter("vmm_releases"),
           (unsigned long long)counter("vmm_address_frees"),
           (unsigned long long)counter("vmm_busy_unmaps"), (unsigned long long)counter("mallocs"));
}

/* Large requests grow one address range page by page (20 MiB pages), so consecutive blocks
 * are adjacent; a small request gets a range of its own (2 MiB pages); the memory is real
 * (host-writable, cudaMemcpy-able) and counted as the device's; empty_cache unmaps and
 * releases every page and gives both ranges back. No cudaMalloc reaches the runtime. */
static void scenario_grow(void) {
    char *a = NULL, *b = NULL, *s = NULL;
    CHECK_CODE(cudaMalloc((void **)&a, 30 * MIB), cudaSuccess);
    CHECK(counter("vmm_reserves") == 1);
    CHECK(counter("vmm_creates") == 2); /* 30 MiB: two 20 MiB pages */
    CHECK_CODE(cudaMalloc((void **)&b, 30 * MIB), cudaSuccess);
    CHECK(b == a + 30 * MIB);           /* the range grew behind a */
    CHECK(counter("vmm_creates") == 3); /* 10 MiB left over + one more page */
    CHECK(counter("vmm_reserves") == 1);
    CHECK_CODE(cudaMalloc((void **)&s, 4096), cudaSuccess);
    CHECK(counter("vmm_reserves") == 2); /* the small pool's range */
    CHECK(counter("vmm_creates") == 4);
    CHECK(fakecudart_device_bytes_in_use(0) == 62 * MIB);
    CHECK(counter("mallocs") == 0);
    size_t free_bytes = 0, total = 0;
    CHECK_CODE(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    CHECK(total - free_bytes == 62 * MIB);

    /* Real memory behind the pages: the host writes it, cudaMemcpy copies through it. */
    memset(a, 0x5a, 30 * MIB);
    b[30 * MIB - 1] = 7;
    unsigned char back[4096];
    CHECK_CODE(cudaMemcpy(s, a + 4 * MIB, sizeof back, cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_CODE(cudaMemcpy(back, s, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(back[0] == 0x5a && back[sizeof back - 1] == 0x5a);

    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess);
    CHECK_CODE(cudaFree(s), cudaSuccess);
    CHECK(counter("vmm_unmaps") == 0); /* cached */
    CHECK_CODE(cachealloc_empty_cache(0), 0);
    print_counters();
    CHECK(counter("vmm_unmaps") == 4);
    CHECK(counter("vmm_releases") == 4);
    CHECK(counter("vmm_address_frees") == 2);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK(counter("vmm_busy_unmaps") == 0);

    /* Device 1 maps its own memory. */
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc((void **)&a, 1 * MIB), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(1) == 2 * MIB);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK(counter("mallocs") == 0);
}

/* Pages are unmapped only after the work that may use them: with free_sync:none a freed block
 * is cached at once, so nothing else has waited for that work when empty_cache unmaps its
 * pages — work on the block's own stream (C API), and work on a non-blocking stream using a
 * block from cudaMalloc (which names no stream, and is not ordered with that stream). */
static void scenario_unmap_waits(void) {
    cudaStream_t stream = NULL, other = NULL;
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaStreamCreate(&stream), cudaSuccess);
    CHECK_CODE(cachealloc_malloc(&p, 40 * MIB, 0, stream), 0);
    CHECK_CODE(fakecudart_launch(p, 40 * MIB, stream, 1000), cudaSuccess);
    CHECK_CODE(cachealloc_free(p), 0);
    CHECK(fakecudart_range_busy(p, 40 * MIB) == 1);
    CHECK_CODE(cachealloc_empty_cache(0), 0);
    CHECK(counter("vmm_unmaps") == 2);
    CHECK(counter("vmm_busy_unmaps") == 0);

    CHECK_CODE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(cudaMalloc(&q, 40 * MIB), cudaSuccess);
    CHECK_CODE(fakecudart_launch(q, 40 * MIB, other, 1000), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK(fakecudart_range_busy(q, 40 * MIB) == 1);
    CHECK_CODE(cachealloc_empty_cache(0), 0);
    print_counters();
    CHECK(counter("vmm_unmaps") == 4);
    CHECK(counter("vmm_busy_unmaps") == 0);
    CHECK_CODE(cudaStreamDestroy(stream), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(other), cudaSuccess);
}

/* A cuMemUnmap that fails partway leaves the block as it was: the pages unmapped before the
 * failure are mapped again, with their contents, and the memory serves the next request. */
static void scenario_unmap_fails(void) {
    unsigned char *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc((void **)&p, 40 * MIB), cudaSuccess); /* two pages */
    p[0] = 11;
    p[40 * MIB - 1] = 12;
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(fakecudart_inject_driver_failure("cuMemUnmap", 1, 999), cudaSuccess);
    CHECK(cachealloc_empty_cache(0) != 0);
    CHECK(counter("vmm_unmaps") == 1);
    CHECK(fakecudart_device_bytes_in_use(0) == 40 * MIB);
    CHECK(counter("vmm_releases") == 0);
    CHECK_CODE(cudaMalloc((void **)&q, 40 * MIB), cudaSuccess);
    CHECK(q == p);
    CHECK(q[0] == 11 && q[40 * MIB - 1] == 12);
    CHECK_CODE(cudaMemset(q, 0, 40 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cachealloc_empty_cache(0), 0);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK(counter("vmm_creates") == counter("vmm_releases"));
    print_counters();
}

/* A driver call that fails while a 30 MiB request maps its two pages (`nth` counts its calls
 * from 0): the pages made for the request are given back, the program gets the driver's
 * error, and the next request maps afresh. */
static void driver_call_fails(const char *call, int nth) {
    void *p = NULL;
    CHECK_CODE(fakecudart_inject_driver_failure(call, nth, 999), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaErrorUnknown);
    CHECK(counter("vmm_creates") == 2 && counter("vmm_releases") == 2);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaMemset(p, 1, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    print_counters();
}

/* A cuMemSetAccess that fails (the first). */
static void scenario_set_access_fails(void) { driver_call_fails("cuMemSetAccess", 0); }

/* A cuMemMap that fails on the second page: the page made for it and the page mapped before
 * are given back. */
static void scenario_map_fails(void) { driver_call_fails("cuMemMap", 1); }

/* A cuMemCreate that fails on the second page with another error than out of memory: the page
 * mapped before is given back and the program gets the driver's error. */
static void scenario_create_fails(void) {
    void *p = NULL;
    CHECK_CODE(fakecudart_inject_driver_failure("cuMemCreate", 1, 999), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaErrorUnknown);
    CHECK(counter("vmm_create_failures") == 1);
    CHECK(counter("vmm_creates") == 1 && counter("vmm_releases") == 1);
    CHECK(counter("vmm_maps") == 1 && counter("vmm_unmaps") == 1);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaMemset(p, 1, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    print_counters();
}

/* A reservation the driver refuses for lack of room (2) is an out-of-memory answer: the pool
 * frees its cache and tries again, and the second try reserves. Any other error reaches the
 * program, with nothing left reserved or made. */
static void scenario_reserve_fails(void) {
    void *p = NULL;
    CHECK_CODE(fakecudart_inject_driver_failure("cuMemAddressReserve", 0, 2), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(counter("driver_errors") == 1); /* the refusal, then the retry's reservation */
    CHECK(counter("vmm_reserves") == 1);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    /* The small pool's first request needs a range of its own. */
    CHECK_CODE(fakecudart_inject_driver_failure("cuMemAddressReserve", 0, 999), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 4096), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaErrorUnknown);
    CHECK(counter("vmm_reserves") == 1 && counter("vmm_creates") == 2);
    CHECK_CODE(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK(counter("vmm_reserves") == 2);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cachealloc_empty_cache(0), 0);
    CHECK(counter("vmm_address_frees") == 2);
    CHECK(counter("vmm_creates") == counter("vmm_releases"));
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    print_counters();
}

/* A request whose pages do not all fit: the pages mapped for it are given back, the program
 * gets cudaErrorMemoryAllocation (2) and goes on. */
static void scenario_oom(void) {
    void *p = NULL, *q = NULL;
    /* FAKECUDART_CAPACITY=30MiB: 30 MiB needs two 20 MiB pages; the second does not fit. */
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK(counter("vmm_create_failures") >= 1);
    CHECK(counter("vmm_creates") == counter("vmm_releases"));
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaMalloc(&p, 15 * MIB), cudaSuccess);
    CHECK(fakecudart_device_bytes_in_use(0) == 20 * MIB);
    /* 5 MiB left in the mapped page, and no room for another. */
    CHECK_CODE(cudaMalloc(&q, 10 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaMalloc(&q, 10 * MIB), cudaSuccess); /* the cached page */
    CHECK(q == p);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    print_counters();
}

/* Mapped memory is reachable from another device only once granted: after
 * cudaDeviceEnablePeerAccess, the pages mapped before it and those mapped after it are both
 * opened to the device that asked (as cudaMalloc memory is by peer access alone), until that
 * device is reset. */
static void scenario_peer(void) {
    char *p = NULL, *q = NULL, *r = NULL;
    cudaStream_t on1 = NULL;
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc((void **)&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaStreamCreate(&on1), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, 30 * MIB, on1, 10), cudaErrorIllegalAddress);
    CHECK(counter("vmm_access_faults") == 1);
    uint64_t set_accesses = counter("vmm_set_accesses");
    CHECK_CODE(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
    /* p's two 20 MiB pages are adjacent: one grant for both. */
    CHECK(counter("vmm_set_accesses") == set_accesses + 1);
    CHECK_CODE(fakecudart_launch(p, 30 * MIB, on1, 10), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc((void **)&q, 30 * MIB), cudaSuccess); /* maps a page after the grant */
    CHECK(q == p + 30 * MIB);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(fakecudart_launch(q, 30 * MIB, on1, 10), cudaSuccess);
    CHECK(counter("vmm_access_faults") == 1);
    CHECK_CODE(cudaStreamSynchronize(on1), cudaSuccess);
    CHECK_CODE(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_CODE(cudaGetLastError(), cudaErrorPeerAccessAlreadyEnabled);
    /* A reset of device 1 ends its peer access: pages mapped after it are not opened to it. */
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK_CODE(cudaStreamCreate(&on1), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc((void **)&r, 30 * MIB), cudaSuccess); /* maps a page after the reset */
    CHECK(r == q + 30 * MIB);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(fakecudart_launch(r, 30 * MIB, on1, 10), cudaErrorIllegalAddress);
    CHECK(counter("vmm_access_faults") == 2);
    CHECK_CODE(cudaStreamDestroy(on1), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaFree(r), cudaSuccess);
    print_counters();
}

/* Pages are created usable for GPUDirect RDMA where the device reports support (as PyTorch's
 * are), and without the flag where it does not (FAKECUDART_VMM_RDMA=0). */
static void scenario_rdma(void) {
    const char *env = getenv("FAKECUDART_VMM_RDMA");
    int supported = !(env != NULL && strcmp(env, "0") == 0);
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(counter("vmm_creates") > 0);
    CHECK(counter("vmm_rdma_creates") == (supported ? counter("vmm_creates") : 0));
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

/* Peer access the library did not see enabled (the runtime's own function called directly, as
 * through another library): the interposed enable answers 704 as the runtime does, and the
 * device that asked is given access all the same (PyTorch takes 704 as success). */
static void scenario_peer_already(void) {
    void *p = NULL;
    cudaStream_t on1 = NULL;
    void *runtime = dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD);
    CHECK(runtime != NULL);
    cudaError_t (*runtime_enable)(int, unsigned) =
        (cudaError_t(*)(int, unsigned))dlsym(runtime, "cudaDeviceEnablePeerAccess");
    CHECK(runtime_enable != NULL && runtime_enable != cudaDeviceEnablePeerAccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(runtime_enable(0, 0), cudaSuccess);
    CHECK_CODE(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_CODE(cudaGetLastError(), cudaErrorPeerAccessAlreadyEnabled);
    CHECK_CODE(cudaStreamCreate(&on1), cudaSuccess);
    CHECK_CODE(fakecudart_launch(p, 30 * MIB, on1, 10), cudaSuccess);
    CHECK(counter("vmm_access_faults") == 0);
    CHECK_CODE(cudaStreamSynchronize(on1), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(on1), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    dlclose(runtime);
}

/* Memory of expandable segments has no IPC handle: even at the start of its range, the answer
 * is 1 without reaching the runtime. */
static void scenario_ipc(void) {
    void *p = NULL;
    cudaIpcMemHandle_t h;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(counter("vmm_maps") > 0 && counter("mallocs") == 0);
    CHECK_CODE(cudaIpcGetMemHandle(&h, p), cudaErrorInvalidValue);
    CHECK_CODE(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK(counter("ipc_handles") == 0);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

/* A device reset gives back every page and range the pool had, once the work on them has ended,
 * and a new pool starts after. */
static void scenario_reset(void) {
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    /* Work still running on the pages: they are unmapped only after it. */
    CHECK_CODE(fakecudart_launch(p, 30 * MIB, 0, 1000), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 4096), cudaSuccess);
    CHECK(counter("vmm_reserves") == 2);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK(counter("vmm_busy_unmaps") == 0);
    CHECK(counter("vmm_unmaps") == counter("vmm_creates"));
    CHECK(counter("vmm_releases") == counter("vmm_creates"));
    CHECK(counter("vmm_address_frees") == 2);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(counter("vmm_reserves") == 3);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    print_counters();
}

/* A reset that fails after cachealloc let go of the pool: the memory of its expandable segments
 * was released before the reset (a reset does not free it), so the allocations in them are gone
 * (the test checks the warning), and a cudaFree of one does nothing. */
static void scenario_reset_fails(void) {
    void *p = NULL, *q = NULL;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&q, 1000), cudaSuccess);
    CHECK_CODE(fakecudart_inject_call_failures("cudaDeviceReset", 1, cudaErrorUnknown),
               cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaErrorUnknown);
    CHECK_CODE(cudaGetLastError(), cudaErrorUnknown);
    CHECK(fakecudart_device_bytes_in_use(0) == 0);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    CHECK_CODE(cudaFree(q), cudaSuccess);
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

/* With a driver that has no virtual memory management (FAKECUDART_VMM=0), the pool uses fixed
 * segments (the test checks the warning). */
static void scenario_unsupported(void) {
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(counter("mallocs") == 1);
    CHECK(counter("vmm_reserves") == 0 && counter("vmm_creates") == 0);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    /* The pool made after a reset has fixed segments too (the warning is not repeated). */
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&p, 30 * MIB), cudaSuccess);
    CHECK(counter("mallocs") == 2);
    CHECK(counter("vmm_reserves") == 0);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    print_counters();
}

static const struct scenario scenarios[] = {
    {"grow", scenario_grow},
    {"unmap_waits", scenario_unmap_waits},
    {"unmap_fails", scenario_unmap_fails},
    {"set_access_fails", scenario_set_access_fails},
    {"map_fails", scenario_map_fails},
    {"create_fails", scenario_create_fails},
    {"reserve_fails", scenario_reserve_fails},
    {"oom", scenario_oom},
    {"reset", scenario_reset},
    {"reset_fails", scenario_reset_fails},
    {"peer", scenario_peer},
    {"peer_already", scenario_peer_already},
    {"ipc", scenario_ipc},
    {"rdma", scenario_rdma},
    {"unsupported", scenario_unsupported},
};

SCENARIO_MAIN(scenarios)
