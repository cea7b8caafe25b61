/*
 * state.c — the global state, its lock, first-call configuration from the environment, the
 * runtime's start (which loads the fake driver), and the per-thread last error.
 *
 * Environment (read once, at the first call of any exported function):
 *   FAKECUDART_DEVICES   number of devices, 0..64 (default 2; 0 = every call answers 100)
 *   FAKECUDART_CAPACITY  bytes per device: digits with an optional suffix K/M/G/T (= KiB/MiB/GiB/
 *                        TiB, powers of 1024) or KB/MB/GB/TB (powers of 1000); default 16GiB
 *   FAKECUDART_CONTEXT   bytes of each device's capacity the context holds, as a real context
 *                        does: in the total cudaMemGetInfo reports, never free (same syntax;
 *                        default 0)
 *   FAKECUDART_FAIL      a cudaError_t code that every call answers (0 or unset = off)
 *   FAKECUDART_VMM       1 (default) or 0: whether the devices support the driver's virtual memory
 *                        management (cuMemCreate answers CUDA_ERROR_NOT_SUPPORTED with 0)
 *   FAKECUDART_VMM_RDMA  1 (default) or 0: whether cuMemCreate takes the GPUDirect RDMA flag
 *                        (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)
 *   FAKECUDART_VMM_GRANULARITY       the driver's allocation granularity, minimum and recommended:
 *                        a power of two from 4KiB to 1GiB (same syntax as the capacity; default
 *                        2MiB)
 *   FAKECUDART_VMM_RDMA_GRANULARITY  the granularity of memory made with the GPUDirect RDMA flag
 *                        (default: FAKECUDART_VMM_GRANULARITY)
 * A malformed value is reported once on stderr and every call then answers
 * cudaErrorInitializationError (3).
 *
 * The runtime's start, at the first runtime (or fakecudart_*) call, does what the real runtime's
 * does with the driver: initializes it, and loads libcuda.so.1 with dlopen, found through this
 * library's RUNPATH ($ORIGIN: the fake driver is built next to it). A missing file is not an
 * error (a runtime without a driver file). With FAKECUDART_FAIL=35, "no driver", nothing is
 * loaded. A preloaded library that looks for the driver with dlopen(RTLD_NOLOAD) after a runtime
 * call therefore finds it, as in a real process where only libcudart loaded libcuda.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"

struct fake_state fake;
__thread int fake_current_device;

static __thread cudaError_t last_error;
/* Set (under state_lock) once init() has run. */
static int initialized;
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set (under start_lock) once the runtime's start has run. The start calls dlopen, which must
 * not happen under state_lock: dlopen takes the dynamic loader's lock, and a thread holding that
 * one (running some library's constructor) may be waiting for state_lock in a CUDA call. */
static int started;
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;

void lock(void) { pthread_mutex_lock(&state_lock); }
void unlock(void) { pthread_mutex_unlock(&state_lock); }

/* fork() from a thread while another one holds the state lock (or is reading the environment or
 * loading the driver at the first call) must leave the child a usable library, as a forked
 * process's own calls then would otherwise wait forever: the forking thread takes both locks
 * first (start_lock before state_lock, the order of the first call), and both processes release
 * them after. The child also gets driver memory of its own (vmm.c). */
static void before_fork(void) {
    pthread_mutex_lock(&start_lock);
    lock();
}
static void after_fork(void) {
    unlock();
    pthread_mutex_unlock(&start_lock);
}
static void after_fork_child(void) {
    vmm_after_fork_child_locked();
    after_fork();
}

__attribute__((constructor)) static void register_fork_handlers(void) {
    pthread_atfork(before_fork, after_fork, after_fork_child);
}

cudaError_t record(cudaError_t rc) {
    if (rc != cudaSuccess && rc != cudaErrorNotReady)
        last_error = rc;
    return rc;
}

/* Parses an integer byte count with an optional unit suffix ("123", "16GiB"); 0 on success. */
static int parse_size(const char *text, uint64_t *out) {
    static const struct { const char *suffix; uint64_t unit; } units[] = {
        {"", 1}, {"B", 1},
        {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
        {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
        {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
    };
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        return -1;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(p, &end, 10);
    if (errno != 0)
        return -1;
    while (isspace((unsigned char)*end))
        end++;
    size_t len = strlen(end);
    while (len > 0 && isspace((unsigned char)end[len - 1]))
        len--;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].suffix) == len && strncmp(units[i].suffix, end, len) == 0) {
            if (n > UINT64_MAX / units[i].unit)
                return -1;
            *out = n * units[i].unit;
            return 0;
        }
    }
    return -1;
}

static int parse_int(const char *text, long min, long max, long *out) {
    errno = 0;
    char *end;
    long n = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || n < min || n > max)
        return -1;
    *out = n;
    return 0;
}

/* What a size variable takes. */
#define SIZE_SYNTAX \
    "bytes, optionally with a suffix K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB or TB"

/* What a granularity variable takes. */
#define GRANULARITY_SYNTAX "a power of two from 4KiB to 1GiB, with the suffixes of a size"

/* A granularity: a size that is a power of two from 4 KiB (the host page) to 1 GiB; 0 on
 * success. */
static int parse_granularity(const char *text, uint64_t *out) {
    uint64_t n = 0;
    if (parse_size(text, &n) != 0 || n < ((uint64_t)4 << 10) || n > ((uint64_t)1 << 30) ||
        (n & (n - 1)) != 0)
        return -1;
    *out = n;
    return 0;
}

static void config_error(const char *name, const char *value, const char *allowed) {
    fprintf(stderr, "fakecudart: %s='%s' is not valid (%s); every CUDA call now answers 3 "
                    "cudaErrorInitializationError\n", name, value, allowed);
    fake.fail_code = cudaErrorInitializationError;
}

