"""Host overhead of one ``trt_fusedattn.attention`` call beside torch SDPA's, same inputs, same run (issue 10: <= 15
us per call), and a check that the call is capturable in a CUDA graph.

Overhead = host wall time of enqueuing N calls back to back (no synchronization inside the loop; the queue holds
them), divided by N, median of 7 repeats, after warm-up (compile, load, plan caches). The problem is small enough
that the GPU never holds the host back.

    python benchmarks/attention_overhead.py [--out benchmarks/results/attention_overhead_h100.md]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

import trt_fusedattn
from attention import versions  # benchmarks/attention.py (run from benchmarks/ or with it on sys.path)

# (name, q shape, k/v shape), BSHD
SHAPES = (("tiny 1x16x1x64", (1, 16, 1, 64), (1, 16, 1, 64)),
          ("ViT-L/16 32x197x16x64", (32, 197, 16, 64), (32, 197, 16, 64)),
          ("Llama-3 decode 8x1x32x128, 4k keys x 8", (8, 1, 32, 128), (8, 4096, 8, 128)))


def host_us_per_call(fn, calls: int = 200, repeats: int = 7) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def graph_replay_matches(q, k, v) -> bool:
    """Capture one API call into a CUDA graph, replay it on new inputs, compare with a direct call."""
    out = torch.empty(trt_fusedattn.attention(q, k, v).shape, device=q.device, dtype=q.dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        trt_fusedattn.attention(q, k, v, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        trt_fusedattn.attention(q, k, v, out=out)
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return bool(torch.allclose(out, trt_fusedattn.attention(q, k, v), atol=1e-3, rtol=1e-3))


def breakdown(q, k, v, out) -> str:
    """Where a repeated call's host time goes (same timing as the table): the call with out= but its launch stubbed
    (argument handling, the fast path's key and lookup, pointers, stream), the launch alone with the real driver
    (through the C launcher or ctypes, whichever the call uses, and through ctypes and cuda-python's binding beside
    it), the output allocation by three torch calls that make the same tensor, and the current-stream query."""
    import copy
    from trt_fusedattn.launcher import torch_current_stream
    from trt_fusedattn.launcher.launch import _libcuda, primary_context
    from trt_fusedattn.plugins.attention import api
    trt_fusedattn.attention(q, k, v, out=out)
    key = next(key for key in api._torch_fast if key[-1] is not None and key[1] == q.shape and key[5] == k.shape)
    entry = api._torch_fast[key]
    launch = entry[0].__self__  # the PreparedLaunch whose launch_pointers the entry holds
    pointers, stream = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()], torch_current_stream(q.device.index)
    api._torch_fast[key] = (lambda pointers, stream: None, *entry[1:])
    parts = {"call with out=, launch stubbed": host_us_per_call(lambda: trt_fusedattn.attention(q, k, v, out=out))}
    api._torch_fast[key] = entry
    parts[f"launch ({launcher()})"] = host_us_per_call(lambda: launch.launch_pointers(pointers, stream))
    lib, context = _libcuda(), int(primary_context(launch.device))
    through_ctypes = copy.copy(launch)
    through_ctypes._prepare_ctypes_launch(lib, context)
    parts["launch (ctypes)"] = host_us_per_call(lambda: through_ctypes.launch_pointers(pointers, stream))
    parts["launch (cuda-python's cuLaunchKernel)"] = cuda_python_launch_us(launch, pointers, stream)
    shape = tuple(q.shape)
    parts["torch.empty_like(q)"] = host_us_per_call(lambda: torch.empty_like(q))
    parts["torch.empty(shape, dtype, device)"] = host_us_per_call(
        lambda: torch.empty(shape, dtype=q.dtype, device=q.device))
    parts["q.new_empty(shape)"] = host_us_per_call(lambda: q.new_empty(shape))
    parts["current stream"] = host_us_per_call(lambda: torch_current_stream(q.device.index))
    return " | ".join(f"{name} {t:.1f}" for name, t in parts.items())


def cuda_python_launch_us(launch, pointers, stream) -> float:
    """The same launch through cuda-python's driver binding (its cuLaunchKernel with the parameter array's address),
    the pointer slots filled once: the binding's own cost beside the C launcher's (nan where the binding refuses)."""
    from trt_fusedattn.launcher.launch import driver
    drv = driver()
    launch._pointers[:] = pointers
    args = (launch.function, *launch.grid, *launch.block, launch.shared)
    params = ctypes.addressof(launch.params)
    try:
        drv.cuLaunchKernel(*args, stream, params, 0)
    except Exception as exc:  # (a binding version that takes the arguments otherwise)
        print(f"cuda-python's cuLaunchKernel refused the arguments: {exc}")
        return float("nan")
    return host_us_per_call(lambda: drv.cuLaunchKernel(*args, stream, params, 0))


def launcher() -> str:
    """Which path a repeated call launches through: the C launcher, or ctypes and why."""
    from trt_fusedattn.launcher import fast_launch
    reason = fast_launch.unavailable_reason()
    return "C launcher" if reason is None else f"ctypes: {reason}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--ctypes-launch", action="store_true",
                        help="launch through ctypes as where the C launcher cannot be built (to compare the two)")
    args = parser.parse_args()
    if args.ctypes_launch:
        from trt_fusedattn.launcher import fast_launch
        fast_launch.load = lambda: (None, "--ctypes-launch")
    rows, problems = [], []
    for name, q_shape, kv_shape in SHAPES:
        q = torch.randn(q_shape, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(kv_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        gqa = q_shape[2] != kv_shape[2]
        problems.append((name, q, k, v, qt, kt, vt, gqa))
        trt_fusedattn.attention(q, k, v)  # compile and load every kernel before any timing
    torch.cuda.synchronize()
    for name, q, k, v, qt, kt, vt, gqa in problems:
        out = torch.empty_like(q)
        ours_alloc = host_us_per_call(lambda: trt_fusedattn.attention(q, k, v))
        ours_out = host_us_per_call(lambda: trt_fusedattn.attention(q, k, v, out=out))
        sdpa = host_us_per_call(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa))
        rows.append(f"| {name} | {ours_alloc:.1f} | {ours_out:.1f} | {sdpa:.1f} | {graph_replay_matches(q, k, v)} |")
        print(rows[-1], flush=True)
    name, q, k, v = problems[-1][:4]
    parts = breakdown(q, k, v, torch.empty_like(q))
    text = (f"# Host overhead per call, microseconds\n\n{versions()}; launch through the {launcher()}\n\n"
            "| shape (bf16, BSHD) | trt_fusedattn.attention | ... with out= | torch SDPA (default backend) | "
            "CUDA graph capture + replay matches |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            f"{name}, parts of a call with out= alone (us): {parts}\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
