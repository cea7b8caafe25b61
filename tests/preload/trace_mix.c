/*
 * trace_mix.c — programs whose allocations are recorded with CACHEALLOC_CONF=trace:PATH
 * (tests/preload_trace.rs). Scenarios:
 *   mix      a seeded mix of cudaMalloc/cudaFree of small and large sizes, with device
 *            synchronizations, ending in an allocation the device cannot hold (run it with
 *            FAKECUDART_CAPACITY set); some allocations stay live at exit.
 *   fraction the mix, with device 0 limited to 60 % of its memory before its first allocation,
 *            to 30 % at step 1000 and unlimited at step 2000 (cachealloc_set_memory_fraction,
 *            found with dlsym: the library is preloaded, not linked); then a device reset, an
 *            allocation, a limit of 70 % and another allocation.
 *   devices  allocations on device 1, then on device 0 (FAKECUDART_DEVICES=2).
 *   small_first  a small allocation, then a large one, then both again (with
 *            expandable_segments:True, the small pool's range is reserved before the large one's).
 *   huge_first  with expandable_segments:True on a 1 GiB device: a 4 GiB request that fails
 *            (its range is reserved, nothing can be mapped), then a small and a large allocation:
 *            the large one maps its pages into the range the failed request reserved.
 *   busy_exit  four threads, two on each device (FAKECUDART_DEVICES=2), allocate and free
 *            without end while the main thread calls exit(): the exit handler finishes the
 *            recording while they run.
 *   killed   three allocations and a free, then the process kills itself (SIGKILL): it
 *            never reaches its exit.
 *   killed_first  one allocation, then the process kills itself.
 *   fork_early  before any allocation of cachealloc's, frees memory it does not hold (managed
 *            memory), then forks; the child allocates and exits, then the parent allocates:
 *            each records its own file. Prints "child PID" for the child.
 *   nocuda   no CUDA call at all.
 *   freed_pending  a 300 MiB block freed and its free completed (cached); 400 MiB allocated and
 *            freed without a synchronization (pending under free_sync:device), then 250 MiB:
 *            on a 1 GiB device the cached 300 MiB block serves it; on a 500 MiB device the 400 MiB
 *            request gave the 300 MiB segment back, and the 250 MiB one finds no free block, so
 *            the pool synchronizes before growing and serves it from the 400 MiB block.
 *   freed_on_stream  the same with the 400 MiB block recorded as used on a non-blocking stream
 *            whose work on it is still running (cachealloc_record_stream): run with
 *            free_sync:none, on a 500 MiB device its free completes at the retry of the
 *            250 MiB request, which releases its segment and takes a new one.
 *   freed_async  300 MiB allocated, 100 MiB allocated and freed (cached after a synchronization),
 *            150 MiB allocated (on a 500 MiB device, the retry gives the 100 MiB segment back);
 *            then the 300 MiB block is freed with cudaFreeAsync on a stream whose work on it is
 *            still running, and 80 MiB asked for: on a 1 GiB device the cached 100 MiB block
 *            serves it, and the free completes at the next cudaDeviceSynchronize; on a 500 MiB
 *            device no free block serves it, and the pool grows without waiting for the stream:
 *            the retry's synchronization completes the free and releases its segment.
 * Each prints "ok SCENARIO" when every check held.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "fakecudart.h"

#define MIB ((size_t)1 << 20)
#define LIVE 48

#include "check.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Half small (up to 1 MiB), half large (1 to 24 MiB). */
static size_t random_size(void) {
    if (next_random() % 2 == 0)
        return (size_t)(next_random() % MIB) + 1;
    return MIB + (size_t)(next_random() % (23 * MIB));
}

