"""PyTorch's memory fraction and empty_cache through cachealloc's pluggable-allocator hooks, for
scripts/gpu-check.sh row (j).

    fraction_hooks.py LIB CHUNK_BYTES FRACTION

Installs LIB as PyTorch's allocator with the README's snippet (all four hooks), calls
torch.cuda.set_per_process_memory_fraction(FRACTION, 0), allocates CHUNK_BYTES tensors on device 0
until PyTorch raises, frees them, and reads torch.cuda.mem_get_info() before and after
torch.cuda.empty_cache().

Prints "REFUSAL <first line of the exception's text>" and
"RESULT total=T chunk=C tensors=N refused=0|1 free_before=A free_after=B" as fraction_hooks.cpp
(the torch-free stand-in) does, or "NOT_RUN reason" without torch or a GPU. refused is 1 when
the last allocation raised a RuntimeError, 0 when nothing was refused within the device's total
memory.
"""

import ctypes
import sys


def not_run(reason):
    print(f"NOT_RUN {reason}")
    sys.exit(0)


def install(torch, path):
    """The README's snippet, before anything initialises CUDA."""
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        path, "cachealloc_torch_malloc", "cachealloc_torch_free"
    )
    lib, hooks = ctypes.CDLL(path), alloc.allocator()
    try:
        hooks.set_record_stream_fn(
            ctypes.cast(lib.cachealloc_torch_record_stream, ctypes.c_void_p).value
        )
        hooks.set_reset_fn(ctypes.cast(lib.cachealloc_torch_empty_cache, ctypes.c_void_p).value)
        hooks.set_memory_fraction_fn(
            ctypes.cast(lib.cachealloc_torch_set_memory_fraction, ctypes.c_void_p).value
        )
        hooks.set_base_alloc_fn(
            ctypes.cast(lib.cachealloc_torch_base_alloc, ctypes.c_void_p).value
        )
    except AttributeError as e:  # an older torch without the hook, or a library without it
        not_run(f"a hook cannot be set: {e}")
    torch.cuda.memory.change_current_allocator(alloc)


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: fraction_hooks.py LIB CHUNK_BYTES FRACTION")
    path, chunk, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    try:
        import torch
    except Exception as e:  # any import failure means: no figure from this row
        not_run(f"torch not importable ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        not_run("torch.cuda.is_available() is False")
    install(torch, path)

    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    total = torch.cuda.mem_get_info(0)[1]
    tensors, refusal, refused = [], "none", 0
    while len(tensors) < total // chunk + 2:  # a limit that is never reached stops here
        try:
            tensors.append(torch.empty(chunk, dtype=torch.uint8, device="cuda:0"))
        except RuntimeError as e:
            refusal, refused = str(e), 1
            break
    held = len(tensors)
    tensors.clear()
    torch.cuda.synchronize(0)
    before = torch.cuda.mem_get_info(0)[0]
    torch.cuda.empty_cache()
    after = torch.cuda.mem_get_info(0)[0]
    print(f"REFUSAL {refusal.splitlines()[0] if refusal else ''}")
    print(
        f"RESULT total={total} chunk={chunk} tensors={held} refused={refused}"
        f" free_before={before} free_after={after}"
    )


if __name__ == "__main__":
    main()
