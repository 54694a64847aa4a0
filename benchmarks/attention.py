"""FusedAttention forward TFLOP/s beside torch SDPA's flash (FlashAttention-2) and cuDNN backends, one run, one GPU.

Columns "mma.sync" and (on sm_90a) "wgmma" are the two mainloops forced by the plan tuning WGMMA=0/1, whichever the
plan picks by default; ``--variants`` columns are tuning overrides on top of the plan's default.

The FlashAttention-2 grid: batch * seq = 16k tokens, hidden 2048 (head dim 64 -> 32 heads, 128 -> 16), causal and
not, seq 512..16k, bf16 and fp16. Each kernel is captured 10x in a CUDA graph (no launch gaps), warmed up, and the
median of event-timed replays is reported. FLOPs: 4 * B * H * S^2 * D, halved when causal.

    python benchmarks/attention.py --out benchmarks/results/attention_h100.md [--quick] [--seqs 2048,8192]
        [--variants 64:BLOCK_N=128+Q_IN_REGISTERS=0,128:WGMMA=1+WGMMA_OVERLAP=1,...]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from trt_fusedattn.launcher import device_arch, launch, precompile
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import WGMMA_ARCHES, plan_attention

TOKENS, HIDDEN = 16384, 2048
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def time_ms(fn, reps_in_graph: int = 10, replays: int = 15) -> float:
    """Median milliseconds of one ``fn()`` call, from replays of a CUDA graph holding ``reps_in_graph`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm-up: compile, load, autotune outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(reps_in_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps_in_graph)
    return statistics.median(times)


def plan_for(shape, dtype: str, causal: bool, arch: str, tuning=None):
    """The launch plan of BSHD self-attention of ``shape`` (what ``ours`` launches)."""
    attrs = FUSED_ATTENTION.resolve({"layout": "BSHD", "causal": int(causal)})
    return plan_attention([tuple(shape)] * 3 + [None, None], [dtype] * 3 + [None, None], attrs, arch, tuning=tuning)


def timed_plans(dtypes, tunings, arch: str) -> list:
    """Every specialization the run times (``precompile`` compiles and loads them before the first timing)."""
    plans = {}
    for dtype in dtypes:
        for dim in (64, 128):
            for causal in (False, True):
                for tuning in tunings.get(dim, []):
                    p = plan_for((1, 2048, HIDDEN // dim, dim), str(dtype).removeprefix("torch."), causal, arch, tuning)
                    plans[tuple(sorted(p.defines.items()))] = p
    return list(plans.values())


def ours(q, k, v, out, causal: bool, tuning=None):
    """A closure launching our kernel on BSHD q/k/v into ``out`` (plan made once, like an engine)."""
    arch = device_arch(q.device.index or 0)
    plan = plan_for(q.shape, str(q.dtype).removeprefix("torch."), causal, arch, tuning)
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None]
    return lambda: launch(plan, arch, ptrs, [out.data_ptr()],
                          stream=torch.cuda.current_stream().cuda_stream, device=q.device.index or 0)


def sdpa(q, k, v, causal: bool, backend):
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # BSHD memory viewed as [B, H, S, D], as FA2 takes it

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return run


def versions() -> str:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    return (f"device {torch.cuda.get_device_name()}, driver {driver}, CUDA {torch.version.cuda}, torch {torch.__version__}"
            f", cuDNN {torch.backends.cudnn.version()}, python {platform.python_version()}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def ceilings() -> str:
    """The two measured ceilings of the floor (NOTES.md): bf16 matrix product and device-to-device copy."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gemm = 2 * 8192 ** 3 / time_ms(lambda: a @ b) / 1e9
    src = torch.randn(2 ** 28, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / time_ms(lambda: dst.copy_(src)) / 1e9  # bytes per ms / 1e9 = TB/s
    return f"measured ceilings: bf16 GEMM 8192^3 {gemm:.0f} TFLOP/s, device copy {copy:.2f} TB/s (read + write)"


def parse_variants(text: str) -> dict:
    """'64:BLOCK_N=128+Q_IN_REGISTERS=0,128:RESCALE_THRESHOLD=0.0f' -> {64: [{...}], 128: [{...}]}: plan tuning
    overrides to time beside the default, per head dim."""
    variants: dict = {}
    for item in filter(None, text.split(",")):
        dim, spec = item.split(":")
        variants.setdefault(int(dim), []).append(
            {k: (v if v.endswith("f") else int(v)) for k, v in (kv.split("=") for kv in spec.split("+"))})
    return variants


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--quick", action="store_true", help="bf16 only, seq 2k and 8k")
    parser.add_argument("--seqs", default="", help="comma-separated sequence lengths instead of 512..16384")
    parser.add_argument("--variants", default="", help="tuning variants to time, e.g. 64:BLOCK_N=128+NUM_WARPS=4")
    args = parser.parse_args()
    extra = parse_variants(args.variants)
    dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float16)
    seqs = tuple(int(x) for x in args.seqs.split(",")) if args.seqs else (2048, 8192) if args.quick else SEQS
    arch = device_arch(0)
    hopper = arch in WGMMA_ARCHES
    mma_sync, wgmma = {"WGMMA": 0}, {"WGMMA": 1}
    precompile(timed_plans(dtypes, {d: [mma_sync, *extra.get(d, [])] + ([wgmma] if hopper else []) for d in (64, 128)},
                           arch), arch)
    header = ["dtype", "hd", "causal", "seq", "mma.sync", "flash (FA2)", "cuDNN", "mma.sync/FA2", "mma.sync/cuDNN",
              "err vs FA2"]
    header += ["wgmma", "wgmma/FA2", "wgmma/cuDNN", "wgmma err vs FA2"] if hopper else []
    header += [f"hd{d} " + " ".join(f"{k}={v}" for k, v in t.items()) for d, ts in extra.items() for t in ts]
    rows = []
    for dtype in dtypes:
        for dim in (64, 128):
            heads = HIDDEN // dim
            for causal in (False, True):
                for seq in seqs:
                    batch = TOKENS // seq
                    q, k, v = (torch.randn(batch, seq, heads, dim, device="cuda", dtype=dtype) for _ in range(3))
                    out = torch.full_like(q, float("nan"))
                    flops = 4 * batch * heads * seq * seq * dim / (2 if causal else 1)
                    tflops = lambda ms: flops / ms / 1e9  # noqa: E731
                    t_ours = time_ms(ours(q, k, v, out, causal, mma_sync))
                    ref = sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION)().transpose(1, 2)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    t_fa2 = time_ms(sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION))
                    try:
                        t_cudnn = time_ms(sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION))
                    except RuntimeError:
                        t_cudnn = float("nan")
                    row = [str(dtype).removeprefix("torch."), dim, int(causal), seq, f"{tflops(t_ours):.0f}",
                           f"{tflops(t_fa2):.0f}", f"{tflops(t_cudnn):.0f}", f"{t_fa2 / t_ours:.2f}",
                           f"{t_cudnn / t_ours:.2f}", f"{err:.1e}"]
                    if hopper:
                        out.fill_(float("nan"))
                        t_wg = time_ms(ours(q, k, v, out, causal, wgmma))
                        err_wg = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                        row += [f"{tflops(t_wg):.0f}", f"{t_fa2 / t_wg:.2f}", f"{t_cudnn / t_wg:.2f}", f"{err_wg:.1e}"]
                    for d, ts in extra.items():
                        for t in ts:
                            row.append(f"{tflops(time_ms(ours(q, k, v, out, causal, t))):.0f}" if d == dim else "")
                    rows.append(row)
                    print(" | ".join(map(str, row)), flush=True)
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    for name in ("mma.sync", "wgmma") if hopper else ("mma.sync",):
        fa2 = [float(r[header.index(f"{name}/FA2")]) for r in rows if r[3] >= 2048]
        cudnn = [float(r[header.index(f"{name}/cuDNN")]) for r in rows if r[3] >= 2048]
        if fa2:
            table.append(f"\n{name} at seq >= 2k: >= 1.00x FA2 at {sum(x >= 1.0 for x in fa2)} of {len(fa2)} points "
                         f"(min {min(fa2):.2f}x, max {max(fa2):.2f}x); vs cuDNN {min(cudnn):.2f}-{max(cudnn):.2f}x")
    text = (f"# FusedAttention forward, TFLOP/s\n\n{versions()}\n\n{ceilings()}\n\nbatch x seq = {TOKENS} tokens, hidden {HIDDEN}, "
            f"BSHD; CUDA-graph replays, median; FLOPs 4*B*H*S^2*D (/2 causal).\n\n" + "\n".join(table) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