/* The mix of allocations; `at_step`, when given, is called before each step. */
static void mix(void (*at_step)(int step)) {
    void *live[LIVE] = {0};
    for (int step = 0; step < 3000; step++) {
        if (at_step != NULL)
            at_step(step);
        int slot = (int)(next_random() % LIVE);
        if (live[slot] != NULL) {
            CHECK_CODE(cudaFree(live[slot]), cudaSuccess);
            live[slot] = NULL;
        } else {
            CHECK_CODE(cudaMalloc(&live[slot], random_size()), cudaSuccess);
        }
        if (step % 97 == 0)
            CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    }
    void *huge = NULL;
    CHECK_CODE(cudaMalloc(&huge, 4096 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation); /* read once, as the runtime's */
    CHECK_CODE(cudaGetLastError(), cudaSuccess);
    for (int slot = 0; slot < LIVE; slot += 2) {
        if (live[slot] != NULL)
            CHECK_CODE(cudaFree(live[slot]), cudaSuccess);
    }
}

static void scenario_mix(void) { mix(NULL); }

/* cachealloc_set_memory_fraction as a preloaded program reaches it: by dlsym, the library not
 * linked. */
static void set_fraction(double fraction) {
    int (*set)(int, double) = (int (*)(int, double))dlsym(RTLD_DEFAULT,
                                                          "cachealloc_set_memory_fraction");
    CHECK(set != NULL);
    if (set != NULL)
        CHECK_CODE(set(0, fraction), cudaSuccess);
}

static void fraction_steps(int step) {
    if (step == 1000)
        set_fraction(0.3);
    else if (step == 2000)
        set_fraction(1.0);
}

static void scenario_fraction(void) {
    set_fraction(0.6);
    mix(fraction_steps);
    /* After a device reset the next pool starts with the fraction in force; a call then is
     * made on that pool. */
    CHECK_CODE(cudaDeviceReset(), cudaSuccess);
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, 8 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
    set_fraction(0.7);
    CHECK_CODE(cudaMalloc(&p, 8 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

static void scenario_devices(void) {
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_CODE(cudaSetDevice(1), cudaSuccess);
    CHECK_CODE(cudaMalloc(&a, 3 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&b, 1000), cudaSuccess);
    CHECK_CODE(cudaFree(a), cudaSuccess);
    CHECK_CODE(cudaSetDevice(0), cudaSuccess);
    CHECK_CODE(cudaMalloc(&c, 30 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(b), cudaSuccess); /* freed to device 1 while device 0 is current */
    CHECK_CODE(cudaFree(c), cudaSuccess);
}

static void scenario_small_first(void) {
    void *p[4] = {0};
    const size_t sizes[4] = {1000, 5000000, 1000, 5000000};
    for (int i = 0; i < 4; i++)
        CHECK_CODE(cudaMalloc(&p[i], sizes[i]), cudaSuccess);
    for (int i = 0; i < 4; i++)
        CHECK_CODE(cudaFree(p[i]), cudaSuccess);
}

static void scenario_huge_first(void) {
    void *huge = NULL, *small = NULL, *large = NULL;
    CHECK_CODE(cudaMalloc(&huge, 4096 * MIB), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_CODE(cudaMalloc(&small, 1000), cudaSuccess);
    CHECK_CODE(cudaMalloc(&large, 5 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(small), cudaSuccess);
    CHECK_CODE(cudaFree(large), cudaSuccess);
}

#define BUSY_THREADS 4
static atomic_int busy_rounds[BUSY_THREADS];
static atomic_int busy_failed;

/* Allocates and frees on device (thread % 2) until the process ends. */
static void *busy_thread(void *arg) {
    int thread = (int)(intptr_t)arg;
    if (cudaSetDevice(thread % 2) != cudaSuccess) {
        atomic_store(&busy_failed, 1);
        return NULL;
    }
    for (;;) {
        void *p = NULL;
        if (cudaMalloc(&p, 1000 + (size_t)thread * MIB) != cudaSuccess ||
            cudaFree(p) != cudaSuccess) {
            atomic_store(&busy_failed, 1);
            return NULL;
        }
        atomic_fetch_add(&busy_rounds[thread], 1);
    }
}

static void scenario_busy_exit(void) {
    pthread_t threads[BUSY_THREADS];
    for (int i = 0; i < BUSY_THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, busy_thread, (void *)(intptr_t)i) == 0);
    /* Every thread is well into its loop (and still in it) when the process exits. */
    for (int i = 0; i < BUSY_THREADS; i++) {
        while (atomic_load(&busy_rounds[i]) < 200 && !atomic_load(&busy_failed))
            ;
    }
    CHECK(!atomic_load(&busy_failed));
    printf("ok busy_exit\n");
    fflush(stdout);
    exit(0);
}

static void scenario_killed(void) {
    void *p[3] = {0};
    for (int i = 0; i < 3; i++)
        CHECK_CODE(cudaMalloc(&p[i], (size_t)(i + 1) * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p[0]), cudaSuccess);
    printf("ok killed\n");
    fflush(stdout);
    raise(SIGKILL);
}

static void scenario_killed_first(void) {
    void *p = NULL;
    CHECK_CODE(cudaMalloc(&p, MIB), cudaSuccess);
    printf("ok killed_first\n");
    fflush(stdout);
    raise(SIGKILL);
}

static void scenario_fork_early(void) {
    void *managed = NULL, *p = NULL;
    CHECK_CODE(cudaMallocManaged(&managed, MIB, cudaMemAttachGlobal), cudaSuccess);
    CHECK_CODE(cudaFree(managed), cudaSuccess);
    fflush(stdout);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        int rc = cudaMalloc(&p, MIB) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 1;
        printf("child %d\n", (int)getpid());
        exit(rc);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_CODE(cudaMalloc(&p, 2 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(p), cudaSuccess);
}

static void scenario_nocuda(void) {}

/* freed_pending and freed_on_stream: the 400 MiB block used on a stream's running work first
 * when `on_stream`. */
static void freed_later(int on_stream) {
    void *cached = NULL, *freed = NULL, *request = NULL;
    CHECK_CODE(cudaMalloc(&cached, 300 * MIB), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaFree(cached), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&freed, 400 * MIB), cudaSuccess);
    cudaStream_t s = NULL;
    if (on_stream) {
        int (*record_stream)(void *, void *) =
            (int (*)(void *, void *))dlsym(RTLD_DEFAULT, "cachealloc_record_stream");
        CHECK(record_stream != NULL);
        CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        if (record_stream != NULL)
            CHECK(record_stream(freed, s) == cudaSuccess);
        CHECK_CODE(fakecudart_launch(freed, 400 * MIB, s, 1000), cudaSuccess);
    }
    CHECK_CODE(cudaFree(freed), cudaSuccess);
    CHECK_CODE(cudaMalloc(&request, 250 * MIB), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaFree(request), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    if (on_stream)
        CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

static void scenario_freed_async(void) {
    void *used = NULL, *cached = NULL, *large = NULL, *request = NULL;
    CHECK_CODE(cudaMalloc(&used, 300 * MIB), cudaSuccess);
    CHECK_CODE(cudaMalloc(&cached, 100 * MIB), cudaSuccess);
    CHECK_CODE(cudaFree(cached), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaMalloc(&large, 150 * MIB), cudaSuccess);
    cudaStream_t s = NULL;
    CHECK_CODE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CODE(fakecudart_launch(used, 300 * MIB, s, 1000), cudaSuccess);
    CHECK_CODE(cudaFreeAsync(used, s), cudaSuccess);
    CHECK_CODE(cudaMalloc(&request, 80 * MIB), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaFree(request), cudaSuccess);
    CHECK_CODE(cudaFree(large), cudaSuccess);
    CHECK_CODE(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_CODE(cudaStreamDestroy(s), cudaSuccess);
}

static void scenario_freed_pending(void) { freed_later(0); }

static void scenario_freed_on_stream(void) { freed_later(1); }

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "";
    if (strcmp(name, "mix") == 0)
        scenario_mix();
    else if (strcmp(name, "fraction") == 0)
        scenario_fraction();
    else if (strcmp(name, "devices") == 0)
        scenario_devices();
    else if (strcmp(name, "small_first") == 0)
        scenario_small_first();
    else if (strcmp(name, "huge_first") == 0)
        scenario_huge_first();
    else if (strcmp(name, "busy_exit") == 0)
        scenario_busy_exit();
    else if (strcmp(name, "killed") == 0)
        scenario_killed();
    else if (strcmp(name, "killed_first") == 0)
        scenario_killed_first();
    else if (strcmp(name, "fork_early") == 0)
        scenario_fork_early();
    else if (strcmp(name, "nocuda") == 0)
        scenario_nocuda();
    else if (strcmp(name, "freed_pending") == 0)
        scenario_freed_pending();
    else if (strcmp(name, "freed_on_stream") == 0)
        scenario_freed_on_stream();
    else if (strcmp(name, "freed_async") == 0)
        scenario_freed_async();
    else {
        fprintf(stderr,
                "unknown scenario '%s' (mix, fraction, devices, small_first, huge_first, "
                "busy_exit, killed, fork_early, nocuda, freed_pending, freed_on_stream, "
                "freed_async)\n",
                name);
        return 2;
    }
    if (failures != 0)
        return 1;
    printf("ok %s\n", name);
    return 0;
}
