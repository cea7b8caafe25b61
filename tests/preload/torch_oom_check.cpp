/*
 * torch_oom_check.cpp — calls cachealloc_torch_malloc from C++ as PyTorch's
 * CUDAPluggableAllocator does, inside a try block: a failed allocation must arrive as a
 * std::runtime_error (PyTorch raises it as a Python RuntimeError), never as a NULL pointer.
 * Prints "caught: <what()>" or "returned <pointer>", then whether the allocator still serves
 * an allocation afterwards, then the thread's last CUDA error: PyTorch checks it before its next
 * cudaMalloc and after each kernel launch, so a failure already thrown must not leave it set.
 * Then the same for an empty tensor, a device the process does not have and a request over
 * 1 EiB, one line each: "<what>: caught: <what()>" or "<what>: returned NULL|a pointer".
 * Last, a failure thrown while the C++ runtime has no memory for the exception's message: the
 * std::bad_alloc of std::runtime_error's constructor reaches the caller ("no memory for the
 * message: caught bad_alloc").
 */
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>

#include <cachealloc.h>
#include <cuda_runtime_api.h>

/* While set, operator new (which libstdc++'s strings use too) fails. */
static bool refuse_new = false;

void *operator new(std::size_t size) {
    void *p = refuse_new ? NULL : std::malloc(size ? size : 1);
    if (!p) {
        throw std::bad_alloc();
    }
    return p;
}

void operator delete(void *p) noexcept { std::free(p); }

void operator delete(void *p, std::size_t) noexcept { std::free(p); }

static void attempt(const char *what, size_t size, int device) {
    try {
        void *p = cachealloc_torch_malloc(size, device, NULL);
        std::printf("%s: returned %s\n", what, p ? "a pointer" : "NULL");
        cachealloc_torch_free(p, size, device, NULL);
    } catch (const std::runtime_error &e) {
        std::printf("%s: caught: %s\n", what, e.what());
    }
}

int main() {
    try {
        void *p = cachealloc_torch_malloc((size_t)1 << 40, 0, NULL);
        std::printf("returned %p\n", p);
    } catch (const std::runtime_error &e) {
        std::printf("caught: %s\n", e.what());
    }
    try {
        void *q = cachealloc_torch_malloc(1 << 20, 0, NULL);
        std::printf("then: %s\n", q ? "allocated" : "NULL");
        cachealloc_torch_free(q, 1 << 20, 0, NULL);
    } catch (const std::runtime_error &e) {
        std::printf("then: caught\n");
    }
    std::printf("last error: %d\n", (int)cudaGetLastError());
    attempt("size 0", 0, 0);
    attempt("device 7", 1 << 20, 7);
    attempt("over 1 EiB", (size_t)1 << 61, 0);
    try {
        refuse_new = true;
        void *p = cachealloc_torch_malloc((size_t)1 << 61, 0, NULL);
        refuse_new = false;
        std::printf("no memory for the message: returned %s\n", p ? "a pointer" : "NULL");
    } catch (const std::bad_alloc &) {
        refuse_new = false;
        std::printf("no memory for the message: caught bad_alloc\n");
    }
    return 0;
}
