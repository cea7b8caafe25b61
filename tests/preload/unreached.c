/* A program whose CUDA calls never reach cachealloc.
 *
 * Built without a runtime (STAND_IN_DRIVER unset, no -lcudart): `unreached DRIVER` dlopens the
 * driver library DRIVER and calls its cuInit, as a program with a statically linked runtime
 * (or one using the driver API) does; `unreached` alone touches no CUDA at all.
 * Built against the fake runtime (WITH_RUNTIME): `unreached` asks the shared runtime for the
 * device count, a call cachealloc does not interpose, which loads the driver; `unreached LIB`
 * first loads the library LIB with dlopen (RTLD_LOCAL), as PyTorch's pluggable allocator does,
 * and calls none of its functions.
 * Built with STAND_IN_DRIVER (-shared): the stand-in driver, a cuInit that answers 0.
 */
#ifdef STAND_IN_DRIVER
int cuInit(unsigned flags) {
    (void)flags;
    return 0;
}
#else
#include <dlfcn.h>
#include <stdio.h>
#ifdef WITH_RUNTIME
#include <cuda_runtime_api.h>
#endif

int main(int argc, char **argv) {
#ifdef WITH_RUNTIME
    if (argc > 1 && dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        fprintf(stderr, "cudaGetDeviceCount failed\n");
        return 1;
    }
#else
    if (argc > 1) {
        void *driver = dlopen(argv[1], RTLD_NOW);
        if (driver == NULL) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(driver, "cuInit");
        if (cu_init == NULL || cu_init(0) != 0) {
            fprintf(stderr, "cuInit failed\n");
            return 1;
        }
    }
#endif
    puts("ok");
    return 0;
}
#endif
