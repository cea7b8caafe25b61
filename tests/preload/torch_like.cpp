/*
 * torch_like.cpp — a shared library standing in for PyTorch's: loaded RTLD_LOCAL by a C host
 * (as Python loads torch's extension), so libstdc++ comes in with it, local, not in the global
 * scope. It dlopens libcachealloc as CUDAPluggableAllocator does (ctypes.CDLL, RTLD_LOCAL) and
 * calls the allocation entry points inside try blocks, as PyTorch's allocator calls them.
 */
#include <dlfcn.h>
#include <cstddef>
#include <cstdio>
#include <stdexcept>

typedef void *(*malloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);

/* Writes what happened to `out`: "thrown: <what()>" or "returned <pointer>" for the global
 * allocator's entry point, then the MemPool entry point's answer, then whether an allocation
 * still works. 0 when the library and its functions were found. */
extern "C" int torch_like_run(const char *library, char *out, size_t len) {
    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 1;
    malloc_fn torch_malloc = (malloc_fn)dlsym(lib, "cachealloc_torch_malloc");
    malloc_fn mempool_malloc = (malloc_fn)dlsym(lib, "cachealloc_torch_mempool_malloc");
    free_fn torch_free = (free_fn)dlsym(lib, "cachealloc_torch_free");
    if (!torch_malloc || !mempool_malloc || !torch_free) return 2;
    const size_t huge = (size_t)1 << 40;
    int n = 0;
    try {
        void *p = torch_malloc(huge, 0, NULL);
        n = std::snprintf(out, len, "returned %p\n", p);
    } catch (const std::runtime_error &e) {
        n = std::snprintf(out, len, "thrown: %s\n", e.what());
    }
    try {
        void *p = mempool_malloc(huge, 0, NULL);
        n += std::snprintf(out + n, len - n, "mempool returned %s\n", p ? "a pointer" : "NULL");
    } catch (const std::runtime_error &e) {
        n += std::snprintf(out + n, len - n, "mempool threw\n");
    }
    void *q = torch_malloc(1 << 20, 0, NULL);
    std::snprintf(out + n, len - n, "then: %s\n", q ? "allocated" : "NULL");
    torch_free(q, 1 << 20, 0, NULL);
    return 0;
}
