/* Row (j)'s torch-free stand-in for fraction_hooks.py: the pluggable allocator's hooks called
 * as PyTorch calls them, with the same sequence and the same output.
 *
 *   fraction_hooks LIB CHUNK_BYTES FRACTION
 *
 * LIB is loaded as PyTorch's CUDAPluggableAllocator loads it (ctypes.CDLL: dlopen, RTLD_LOCAL)
 * and its entry points are found with dlsym; the runtime is the one this program is linked
 * against. cachealloc_torch_set_memory_fraction(FRACTION, 0) stands for
 * torch.cuda.set_per_process_memory_fraction; cachealloc_torch_malloc(CHUNK_BYTES, 0, NULL), one
 * tensor, is called until it throws, inside a try block as in PyTorch's C++ (the failure is a
 * C++ exception, which is why this is C++); every chunk is freed with cachealloc_torch_free,
 * and cachealloc_torch_empty_cache stands for torch.cuda.empty_cache(). The free memory is
 * cudaMemGetInfo's, as torch.cuda.mem_get_info's is.
 *
 * Prints  REFUSAL <first line of the exception's text>  and
 * RESULT total=T chunk=C tensors=N refused=0|1 free_before=A free_after=B  (A and B: free memory
 * before and after the empty-cache hook, every chunk freed), or  NOT_RUN <reason>  when LIB
 * lacks an entry point. refused is 1 when the last allocation threw; 0 when it returned NULL or
 * nothing was refused within the device's total memory. */
#include "cudart_subset.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

typedef void *(*MallocFn)(size_t size, int device, void *stream);
typedef void (*FreeFn)(void *ptr, size_t size, int device, void *stream);
typedef void (*FractionFn)(double fraction, int device);
typedef void (*ResetFn)(void);

static void *entry(void *lib, const char *name) {
    void *fn = dlsym(lib, name);
    if (fn == NULL) {
        std::printf("NOT_RUN the library exports no %s\n", name);
        std::exit(0);
    }
    return fn;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s LIB CHUNK_BYTES FRACTION\n", argv[0]);
        return 2;
    }
    size_t chunk = std::strtoull(argv[2], NULL, 10);
    double fraction = std::strtod(argv[3], NULL);
    if (chunk == 0 || !(fraction > 0.0 && fraction <= 1.0)) {
        std::fprintf(stderr, "CHUNK_BYTES must be a positive integer, FRACTION in (0, 1]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        std::printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    MallocFn torch_malloc = (MallocFn)entry(lib, "cachealloc_torch_malloc");
    FreeFn torch_free = (FreeFn)entry(lib, "cachealloc_torch_free");
    FractionFn set_fraction = (FractionFn)entry(lib, "cachealloc_torch_set_memory_fraction");
    ResetFn empty_cache = (ResetFn)entry(lib, "cachealloc_torch_empty_cache");

    set_fraction(fraction, 0);
    size_t free_bytes = 0, total = 0;
    cudaError_t rc = cudaMemGetInfo(&free_bytes, &total);
    if (rc != cudaSuccess) {
        std::printf("cudaMemGetInfo answered %d (%s)\n", rc, cudaGetErrorName(rc));
        return 1;
    }
    size_t most = total / chunk + 2; /* a limit that is never reached stops here */
    std::vector<void *> tensors;
    std::string refusal = "none";
    int refused = 0;
    while (tensors.size() < most) {
        try {
            void *p = torch_malloc(chunk, 0, NULL);
            if (p == NULL) {
                refusal = "cachealloc_torch_malloc returned NULL";
                break;
            }
            tensors.push_back(p);
        } catch (const std::exception &e) {
            refusal = e.what();
            refused = 1;
            break;
        }
    }
    size_t held = tensors.size();
    for (void *p : tensors)
        torch_free(p, chunk, 0, NULL);
    size_t before = 0, after = 0;
    rc = cudaDeviceSynchronize();
    if (rc == cudaSuccess)
        rc = cudaMemGetInfo(&before, &total);
    empty_cache();
    if (rc == cudaSuccess)
        rc = cudaMemGetInfo(&after, &total);
    if (rc != cudaSuccess) {
        std::printf("cudaMemGetInfo around the empty-cache hook answered %d (%s)\n", rc,
                    cudaGetErrorName(rc));
        return 1;
    }
    std::printf("REFUSAL %s\n", refusal.substr(0, refusal.find('\n')).c_str());
    std::printf("RESULT total=%zu chunk=%zu tensors=%zu refused=%d free_before=%zu free_after=%zu\n",
                total, chunk, held, refused, before, after);
    return 0;
}
