/*
 * ipc.c — cudaIpcGetMemHandle: a handle names the whole allocation that holds the pointer, as the
 * real driver's does (a process that opens it maps the allocation from its start, so a pointer
 * inside an allocation is not where the other process lands). The handle's bytes hold a tag, the
 * process id and the allocation's start and size; fakecudart_ipc_handle_base reads the start back.
 */
#include <string.h>
#include <unistd.h>

#include "state.h"

static const char TAG[8] = "fakeipc";

struct fake_ipc_handle {
    char tag[8];
    uint64_t pid;
    uint64_t base;
    uint64_t size;
    int32_t device;
};

_Static_assert(sizeof(struct fake_ipc_handle) <= CUDA_IPC_HANDLE_SIZE, "a handle fits in 64 bytes");

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
    ENTER();
    if (handle == NULL)
        return record(cudaErrorInvalidValue);
    lock();
    /* Only cudaMalloc and cudaMallocPitch memory can be exported this way: managed and host
     * memory cannot, nor memory the driver mapped (it has handles of its own kind). */
    struct fake_alloc *a = find_alloc_locked((uintptr_t)devPtr);
    if (a == NULL || (a->kind != ALLOC_DEVICE && a->kind != ALLOC_PITCH)) {
        unlock();
        return record(cudaErrorInvalidValue);
    }
    /* Zeroed whole, padding included: two handles of one allocation are the same bytes. */
    struct fake_ipc_handle out;
    memset(&out, 0, sizeof out);
    memcpy(out.tag, TAG, sizeof TAG);
    out.pid = (uint64_t)getpid();
    out.base = a->base;
    out.size = a->size;
    out.device = a->device;
    fake.counters.ipc_handles++;
    unlock();
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &out, sizeof out);
    return cudaSuccess;
}

uintptr_t fakecudart_ipc_handle_base(const cudaIpcMemHandle_t *handle) {
    struct fake_ipc_handle in;
    if (handle == NULL)
        return 0;
    memcpy(&in, handle->reserved, sizeof in);
    if (memcmp(in.tag, TAG, sizeof TAG) != 0 || in.pid != (uint64_t)getpid())
        return 0;
    return (uintptr_t)in.base;
}
