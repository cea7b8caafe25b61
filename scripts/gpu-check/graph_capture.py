"""Row (l) of scripts/gpu-check.sh: torch.cuda.graph with libcachealloc.so preloaded under
PyTorch's own caching allocator.

    LD_PRELOAD=libcachealloc.so graph_capture.py

torch.cuda.graph synchronizes and empties PyTorch's cache before it captures, so PyTorch's
cudaFree calls reach cachealloc just before the capture (pending there under free_sync:device),
and every tensor of the capture comes from a private pool that PyTorch fills with cudaMalloc
during the capture. A pool that synchronized the device there would end the capture. After the
capture the graph is replayed on new input and compared with the same model run eagerly.

Prints "RESULT captured=1 replay_matches=0|1 max_abs_diff=F", "RESULT captured=0 error=TEXT",
or "NOT_RUN reason" (no torch, no GPU).
"""

import sys


def main():
    try:
        import torch
    except ImportError:
        print("NOT_RUN torch is not installed")
        return
    if not torch.cuda.is_available():
        print("NOT_RUN torch sees no GPU")
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    static_in = torch.randn(256, 1024, device="cuda")
    # Warm up on a side stream, as PyTorch's documentation asks before a capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = model(static_in)
    except RuntimeError as e:
        print("RESULT captured=0 error=" + " ".join(str(e).split())[:200])
        return
    static_in.copy_(torch.randn(256, 1024, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = model(static_in)
    diff = (static_out - eager).abs().max().item()
    matches = int(torch.allclose(static_out, eager, rtol=1e-4, atol=1e-4))
    print(f"RESULT captured=1 replay_matches={matches} max_abs_diff={diff:.3g}")


if __name__ == "__main__":
    sys.exit(main())