static void init(void) {
    long devices = FAKE_DEFAULT_DEVICES;
    uint64_t capacity = FAKE_DEFAULT_CAPACITY;
    const char *v;

    if ((v = getenv("FAKECUDART_DEVICES")) != NULL && *v != '\0' &&
        parse_int(v, 0, FAKE_MAX_DEVICES, &devices) != 0) {
        config_error("FAKECUDART_DEVICES", v, "an integer from 0 to 64");
        devices = FAKE_DEFAULT_DEVICES;
    }
    if ((v = getenv("FAKECUDART_CAPACITY")) != NULL && *v != '\0' &&
        parse_size(v, &capacity) != 0) {
        config_error("FAKECUDART_CAPACITY", v, SIZE_SYNTAX);
        capacity = FAKE_DEFAULT_CAPACITY;
    }
    uint64_t context = 0;
    if ((v = getenv("FAKECUDART_CONTEXT")) != NULL && *v != '\0' && parse_size(v, &context) != 0) {
        config_error("FAKECUDART_CONTEXT", v, SIZE_SYNTAX);
        context = 0;
    }
    long vmm = 1;
    if ((v = getenv("FAKECUDART_VMM")) != NULL && *v != '\0' && parse_int(v, 0, 1, &vmm) != 0) {
        config_error("FAKECUDART_VMM", v, "0 or 1");
        vmm = 1;
    }
    long rdma = 1;
    if ((v = getenv("FAKECUDART_VMM_RDMA")) != NULL && *v != '\0' &&
        parse_int(v, 0, 1, &rdma) != 0) {
        config_error("FAKECUDART_VMM_RDMA", v, "0 or 1");
        rdma = 1;
    }
    uint64_t granularity = FAKE_DEFAULT_GRANULARITY;
    if ((v = getenv("FAKECUDART_VMM_GRANULARITY")) != NULL && *v != '\0' &&
        parse_granularity(v, &granularity) != 0) {
        config_error("FAKECUDART_VMM_GRANULARITY", v, GRANULARITY_SYNTAX);
        granularity = FAKE_DEFAULT_GRANULARITY;
    }
    uint64_t rdma_granularity = granularity;
    if ((v = getenv("FAKECUDART_VMM_RDMA_GRANULARITY")) != NULL && *v != '\0' &&
        parse_granularity(v, &rdma_granularity) != 0) {
        config_error("FAKECUDART_VMM_RDMA_GRANULARITY", v, GRANULARITY_SYNTAX);
        rdma_granularity = granularity;
    }
    long fail = 0;
    if ((v = getenv("FAKECUDART_FAIL")) != NULL && *v != '\0' &&
        parse_int(v, 0, 100000, &fail) != 0) {
        config_error("FAKECUDART_FAIL", v, "a cudaError_t code from 0 to 100000");
        fail = 0;
    }

    fake.device_count = (int)devices;
    fake.vmm_supported = (int)vmm;
    fake.vmm_rdma_supported = (int)(vmm && rdma);
    fake.vmm_granularity = (size_t)granularity;
    fake.vmm_rdma_granularity = (size_t)rdma_granularity;
    fake.vmm_fd = -1;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        fake.devices[d].capacity = capacity;
        fake.devices[d].context = context;
        fake.devices[d].legacy.device = d;
    }
    if (fake.fail_code == cudaSuccess) {
        if (fail != 0)
            fake.fail_code = (cudaError_t)fail;
        else if (devices == 0)
            fake.fail_code = cudaErrorNoDevice;
    }
}

void fake_config_once(void) {
    if (__atomic_load_n(&initialized, __ATOMIC_ACQUIRE))
        return;
    lock();
    if (!initialized) {
        init();
        __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    }
    unlock();
}

/* The runtime's start: the driver is initialized, and libcuda.so.1 loaded when it can be. The
 * handle is kept for the life of the process, as the real runtime keeps it. */
static void start_runtime(void) {
    if (fake.fail_code != cudaErrorInsufficientDriver && dlopen("libcuda.so.1", RTLD_NOW) == NULL)
        (void)dlerror(); /* no driver file: not an error of the runtime */
    __atomic_store_n(&fake.driver_initialized, 1, __ATOMIC_RELEASE);
}

void fake_init_once(void) {
    fake_config_once();
    if (__atomic_load_n(&started, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&start_lock);
    if (!started) {
        start_runtime();
        __atomic_store_n(&started, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&start_lock);
}

cudaError_t cudaGetLastError(void) {
    fake_init_once();
    lock();
    fake.counters.get_last_errors++;
    unlock();
    if (fake.fail_code != cudaSuccess)
        return fake.fail_code; /* the initialization error stays */
    cudaError_t rc = last_error;
    last_error = cudaSuccess;
    return rc;
}

cudaError_t cudaPeekAtLastError(void) {
    fake_init_once();
    lock();
    fake.counters.peek_last_errors++;
    unlock();
    if (fake.fail_code != cudaSuccess)
        return fake.fail_code;
    return last_error;
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    fake_init_once();
    if (runtimeVersion == NULL)
        return record(cudaErrorInvalidValue);
    *runtimeVersion = FAKE_RUNTIME_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *driverVersion) {
    fake_init_once();
    if (driverVersion == NULL)
        return record(cudaErrorInvalidValue);
    /* Without a driver the real runtime answers success and version 0. Otherwise the driver's
     * version, as cuDriverGetVersion answers it. */
    *driverVersion = fake.fail_code == cudaErrorInsufficientDriver ? 0 : FAKE_DRIVER_VERSION;
    return cudaSuccess;
}
