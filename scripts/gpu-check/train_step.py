"""Step time of a small training loop under one allocator, for scripts/gpu-check.sh.

    train_step.py --backend torch|ctypes --allocator native|uncached|pluggable [--shim LIB] ...

Allocators:
  native     PyTorch's own caching allocator (torch backend only);
  uncached   every tensor is one cudaMalloc/cudaFree: PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1
             (set by the caller, with or without libcachealloc.so in LD_PRELOAD);
  pluggable  torch.cuda.memory.CUDAPluggableAllocator(LIB, "cachealloc_torch_malloc",
             "cachealloc_torch_free") installed with change_current_allocator.

Backends:
  torch      a few Linear layers trained with SGD on a GPU, the batch size varying per step;
  ctypes     no torch, no GPU: the same allocation pattern (weights once; per step activations
             forward, gradients backward, freed in reverse) through cudaMalloc/cudaFree of the
             process (so an LD_PRELOAD shim sees them) or through the pluggable entry points of
             LIB (cachealloc_torch_mempool_malloc, the same allocation as
             cachealloc_torch_malloc's without a C++ throw that ctypes could not catch). It exercises the plumbing against the fake runtime; its times are not GPU figures.

Prints one line: "RESULT step_ms=F peak_reserved=BYTES|none loss=F|none" or "NOT_RUN reason".
The torch backend seeds every generator and runs cuBLAS deterministically, so the last step's
loss is the same under every allocator unless one hands out memory a kernel still uses.
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

FLOAT_BYTES = 4  # float32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["torch", "ctypes"], required=True)
    p.add_argument("--allocator", choices=["native", "uncached", "pluggable"], required=True)
    p.add_argument("--shim", help="libcachealloc.so, for --allocator pluggable")
    p.add_argument("--cudart", help="libcudart.so to load, for --backend ctypes")
    p.add_argument("--steps", type=int, default=40, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--width", type=int, default=2048, help="features per Linear layer")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", default="64,256,1024,4096", help="batch sizes, cycled per step")
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.allocator == "pluggable" and not args.shim:
        p.error("--allocator pluggable needs --shim LIB")
    return args


def not_run(reason):
    print(f"NOT_RUN {reason}")
    sys.exit(0)


def timed_steps(args, step, synchronize):
    for i in range(args.warmup):
        step(args.batches[i % len(args.batches)])
    synchronize()
    times_ms = []
    for i in range(args.steps):
        start = time.perf_counter()
        step(args.batches[i % len(args.batches)])
        synchronize()
        times_ms.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times_ms)


# --- torch ------------------------------------------------------------------------------------


def run_torch(args):
    try:
        import torch
    except Exception as e:  # any import failure means: no figure from this row
        not_run(f"torch not importable ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        not_run("torch.cuda.is_available() is False")
    if args.allocator == "pluggable":
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            args.shim, "cachealloc_torch_malloc", "cachealloc_torch_free"
        )
        # The hooks the README sets: Tensor.record_stream and torch.cuda.empty_cache().
        shim = ctypes.CDLL(args.shim)
        hooks = allocator.allocator()
        hooks.set_record_stream_fn(
            ctypes.cast(shim.cachealloc_torch_record_stream, ctypes.c_void_p).value
        )
        hooks.set_reset_fn(ctypes.cast(shim.cachealloc_torch_empty_cache, ctypes.c_void_p).value)
        torch.cuda.memory.change_current_allocator(allocator)

    # The same numbers under every allocator: fixed seeds, deterministic cuBLAS.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda")
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    losses = []

    def step(batch):
        x = torch.randn(batch, args.width, device=device)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses[:] = [loss.detach()]

    step_ms = timed_steps(args, step, torch.cuda.synchronize)
    last_loss = losses[-1].item()
    peak = torch.cuda.max_memory_reserved() if args.allocator == "native" else None
    if args.allocator == "pluggable":
        side_stream_check(torch, device)
        # A failed allocation must arrive as an exception (a NULL pointer would become a tensor
        # at address 0), and the reset hook must run.
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device=device)
            raise SystemExit("pluggable allocator: a 1 PiB tensor was allocated")
        except RuntimeError as e:
            if "out of memory" not in str(e):
                raise
        torch.cuda.empty_cache()
    return step_ms, peak, last_loss


def side_stream_check(torch, device):
    """Tensor.record_stream through the hook: a tensor read on a busy side stream and freed must
    not be handed to the next tensor before that stream's work is done (its block would be
    zeroed under the read)."""
    side = torch.cuda.Stream()
    n = 1 << 20
    x = torch.ones(n, device=device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keeps the side stream busy for a while
        y = x * 2
    x.record_stream(side)
    del x
    z = torch.zeros(n, device=device)  # same size: x's block, were it reusable
    side.synchronize()
    if not bool((y == 2).all()):
        raise SystemExit("pluggable allocator: a recorded tensor's block was reused under a read")
    del y, z


# --- ctypes -----------------------------------------------------------------------------------


def run_ctypes(args):
    if args.allocator == "native":
        not_run("PyTorch's own caching allocator needs torch")
    if not args.cudart:
        not_run("--backend ctypes needs --cudart LIB")
    # RTLD_GLOBAL, then look the functions up in the global scope (dlsym(RTLD_DEFAULT)) as the
    # program's own references would: a preloaded shim comes first there. Looking them up in the
    # runtime's handle would bypass the shim.
    ctypes.CDLL(args.cudart, mode=ctypes.RTLD_GLOBAL)
    process = ctypes.CDLL(None)
    synchronize = process.cudaDeviceSynchronize

    if args.allocator == "pluggable":
        shim = ctypes.CDLL(args.shim)
        # The pluggable allocator's allocation through its entry point that never throws: a C++
        # exception thrown into ctypes (cachealloc_torch_malloc's failure, where libstdc++ is
        # loaded) would terminate the process instead of reaching this script.
        try:
            torch_malloc = shim.cachealloc_torch_mempool_malloc
            torch_free = shim.cachealloc_torch_free
        except AttributeError:
            not_run(
                f"{args.shim} exports no cachealloc_torch_mempool_malloc/cachealloc_torch_free"
            )
        torch_malloc.restype = ctypes.c_void_p
        torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        torch_free.restype = None
        torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

        def alloc(size):
            ptr = torch_malloc(size, 0, None)
            if not ptr:
                raise RuntimeError(f"cachealloc_torch_mempool_malloc({size}) returned NULL")
            return (ptr, size)

        def free(block):
            torch_free(block[0], block[1], 0, None)
    else:
        cuda_malloc, cuda_free = process.cudaMalloc, process.cudaFree
        cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        cuda_free.argtypes = [ctypes.c_void_p]

        def alloc(size):
            ptr = ctypes.c_void_p()
            rc = cuda_malloc(ctypes.byref(ptr), size)
            if rc != 0:
                raise RuntimeError(f"cudaMalloc({size}) answered {rc}")
            return (ptr.value, size)

        def free(block):
            rc = cuda_free(block[0])
            if rc != 0:
                raise RuntimeError(f"cudaFree answered {rc}")

    weight_bytes = args.width * args.width * FLOAT_BYTES
    weights = [alloc(weight_bytes) for _ in range(args.layers)]

    def step(batch):
        activation_bytes = batch * args.width * FLOAT_BYTES
        activations = [alloc(activation_bytes) for _ in range(args.layers + 1)]
        grads = []
        for _ in range(args.layers):  # backward: weight and input gradients
            grads.append(alloc(weight_bytes))
            grads.append(alloc(activation_bytes))
            free(activations.pop())
        for block in reversed(grads + activations):
            free(block)

    def sync():
        rc = synchronize()
        if rc != 0:
            raise RuntimeError(f"cudaDeviceSynchronize answered {rc}")

    step_ms = timed_steps(args, step, sync)
    for block in weights:
        free(block)
    return step_ms, None, None


def main():
    args = parse_args()
    run = run_torch if args.backend == "torch" else run_ctypes
    step_ms, peak, loss = run(args)
    print(
        f"RESULT step_ms={step_ms:.3f} peak_reserved={'none' if peak is None else peak}"
        f" loss={'none' if loss is None else repr(loss)}"
    )


if __name__ == "__main__":
    main()
